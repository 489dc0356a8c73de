"""`tianjax sweep CONFIG key=v1,v2 ... [key=value ...]`: a grid of fused runs, as few compiled
programs as the shapes allow.

    tianjax sweep configs/ppo_cartpole.yaml ppo.lr=1e-3,3e-3,1e-2 ppo.ent_coef=0,0.01 num_seeds=4

An argument whose value holds a comma (outside brackets) is a grid axis; any other is an
override applied to every point (`network.hidden=[32,32],[64,64]` is an axis of two
widths). Every point is loaded and checked as a config of its own first, so a bad value is
a ConfigError naming its key before anything is compiled.

Points that differ only in make_train's inputs (tianjax.runtime.runners.train_fn.sweepable: learning
rate, entropy and value coefficients, clip range, gamma, lambda, gradient clip) share one
program: their runs and `num_seeds` seeds each are one `jax.vmap` of train_fn, compiled
and called once. Points that differ in anything else (num_envs, network widths, epochs,
the budget) are separate groups, one program each, run one after another. Every point's
seeds are the keys `tianjax train` would use for that config (seed, num_seeds), so a point
reproduces the separate run of its config.

Written under the sweep directory (`--out`, default runs/<algo>_<env>_sweep_<time>):
- one run directory per point: config.yaml, metrics.jsonl (every log_every updates: env
  steps over all seeds, updates, the mean return of the episodes finished in that
  interval, the update metrics averaged over the interval and the seeds), summary.json,
  and a final checkpoint (`tianjax eval` / `tianjax.load` read it);
- sweep.json and sweep.md: the points ranked by final return (the mean over seeds of each
  seed's mean of its last 100 episodes), with its spread over seeds (std, min, max).
Throughput is each group's env steps (all points and seeds) over its training time, compile
time apart.

The points and seeds of a group are independent runs, so their axis is split over the local
devices (as many as divide it evenly): GPUs where there are several, and on a CPU host the
cores, which `tianjax sweep` exposes as one XLA:CPU device each (`use_cpu_cores`, before
JAX starts). One XLA:CPU device runs a vmapped group's matrix products one point after
another, so on 2 cores the second device about doubles a group's speed. A Python caller
gets what its process has: call `use_cpu_cores()` first thing to have the same.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import re
import time
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tianjax.config import Config, ConfigError, load_config, parse_override
from tianjax.metrics.logger import default_run_dir
from tianjax.runtime.runners.fused import donate_argnums
from tianjax.runtime.runners.train_fn import final_return, make_train, sweepable


class Point(NamedTuple):
    index: int
    assignments: tuple[tuple[str, str], ...]  # (key, value text) of the grid axes
    config: Config
    group: int = 0

    @property
    def name(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.assignments) or "(config)"


class PointResult(NamedTuple):
    name: str
    run_dir: str
    final_return_per_seed: list
    final_return: float  # mean over seeds (NaN where a seed finished no episode)
    std: float
    group: int


class SweepResult(NamedTuple):
    sweep_dir: str
    points: list  # [PointResult], in grid order
    groups: list  # per group: dict(points, seeds, compile_time_s, train_time_s, env_steps, env_steps_per_s)

    def ranked(self) -> list:
        return sorted(
            self.points, key=lambda p: (math.isnan(p.final_return), -np.nan_to_num(p.final_return))
        )


def split_values(text: str) -> list[str]:
    """'1e-3,3e-3' -> ['1e-3', '3e-3']; commas inside [] or {} do not split."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [v.strip() for v in out]


def parse_args(args: Sequence[str]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """(overrides for every point, grid axes [(key, [value texts])]) from key=value args."""
    overrides, axes = [], []
    for text in args:
        path, _ = parse_override(text)  # ConfigError on a missing '=' or key
        key, raw = ".".join(path), text.split("=", 1)[1]
        values = split_values(raw)
        if len(values) == 1:
            overrides.append(text)
            continue
        if any(not v for v in values):
            raise ConfigError(f"sweep axis '{key}': an empty value in {raw!r}")
        if key in (k for k, _ in axes):
            raise ConfigError(f"sweep axis '{key}': given twice")
        if key in ("num_seeds", "seed", "mode", "run_dir", "resume"):
            raise ConfigError(
                f"sweep axis '{key}': not a grid axis (num_seeds=N sets the seeds of every point)"
            )
        axes.append((key, values))
    return overrides, axes


def make_points(source, args: Sequence[str]) -> list[Point]:
    """Every grid point as a checked Config, grouped by what changes the program."""
    overrides, axes = parse_args(args)
    points = []
    for i, combo in enumerate(itertools.product(*[[(k, v) for v in vs] for k, vs in axes])):
        try:
            config = load_config(source, overrides + [f"{k}={v}" for k, v in combo])
        except ConfigError as e:
            where = " ".join(f"{k}={v}" for k, v in combo)
            raise ConfigError(f"{e} (sweep point {where})" if where else str(e)) from None
        points.append(Point(i, tuple(combo), config))
    base = points[0].config
    if base.mode != "fused":
        raise ConfigError(
            f"config key 'mode': tianjax sweep runs fused configs, got mode '{base.mode}' "
            "(sweep sync or async runs one after another with tianjax train)"
        )
    if base.stop_at_target:
        raise ConfigError(
            "config key 'stop_at_target': a sweep trains every point to its budget in one "
            "program (it reports each point's convergence time); set it false"
        )
    vmapped = {k for k, _ in axes if all(k in sweepable(p.config) for p in points)}
    groups: dict[tuple, int] = {}
    out = []
    for p in points:
        static = tuple((k, v) for k, v in p.assignments if k not in vmapped)
        out.append(p._replace(group=groups.setdefault(static, len(groups))))
    return out


def use_cpu_cores(limit: int | None = None) -> int:
    """One XLA:CPU device per core this process may run on (at most `limit`), so that a
    sweep's points run side by side. Only before JAX has started its backends (a launcher's
    first step; never at import): afterwards it changes nothing. Returns the CPU devices the
    process will have."""
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )
    want = max(1, min(cores, limit or cores))
    try:
        jax.config.update("jax_num_cpu_devices", want)
    except RuntimeError:  # the backend has started: it keeps its devices
        return len(jax.devices("cpu"))
    return want


def _split(n: int, devices: list) -> list:
    """The most devices (at most all) that split n runs evenly."""
    d = max(k for k in range(1, min(n, len(devices)) + 1) if n % k == 0)
    return devices[:d]


def _seed_keys(config: Config) -> list:
    # the keys the fused runner gives each seed of this config
    return list(jax.random.split(jax.random.key(config.seed), config.num_seeds))


def _run_group(points: list[Point]) -> tuple[object, dict]:
    """One program for the group: vmap of train_fn over points x seeds. Returns (the stacked
    FusedRun [P * S, ...], timings)."""
    base = points[0].config
    S = base.num_seeds
    init, train_fn = make_train(base)
    keys = sweepable(base)
    one_init = jax.jit(init)
    # NOTE: one init per seed, stacked on the host (a vmapped init was seen to hang inside
    # XLA:CPU; see the fused runner), then repeated for every point
    seeds = [one_init(k) for k in _seed_keys(base)]
    states = jax.tree.map(lambda *xs: jnp.stack(xs * len(points)), *seeds)
    hparams = {
        k: jnp.asarray(np.repeat([float(_value(p.config, k)) for p in points], S), jnp.float32)
        for k in keys
    }
    # the runs' axis split over the devices: each runs its share of the vmap, nothing shared
    devices = _split(len(points) * S, jax.local_devices())
    shard = NamedSharding(Mesh(np.array(devices), ("runs",)), PartitionSpec("runs"))
    states, hparams = jax.device_put((states, hparams), shard)
    t0 = time.perf_counter()
    program = (
        jax.jit(
            jax.vmap(train_fn),
            in_shardings=shard,
            out_shardings=shard,
            donate_argnums=donate_argnums(states),
        )
        .lower(states, hparams)
        .compile()
    )
    t1 = time.perf_counter()
    run = jax.block_until_ready(program(states, hparams))
    t2 = time.perf_counter()
    steps = len(points) * S * int(np.asarray(run.state.env_steps).reshape(-1)[0])
    return run, dict(
        points=len(points),
        seeds=S,
        devices=len(devices),
        compile_time_s=t1 - t0,
        train_time_s=t2 - t1,
        env_steps=steps,
        env_steps_per_s=steps / max(t2 - t1, 1e-9),
    )


def _value(config: Config, key: str):
    section, name = key.split(".")
    return getattr(getattr(config, section), name)


def _records(config: Config, metrics: dict) -> list[dict]:
    """metrics.jsonl records of one point from its [S, U] metric arrays, every log_every updates."""
    S = config.num_seeds
    U = next(iter(metrics.values())).shape[1]
    per = config.num_envs * config.rollout_len
    ends = list(range(config.log_interval, U + 1, config.log_interval))
    if not ends or ends[-1] != U:
        ends.append(U)
    out, start = [], 0
    for end in ends:
        sl = {k: v[:, start:end] for k, v in metrics.items()}
        n = int(sl["episodes"].sum())
        rec = dict(
            env_steps=end * per * S,
            updates=end,
            episodes=n,
            return_mean=float(sl["episode_return_sum"].sum() / n) if n else None,
        )
        for k, v in sl.items():
            if k not in ("episodes", "episode_return_sum", "version"):
                rec[k] = float(np.mean(v))
        out.append(rec)
        start = end
    return out


def _name(point: Point) -> str:
    text = "_".join(f"{k}={v}" for k, v in point.assignments) or "config"
    return f"p{point.index:02d}_" + re.sub(r"[^A-Za-z0-9=._,+-]", "", text)[:120]


def _write_point(point: Point, run, group_info: dict, run_dir: str) -> PointResult:
    from tianjax.checkpoint import store as ckpt
    from tianjax.metrics import RunLogger

    config = dataclasses.replace(point.config, run_dir=run_dir)
    S = config.num_seeds
    metrics = {k: np.asarray(v) for k, v in run.metrics.items()}
    finals = final_return(run)  # [S]
    per_seed = [None if math.isnan(f) else float(f) for f in finals]
    valid = [f for f in per_seed if f is not None]
    mean = float(np.mean(valid)) if len(valid) == S else float("nan")
    std = float(np.std(valid)) if len(valid) == S else float("nan")
    logger = RunLogger(config, run_dir=run_dir, tensorboard=False)
    try:
        for rec in _records(config, metrics):
            logger.log(rec)
        state = run.state if S > 1 else jax.tree.map(lambda x: x[0], run.state)
        updates = int(np.asarray(run.state.learner.version).max())
        env_steps = int(np.asarray(run.state.env_steps).reshape(-1)[0]) * S
        saver = ckpt.Checkpointer(run_dir, keep=1)
        try:
            saver.save(
                updates,
                state,
                dict(
                    ckpt.run_meta(config),
                    iterations=updates,
                    env_steps=env_steps // S,
                    updates=updates,
                ),
            )
        finally:
            saver.close()
        target = config.target_return
        summary = {
            "mode": "fused",
            "algo": config.algo,
            "env": config.env,
            "env_backend": config.env_backend,
            "seed": config.seed,
            "num_seeds": S,
            "env_steps": env_steps,
            "updates": updates,
            "final_return": mean,
            "final_return_std": std,
            "final_return_per_seed": per_seed,
            "target_return": target,
            "seeds_at_target": None
            if target is None
            else sum(f is not None and f >= target for f in per_seed),
            "sweep_point": dict(point.assignments),
            "sweep_group": point.group,
            "compile_time_s": group_info["compile_time_s"],
            "train_time_s": group_info["train_time_s"],
            "env_steps_per_s": group_info[
                "env_steps_per_s"
            ],  # the group's (all its points and seeds)
            "skipped_updates": int(np.asarray(run.state.learner.skipped_updates).sum()),
            "run_dir": run_dir,
        }
        logger.write_summary(summary)
    finally:
        logger.close()
    return PointResult(point.name, run_dir, per_seed, mean, std, point.group)


def table(result: SweepResult) -> str:
    """The points ranked by final return, as a markdown table."""
    lines = [
        "| rank | point | final return | std over seeds | min | max | group | run |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for rank, p in enumerate(result.ranked(), 1):
        seeds = [f for f in p.final_return_per_seed if f is not None]
        lo = f"{min(seeds):.1f}" if seeds else "-"
        hi = f"{max(seeds):.1f}" if seeds else "-"
        lines.append(
            f"| {rank} | {p.name} | {p.final_return:.1f} | {p.std:.1f} | {lo} | {hi} | {p.group} | "
            f"{os.path.basename(p.run_dir)} |"
        )
    return "\n".join(lines)


def run_sweep(
    source, args: Sequence[str] = (), *, out: str | None = None, verbose: bool = True
) -> SweepResult:
    """Runs the grid (see the module docstring); returns the points' results and groups' timings."""
    from tianjax.runtime.process import compile_cache

    points = make_points(source, args)
    base = points[0].config
    compile_cache.enable(base.compile_cache)
    sweep_dir = os.path.abspath(out or default_run_dir(base, kind="sweep"))
    os.makedirs(sweep_dir, exist_ok=True)
    n_groups = max(p.group for p in points) + 1
    say = print if verbose else (lambda *a, **k: None)
    say(
        f"sweep: {len(points)} points x {base.num_seeds} seeds in {n_groups} program(s) -> {sweep_dir}",
        flush=True,
    )
    results, groups = [None] * len(points), []
    for g in range(n_groups):
        members = [p for p in points if p.group == g]
        label = (
            " ".join(
                f"{k}={v}"
                for k, v in members[0].assignments
                if all(q.assignments and dict(q.assignments)[k] == v for q in members)
            )
            or "all"
        )
        say(
            f"group {g + 1}/{n_groups} ({label}): {len(members)} points x {base.num_seeds} seeds, one program; "
            "compiling and training...",
            flush=True,
        )
        run, info = _run_group(members)
        groups.append(dict(info, group=g, label=label))
        S = members[0].config.num_seeds
        for j, p in enumerate(members):
            part = jax.tree.map(lambda x: x[j * S : (j + 1) * S], run)
            results[p.index] = _write_point(p, part, info, os.path.join(sweep_dir, _name(p)))
        on = f" on {info['devices']} devices" if info["devices"] > 1 else ""
        say(
            f"  compiled in {info['compile_time_s']:.1f} s, trained {info['env_steps']:,} env steps{on} in "
            f"{info['train_time_s']:.1f} s ({info['env_steps_per_s']:,.0f} env steps/s, all points and seeds)",
            flush=True,
        )
    result = SweepResult(sweep_dir, results, groups)
    doc = {"points": [p._asdict() for p in result.ranked()], "groups": groups}
    with open(os.path.join(sweep_dir, "sweep.json"), "w") as f:
        json.dump(doc, f, indent=1, default=lambda x: None)
    md = table(result)
    with open(os.path.join(sweep_dir, "sweep.md"), "w") as f:
        f.write(
            f"# sweep of {base.algo} on {base.env}, {base.num_seeds} seed(s) per point\n\n"
            "final return: mean over seeds of each seed's mean return of its last 100 episodes\n\n"
            + md
            + "\n"
        )
    say("\n" + md, flush=True)
    return result


__all__ = [
    "Point",
    "PointResult",
    "SweepResult",
    "make_points",
    "parse_args",
    "run_sweep",
    "split_values",
    "table",
    "use_cpu_cores",
]
