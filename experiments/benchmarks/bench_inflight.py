"""In-flight parameters: async actors that take a newer version only between rollouts
(`runtime.param_refresh=rollout`) against actors that also take one between two vector
steps (`step`), on the latency-bound CartPole, alternating, same seeds.

    python experiments/benchmarks/bench_inflight.py [--pairs 2 | --seeds 0 1 2] [--actors 8]
        [--steps 250000] [--out runs.jsonl] [key=value ...]
    python experiments/benchmarks/bench_inflight.py --table runs.jsonl   # the stored runs
    python experiments/benchmarks/bench_inflight.py --cost [--rollouts 200]
        # what the look costs a fast env: envpool CartPole rollouts with and without it

configs/ppo_latency_async.yaml with N actor processes, each pair one seed, its two runs
back to back (the order flips each pair, so that a drift of the shared machine does not
favour one arm). Each run spends its whole budget (no stop at the target), so the final
return says whether learning holds after 475. Per run:

- fresh/s: samples learned from for the first time per second of training, from the end
  of the first update to the end (start-up and compilation excluded);
- tau: mean staleness (updates) of the learned samples, per step (summary.json's
  staleness_mean); tau max, and the share of trajectories holding several versions;
- to 475: seconds from the launch and env steps until the 100-episode mean reached 475;
- final: the 100-episode mean return at the end.

Then the ratios step/rollout per pair and of the medians. The question (issue 33): at equal
fresh samples/s, is mean tau 30% or more lower, and the return equal or better?

`--cost`: the latency CartPole's actors sleep most of the time, so the look at the parameter
channel before each vector step costs them nothing measurable. On a fast env it might: one
actor's source (configs/ppo_cartpole_async.yaml, envpool CartPole, 16 envs x 32 steps)
steps rollouts with no look, and with the actor's look at an idle, connected parameter
channel (`ParamSubscriber.latest(0)`, what `runtime.param_refresh: step` does when nothing
new came), alternating, in one process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

# experiments/, for the shared _runs helper
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _runs import fmt, median, ratio, records_of, run  # noqa: E402

CONFIG = "configs/ppo_latency_async.yaml"
ARMS = ("rollout", "step")


def measure(refresh: str, n: int, seed: int, steps: int, extra: list[str]) -> dict:
    overrides = [
        f"num_actors={n}",
        f"seed={seed}",
        f"total_env_steps={steps}",
        f"runtime.param_refresh={refresh}",
        "stop_at_target=false",
        "log_every=1",
        "checkpoint.final=false",
        *extra,
    ]
    with tempfile.TemporaryDirectory() as d:
        s = run(CONFIG, overrides, keep_dir=os.path.join(d, "run"))
    records = [r for r in records_of(s.pop("metrics")) if r.get("updates")]
    first, last = records[0], records[-1]
    span = last["wall_time_s"] - first["wall_time_s"]
    received = s["trajectories_received"]
    return {
        "refresh": refresh,
        "seed": seed,
        "actors": n,
        "fresh": (last["samples_fresh"] - first["samples_fresh"]) / span if span > 0 else None,
        "tau": s["staleness_mean"],
        "tau_max": s["staleness_max"],
        "mixed": s["trajectories_mixed_versions"] / received if received else None,
        "conv_s": s["convergence_time_s"],
        "conv_steps": s["convergence_env_steps"],
        "final": s["final_return"],
        "env_steps": s["env_steps"],
        "budget": steps,
        "bad_versions": s["dropped_bad_versions"],
    }


def row(r: dict) -> str:
    mixed = None if r["mixed"] is None else 100 * r["mixed"]
    return (
        f"{r['refresh']:<8}{r['seed']:>5}{fmt(r['fresh']):>9}{fmt(r['tau'], '.2f'):>7}"
        f"{fmt(r['tau_max']):>5}{fmt(mixed, '.0f'):>7}%{fmt(r['conv_s'], '.1f'):>9}"
        f"{fmt(r['conv_steps']):>10}{fmt(r['final'], '.1f'):>8}"
    )


HEADER = (
    f"{'refresh':<8}{'seed':>5}{'fresh/s':>9}{'tau':>7}{'max':>5}{'mixed':>8}"
    f"{'to 475 s':>9}{'475 steps':>10}{'final':>8}"
)


def ratios(on: dict, off: dict) -> str:
    return (
        f"fresh/s {fmt(ratio(on['fresh'], off['fresh']), '.2f')}, "
        f"tau {fmt(ratio(on['tau'], off['tau']), '.2f')}, "
        f"time to 475 {fmt(ratio(on['conv_s'], off['conv_s']), '.2f')}, "
        f"steps to 475 {fmt(ratio(on['conv_steps'], off['conv_steps']), '.2f')}, "
        f"final return {fmt(ratio(on['final'], off['final']), '.3f')}"
    )


def cost(rollouts: int, repeats: int = 5) -> None:
    """Env steps/s of one actor's envpool CartPole source without and with the idle look."""
    import jax
    import numpy as np

    from tianjax.config import load_config
    from tianjax.core import ParamsMessage
    from tianjax.runtime import make_source
    from tianjax.transport import ParamPublisher, ParamSubscriber, new_run_key

    config = load_config("configs/ppo_cartpole_async.yaml")
    source = make_source(config, seed=0)
    params = source.algo.init(jax.random.key(0)).params
    key = new_run_key()
    pub = ParamPublisher(key)
    sub = ParamSubscriber(key, pub.endpoint, ParamsMessage(params, np.zeros((), np.int64)))
    # the actor's look (Actor._refresh_in_flight) starts with this call; with nothing new
    # it is all the look does
    arms = {"no look": None, "look each step": lambda: sub.latest(0)}
    source(params, 0, 0)  # compiled, envs warm
    rates: dict[str, list[float]] = {name: [] for name in arms}
    try:
        for _ in range(repeats):
            for name, refresh in arms.items():
                t = time.perf_counter()
                for _ in range(rollouts):
                    source(params, 0, 0, refresh) if refresh else source(params, 0, 0)
                rates[name].append(rollouts * source.steps_per_call / (time.perf_counter() - t))
    finally:
        sub.close()
        pub.close()
        source.close()
    base = statistics.median(rates["no look"])
    print(
        f"envpool CartPole-v1, {config.num_envs} envs x {config.rollout_len} steps, medians of {repeats}"
    )
    for name, r in rates.items():
        m = statistics.median(r)
        print(f"{name:<16}{m:>12,.0f} env steps/s{m / base:>7.3f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=2, help="seeds 0..pairs-1, one pair each")
    ap.add_argument("--seeds", type=int, nargs="*", default=None, help="these seeds instead")
    ap.add_argument("--table", nargs="*", default=None, help="print the runs kept in these files")
    ap.add_argument("--actors", type=int, default=8)
    ap.add_argument("--steps", type=int, default=250_000, help="total_env_steps of each run")
    ap.add_argument("--out", default=None, help="append each run to this JSON-lines file")
    ap.add_argument("--cost", action="store_true", help="the look's cost on a fast env")
    ap.add_argument("--rollouts", type=int, default=200, help="--cost: rollouts per arm and repeat")
    ap.add_argument("overrides", nargs="*", help="more key=value overrides for every run")
    args = ap.parse_args()
    if args.cost:
        return cost(args.rollouts)
    if args.table:
        runs = [json.loads(line) for path in args.table for line in open(path) if line.strip()]
        print(HEADER)
        for r in runs:
            print(row(r))
        budget = max(r.get("budget", r["env_steps"]) for r in runs)
        return report(runs, runs[0]["actors"], budget)
    runs: list[dict] = []
    print(HEADER, flush=True)
    for seed in args.seeds if args.seeds is not None else range(args.pairs):
        order = ARMS if seed % 2 == 0 else ARMS[::-1]
        pair = {}
        for refresh in order:
            r = measure(refresh, args.actors, seed, args.steps, args.overrides)
            pair[refresh] = r
            runs.append(r)
            print(row(r), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(r) + "\n")
        print(f"  seed {seed}, step/rollout: {ratios(pair['step'], pair['rollout'])}", flush=True)
    report(runs, args.actors, args.steps)


def report(runs: list[dict], actors: int, steps: int) -> None:
    """The medians of each arm and their ratios."""
    med = {}
    for arm in ARMS:
        mine = [r for r in runs if r["refresh"] == arm]
        med[arm] = {k: median([r[k] for r in mine]) for k in mine[0] if k != "refresh"}
        med[arm].update(refresh=arm, seed="all")
        reached = sum(r["conv_s"] is not None for r in mine)
        print(f"{row(med[arm])}  (medians; reached 475 in {reached}/{len(mine)})")
    print(
        f"PPO, tianjax/LatencyCartPole-v1, {actors} actors, {steps:,} env steps, "
        f"{len(runs) // 2} pairs; medians, step/rollout: {ratios(med['step'], med['rollout'])}"
    )


if __name__ == "__main__":
    main()
