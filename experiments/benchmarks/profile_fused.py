"""Where a fused PPO iteration's time goes, op by op: tianjax's core against the reference.

    python experiments/benchmarks/profile_fused.py [--envs 4 64] [--iterations 20]

Each program (the core: `tianjax.core.fused_loop.make_fused`'s run; the reference:
minimal_ppo.py beside this file, PureJaxRL's structure) is compiled for `--iterations` iterations
of gymnax CartPole-v1 PPO (N envs x 128 steps, 4 epochs x 4 minibatches, 2x64 tanh) and run
once under `jax.profiler`. Every XLA:CPU op (thunk) the run executed is summed by what it
computes, read from the JAX name of the op (both programs name their parts with
`jax.named_scope`):

    rollout      the rollout scan: env steps, the policy, sampling
    advantages   GAE and what the batch needs before the epochs
    shuffle      the minibatch permutation and the gather of the shuffled batch
    loss fwd     the loss's forward pass, split into matrix products and the rest
    loss bwd     its backward pass (the transposed ops), likewise
    optimizer    gradient clipping, Adam and the parameter update
    other        loop bookkeeping, carries' copies, records, the non-finite guard

Also printed: the run's wall time without the profiler (median of 3) and with it. The
profiler adds a microsecond or two of bookkeeping to every op, which a program of many
small ops (4 envs) feels most: read the shares and the gap between the two programs, not
the profiled seconds.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import statistics
import sys
import tempfile
import time

import jax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from minimal_ppo import make_train  # noqa: E402

import tianjax  # noqa: E402
from tianjax.algos import make_algorithm  # noqa: E402
from tianjax.core import make_fused  # noqa: E402
from tianjax.envs import make_gymnax  # noqa: E402

PARTS = (
    "rollout",
    "advantages",
    "shuffle",
    "loss fwd: products",
    "loss fwd: rest",
    "loss bwd: products",
    "loss bwd: rest",
    "optimizer",
    "other",
)
_OP = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = .*?\b([a-z][\w\-]*)\((.*)$")
_NAME = re.compile(r'op_name="([^"]*)"')


def programs(num_envs: int, iterations: int) -> dict:
    total = iterations * num_envs * 128
    cfg = tianjax.load_config("ppo_cartpole", [f"num_envs={num_envs}", f"total_env_steps={total}"])
    env = make_gymnax(cfg.env)
    algo = make_algorithm(cfg, env.obs_shape, env.action_spec, correct_staleness=False)
    init, run = make_fused(cfg, env, algo)
    train, _ = make_train(num_envs=num_envs, total_steps=total)
    return {
        "tianjax core": lambda key: run(init(key), iterations)[0].learner.params,
        "reference": lambda key: train(key)[0],
    }


def part_of(opcode: str, op_name: str) -> str:
    """The part of the iteration an op belongs to, by its JAX name (innermost scope wins)."""
    scopes = op_name.split("/")
    for scope in reversed(scopes):
        if scope in ("rollout", "advantages", "shuffle", "optimizer"):
            return scope
        if scope == "loss":
            side = "bwd" if "transpose(" in op_name else "fwd"
            product = opcode == "dot" or "dot_general" in scopes[-1]
            return f"loss {side}: {'products' if product else 'rest'}"
    return "other"


def op_parts(hlo_text: str) -> dict[str, str]:
    """HLO instruction name -> part, for the ops of the optimized program."""
    parts = {}
    for line in hlo_text.splitlines():
        m = _OP.match(line)
        if not m:
            continue
        name, opcode, rest = m.groups()
        n = _NAME.search(rest)
        parts[name] = part_of(opcode, n.group(1) if n else "")
    return parts


def profile(fn, key) -> tuple[dict[str, float], float, float]:
    """(seconds per part, wall s without the profiler (median of 3), wall s with it)."""
    compiled = jax.jit(fn).lower(key).compile()
    parts = op_parts(compiled.as_text())
    jax.block_until_ready(compiled(key))
    plain = []
    for _ in range(3):
        t = time.perf_counter()
        jax.block_until_ready(compiled(key))
        plain.append(time.perf_counter() - t)
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d, create_perfetto_trace=True):
            t = time.perf_counter()
            jax.block_until_ready(compiled(key))
            traced = time.perf_counter() - t
        path = glob.glob(os.path.join(d, "**", "*.trace.json.gz"), recursive=True)[0]
        events = json.load(gzip.open(path))
    events = events["traceEvents"] if isinstance(events, dict) else events
    seconds = collections.Counter()
    for e in events:
        # complete events of the program's own ops; a loop (while) is the sum of its body's
        # ops, which are counted themselves
        if e.get("ph") == "X" and e.get("name") in parts and not e["name"].startswith("while"):
            seconds[parts[e["name"]]] += e.get("dur", 0) / 1e6
    return dict(seconds), statistics.median(plain), traced


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--envs", type=int, nargs="+", default=[4, 64])
    ap.add_argument("--iterations", type=int, default=20)
    args = ap.parse_args()
    for num_envs in args.envs:
        rows = {
            name: profile(fn, jax.random.key(0))
            for name, fn in programs(num_envs, args.iterations).items()
        }
        print(
            f"\nfused PPO, gymnax CartPole-v1, {num_envs} envs x 128 steps, {args.iterations} iterations, "
            f"{jax.devices()[0].platform}: ms per iteration in each part (profiled ops)"
        )
        names = list(rows)
        print(f"{'part':<22}" + "".join(f"{n:>16}" for n in names) + f"{'core / ref':>12}")
        for part in PARTS:
            ms = [rows[n][0].get(part, 0.0) / args.iterations * 1e3 for n in names]
            ratio = f"{ms[0] / ms[1]:.2f}" if ms[1] > 0 else "-"
            print(f"{part:<22}" + "".join(f"{x:>16.3f}" for x in ms) + f"{ratio:>12}")
        total = [sum(rows[n][0].values()) / args.iterations * 1e3 for n in names]
        print(
            f"{'all ops':<22}"
            + "".join(f"{x:>16.3f}" for x in total)
            + f"{total[0] / total[1]:>12.2f}"
        )
        for label, i in (("wall, profiled", 2), ("wall, not profiled", 1)):
            ms = [rows[n][i] / args.iterations * 1e3 for n in names]
            print(f"{label:<22}" + "".join(f"{x:>16.3f}" for x in ms) + f"{ms[0] / ms[1]:>12.2f}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
