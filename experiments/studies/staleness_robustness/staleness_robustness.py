"""Staleness robustness: the final return of each loss with actors forced K updates behind,
as a fraction of the same loss's return at K = 0 with the same seeds.

    python experiments/studies/staleness_robustness/staleness_robustness.py run \\
        [--envs breakout ...] [--losses textbook ...] [--lags 0 4 16 64] [--seeds 3]
    python experiments/studies/staleness_robustness/staleness_robustness.py table [--plot]
        [--of behaviour|learner] [--out RUNS_FILE]

Fused mode with `staleness.forced_lag`: the rollout of the update at learner version V acts
with the parameters of version max(V - K, 0) from a ring in the loop's state, so every
sample is exactly K updates old from update K on (tianjax.core.lag). For one env and one
loss, every (K, seed) of the grid is one program: `tianjax.make_train` vmapped over the
lag and the seed (one compile, the runs side by side). Each run's line goes to
results/runs.jsonl as it finishes (a group already there is skipped: the grid resumes).

What it counts. Final return: the mean return of the episodes that finished in the last
tenth of the run's updates (training episodes, sampled actions, of the behaviour policy,
which under a lag is the policy of K updates before the end). Fraction: mean over seeds
of a loss's final return at K, over its mean at K = 0 (the same seeds); for a return that
can be negative (Acrobot, Pendulum) the fraction is taken of the improvement over a random
policy's return, (R_K - R_random) / (R_0 - R_random), so that 1 is "as good as K = 0" and
0 "no better than random". Env steps are policy decisions, equal for every K (the same
budget); the lag changes what is learned from, not how much. Learner return: the mean
return of 128 episodes (sampled actions, one per env to its end) of the run's final
learner parameters, the policy it learned rather than the one it acted with (`table --of
learner`; results/learner_runs.jsonl holds the runs that have it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
RUNS = os.path.join(RESULTS, "runs.jsonl")

# env name -> (config, overrides). Each is sized so that a
# run has about 1,000 updates (a lag of 64 is a small part of it) within this machine's
# compute: smaller batches than the shipped configs, the same algorithm settings otherwise.
ENVS = {
    "breakout": (
        "configs/ppo_breakout_minatar.yaml",
        [
            "num_envs=32",
            "rollout_len=32",
            "ppo.num_minibatches=4",
            "ppo.lr=2.5e-3",
            "network.hidden=[64,64]",
            "total_env_steps=524288",
        ],
    ),
    "spaceinvaders": (
        "configs/ppo_spaceinvaders_minatar.yaml",
        [
            "num_envs=32",
            "rollout_len=32",
            "ppo.num_minibatches=4",
            "ppo.lr=2.5e-3",
            "network.hidden=[64,64]",
            "total_env_steps=524288",
        ],
    ),
    "acrobot": (
        "configs/ppo_cartpole.yaml",
        ["env=Acrobot-v1", "target_return=-100", "total_env_steps=500000"],
    ),
    "pendulum": (
        "configs/ppo_pendulum.yaml",
        [
            "num_envs=8",
            "rollout_len=64",
            "ppo.num_minibatches=4",
            "total_env_steps=500000",
        ],
    ),
    "cartpole": ("configs/ppo_cartpole.yaml", ["total_env_steps=500000"]),
}
# loss name -> overrides. tianjax's default is the async configs' correction.
LOSSES = {
    "textbook": ["staleness.correct=false"],
    "decoupled": [
        "ppo.correction=decoupled",
        "staleness.schedule=constant",
        "ppo.behaviour_clip=false",
    ],
    "tianjax": [
        "ppo.correction=decoupled",
        "staleness.schedule=polynomial",
        "staleness.power=0.5",
        "ppo.behaviour_clip=true",
    ],
    # tianjax with the derived divergence weight applied as derived: a batch whose versions
    # moved far from pi_0 takes a smaller step (staleness.scale_lr: the batch's mean weight
    # on the learning rate; as an unnormalised loss weight Adam would divide it out)
    "tianjax-div": [
        "ppo.correction=decoupled",
        "staleness.schedule=divergence",
        "staleness.scale_lr=true",
        "ppo.behaviour_clip=true",
    ],
    # tianjax with w(tau) on the step: each update's learning rate times the batch's mean
    # unnormalised w(tau) (staleness.scale_lr; Adam cancels it as a constant loss weight)
    "tianjax-lr": [
        "ppo.correction=decoupled",
        "staleness.schedule=polynomial",
        "staleness.power=0.5",
        "staleness.scale_lr=true",
        "ppo.behaviour_clip=true",
    ],
    "decoupled-lr": [
        "ppo.correction=decoupled",
        "staleness.schedule=polynomial",
        "staleness.power=0.5",
        "staleness.scale_lr=true",
        "ppo.behaviour_clip=false",
    ],
    "tianjax-wide": [
        "ppo.correction=decoupled",
        "staleness.schedule=polynomial",
        "staleness.power=0.5",
        "ppo.behaviour_clip=true",
        "ppo.behaviour_clip_eps=0.5",
    ],
    # tianjax and tianjax-wide with GAE's traces cut where pi_0 would not have taken mu's
    # later actions (ppo.truncated_traces: c = min(1, pi_0/mu)), so that a stale trajectory's
    # advantage is less of mu's continuation and more of V_0's bootstrap
    "tianjax-traces": [
        "ppo.correction=decoupled",
        "staleness.schedule=polynomial",
        "staleness.power=0.5",
        "ppo.behaviour_clip=true",
        "ppo.truncated_traces=true",
    ],
    "tianjax-wide-traces": [
        "ppo.correction=decoupled",
        "staleness.schedule=polynomial",
        "staleness.power=0.5",
        "ppo.behaviour_clip=true",
        "ppo.behaviour_clip_eps=0.5",
        "ppo.truncated_traces=true",
    ],
    "a3po": ["ppo.correction=a3po", "staleness.schedule=constant"],
    "m2po": ["ppo.correction=m2po", "staleness.schedule=constant"],
    # IMPALA's V-trace on the same env (its own section's defaults, the env's network)
    "vtrace": ["algo=impala", "impala.num_minibatches=4"],
}
# episodes (one per env, each to its end) that evaluate a run's final learner parameters
LEARNER_EPISODES = 128
EVAL_SEED = 10_000
# per-update metrics whose run means each line keeps
DIAGNOSTICS = (
    "behaviour_clip_frac",
    "weight_ess",
    "m2_masked_frac",
    "clip_frac",
    "approx_kl",
    "rho_clip_frac",
)
# PPO keys a row leaves at these values unless it sets them (configs ship others)
ROW_DEFAULTS = {"ppo.behaviour_clip_eps": "null", "ppo.truncated_traces": "false"}
# what a loss override cannot say for IMPALA: its section keys replace PPO's
PPO_ONLY = ("ppo.",)


def overrides_for(env: str, loss: str, lags: list[int]) -> tuple[str, list[str]]:
    config, env_over = ENVS[env]
    over = list(env_over)
    if loss == "vtrace":
        over = [o for o in over if not o.startswith(PPO_ONLY)]
    over += LOSSES[loss] + [f"staleness.forced_lag={max(max(lags), 1)}", "eval.episodes=0"]
    if loss != "vtrace":
        # the loss as its row names it, whatever its config ships: the MinAtar configs ship
        # the behaviour clip's range 0.5 (and refuse a range where a row turns the clip off),
        # they and the CartPole config truncated traces
        for key, value in ROW_DEFAULTS.items():
            if not any(o.startswith(key + "=") for o in over):
                over.append(f"{key}={value}")
    return config, over


def final_of(metrics: dict, tenth: float = 0.1):
    """(final return, tau mean at the end, a 20-point return curve) of one run's
    per-update metrics (numpy arrays [num_updates])."""
    import numpy as np

    ret, n = np.asarray(metrics["episode_return_sum"]), np.asarray(metrics["episodes"])
    u = len(ret)
    last = slice(u - max(1, int(round(u * tenth))), u)
    final = float(ret[last].sum() / max(n[last].sum(), 1))
    edges = np.linspace(0, u, 21).astype(int)
    curve = [float(ret[a:b].sum() / max(n[a:b].sum(), 1)) for a, b in zip(edges[:-1], edges[1:])]
    return final, float(np.asarray(metrics["tau_mean"])[-1]), curve


def done_groups() -> set:
    if not os.path.exists(RUNS):
        return set()
    out = set()
    with open(RUNS) as f:
        for line in f:
            r = json.loads(line)
            out.add((r["env"], r["loss"], r["lag"], r["seed"], r["steps"]))
    return out


def run_group(env: str, loss: str, lags: list[int], seeds: list[int], steps: int | None) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import tianjax
    from tianjax.config import load_config

    config, over = overrides_for(env, loss, lags)
    if steps:
        over.append(f"total_env_steps={steps}")
    cfg = load_config(config, over)
    have = done_groups()
    grid = [
        (k, s) for k in lags for s in seeds if (env, loss, k, s, cfg.total_env_steps) not in have
    ]
    if not grid:
        print(f"{env:13s} {loss:10s} done already", flush=True)
        return
    init, train_fn = tianjax.make_train(cfg)
    one = jax.jit(init)
    # NOTE: one init per seed, stacked on the host (as the fused runner does)
    states = [one(jax.random.key(cfg.seed + 1000 * s)) for _, s in grid]
    state = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
    lag = jnp.asarray([k for k, _ in grid], jnp.int32)
    fn = jax.jit(jax.vmap(train_fn))
    t0 = time.perf_counter()
    program = fn.lower(state, {"staleness.forced_lag": lag}).compile()
    t1 = time.perf_counter()
    out = program(state, {"staleness.forced_lag": lag})
    metrics = jax.device_get(out.metrics)
    t2 = time.perf_counter()
    learner = learner_returns(cfg, out.state.learner.params, [s for _, s in grid])
    os.makedirs(RESULTS, exist_ok=True)
    with open(RUNS, "a") as f:
        for i, (k, s) in enumerate(grid):
            m = {key: np.asarray(v)[i] for key, v in metrics.items()}
            final, tau_end, curve = final_of(m)
            line = {
                "env": env,
                "loss": loss,
                "lag": k,
                "seed": s,
                "steps": cfg.total_env_steps,
                "updates": int(len(m["episodes"])),
                "final_return": final,
                "learner_return": learner[i],
                "tau_mean_end": tau_end,
                # means over the run's updates: what the correction did
                "diagnostics": {
                    key: round(float(np.mean(m[key])), 4) for key in DIAGNOSTICS if key in m
                },
                "curve": curve,
                "runs_in_program": len(grid),
                "compile_s": round(t1 - t0, 1),
                "train_s": round(t2 - t1, 1),
            }
            f.write(json.dumps(line) + "\n")
    finals = ", ".join(
        f"K={k} s{s} {final_of({key: np.asarray(v)[i] for key, v in metrics.items()})[0]:.1f}"
        for i, (k, s) in enumerate(grid)
    )
    print(
        f"{env:13s} {loss:10s} {len(grid)} runs, compile {t1 - t0:.0f} s, train {t2 - t1:.0f} s "
        f"(without compilation): {finals}",
        flush=True,
    )


def learner_returns(cfg, params, seeds: list[int]) -> list[float]:
    """The mean return of LEARNER_EPISODES episodes of each run's final learner parameters
    (`params` stacked over the runs), actions sampled as the actors sample them: the policy
    the run learned, where the training episodes show the one it acted with (K updates
    older). Seed s's episodes use key(EVAL_SEED + s), the same at every K and loss."""
    import jax
    import numpy as np

    from tianjax.algos import make_algorithm
    from tianjax.core import play_episodes
    from tianjax.envs import make_jax_env

    env = make_jax_env(cfg.env_backend, cfg.env, cfg.env_options)
    algo = make_algorithm(
        cfg,
        env.obs_shape,
        env.action_spec,
        correct_staleness=False,
        obs_dtype=getattr(env, "obs_dtype", None),
    )

    def one(p, key):
        return play_episodes(env, algo, p, key, LEARNER_EPISODES, greedy=False).returns.mean()

    keys = jax.vmap(jax.random.key)(np.asarray([EVAL_SEED + s for s in seeds], np.uint32))
    return [round(float(r), 4) for r in jax.device_get(jax.jit(jax.vmap(one))(params, keys))]


def random_return(env: str, num_envs: int = 64, steps: int = 4000) -> float:
    """The mean return of a uniformly random policy's finished episodes (the 0 of the
    fraction), measured on the env as the config makes it."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from tianjax.config import load_config
    from tianjax.envs import make_jax_env

    config, over = ENVS[env]
    cfg = load_config(config, over)
    e = make_jax_env(cfg.env_backend, cfg.env, cfg.env_options)
    spec = e.action_spec

    def act(key):
        if spec.discrete:
            return jax.random.randint(key, (num_envs,), 0, spec.num_actions)
        shape = (num_envs,) + tuple(spec.shape)
        return jax.random.uniform(key, shape, minval=spec.low, maxval=spec.high)

    def step(carry, key):
        state, running, total, count = carry
        k_act, k_env = jax.random.split(key)
        nxt = jax.vmap(e.step)(jax.random.split(k_env, num_envs), state, act(k_act))
        done = nxt.terminated | nxt.truncated
        running = running + nxt.reward
        total = total + jnp.sum(jnp.where(done, running, 0.0))
        running = jnp.where(done, 0.0, running)
        return (nxt.state, running, total, count + jnp.sum(done)), None

    key = jax.random.key(0)
    _, state = jax.vmap(e.reset)(jax.random.split(key, num_envs))
    carry = (state, jnp.zeros((num_envs,), jnp.float32), 0.0, 0)
    (_, _, total, count), _ = jax.jit(lambda c, ks: jax.lax.scan(step, c, ks))(
        carry, jax.random.split(jax.random.key(1), steps)
    )
    return float(np.asarray(total) / max(int(count), 1))


def randoms() -> dict:
    """{env: random policy's return}, measured once and kept in results/random.json."""
    path = os.path.join(RESULTS, "random.json")
    have = json.load(open(path)) if os.path.exists(path) else {}
    missing = [e for e in ENVS if e not in have]
    for env in missing:
        have[env] = round(random_return(env), 3)
    if missing:
        os.makedirs(RESULTS, exist_ok=True)
        with open(path, "w") as f:
            json.dump(have, f, indent=1)
    return have


def load_runs() -> list[dict]:
    """The runs of the runs file, the newest line of each (env, loss, lag, seed, steps)."""
    newest = {}
    with open(RUNS) as f:
        for line in f:
            r = json.loads(line)
            newest[(r["env"], r["loss"], r["lag"], r["seed"], r["steps"])] = r
    return list(newest.values())


def fraction(r_k: float, r_0: float, random: float) -> float:
    """(R_K - R_random) / (R_0 - R_random): 1 as good as K = 0, 0 no better than random."""
    return (r_k - random) / (r_0 - random) if r_0 != random else float("nan")


# what a fraction is of: the training episodes' return (the behaviour policy, K updates
# old), or the final learner parameters' (learner_returns)
OF = {"behaviour": "final_return", "learner": "learner_return"}


def table(plot: bool, of: str = "behaviour") -> str:
    runs = load_runs()
    rand = randoms()
    by = {}
    for r in runs:
        if OF[of] in r:
            by.setdefault((r["env"], r["loss"], r["lag"]), {})[r["seed"]] = r[OF[of]]
    envs = [e for e in ENVS if any(k[0] == e for k in by)]
    losses = [lo for lo in LOSSES if any(k[1] == lo for k in by)]
    lags = sorted({k[2] for k in by})
    lines = []
    for env in envs:
        random = rand[env]
        lines.append(
            f"\n{env}, {WHAT[of]} (random policy {random:g}; the K = 0 return, mean ± sd over "
            "seeds, then the fraction at each K: of the seeds' mean [the lowest and highest "
            "seed's own])\n"
        )
        lines.append("| loss | K = 0 return | " + " | ".join(f"K = {k}" for k in lags if k) + " |")
        lines.append("|---|---:|" + "---:|" * len([k for k in lags if k]))
        for loss in losses:
            base = by.get((env, loss, 0))
            if not base:
                continue
            r0 = statistics.mean(base.values())
            gains = [r - random for r in base.values()]
            failed = sum(g < 0.25 * max(gains) for g in gains)
            cells = []
            for k in lags:
                if not k:
                    continue
                got = by.get((env, loss, k))
                if not got:
                    cells.append("-")
                    continue
                seeds = sorted(set(got) & set(base))
                rk = statistics.mean(got[s] for s in seeds)
                r0s = statistics.mean(base[s] for s in seeds)
                per_seed = [fraction(got[s], base[s], random) for s in seeds]
                span = f" [{min(per_seed):.2f}, {max(per_seed):.2f}]" if len(seeds) > 1 else ""
                if failed:  # a seed that did not learn at K = 0: no fraction of it means much
                    span = " (no range)"
                cells.append(f"{fraction(rk, r0s, random):.2f}{span}")
            spread = ""
            if len(base) > 1:
                spread = f" ± {statistics.stdev(base.values()):.1f}"
            note = f", {failed} not learning" if failed else ""
            lines.append(
                f"| {loss} | {r0:.1f}{spread} (n={len(base)}{note}) | " + " | ".join(cells) + " |"
            )
    text = "\n".join(lines)
    if plot:
        _plot(by, envs, losses, lags, rand, of)
    return text


WHAT = {
    "behaviour": "training episodes (the behaviour policy), last tenth of each run",
    "learner": f"final learner parameters, {LEARNER_EPISODES} sampled-action episodes",
}


def _plot(by, envs, losses, lags, rand, of: str = "behaviour") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(envs), figsize=(4 * len(envs), 3.6), squeeze=False)
    # one colour per loss throughout: matplotlib's 10, then 3 more (the 11th would be C0 again)
    palette = [f"C{i}" for i in range(10)] + ["black", "gold", "navy"]
    colour = {loss: palette[i] for i, loss in enumerate(LOSSES)}
    handles = {}
    for ax, env in zip(axes[0], envs):
        random = rand[env]
        for loss in losses:
            base = by.get((env, loss, 0))
            if not base:
                continue
            gains = [r - random for r in base.values()]
            unlearned = any(g < 0.25 * max(gains) for g in gains)  # as the table's "not learning"
            xs, ys = [], []
            for k in lags:
                got = by.get((env, loss, k))
                if not got:
                    continue
                seeds = sorted(set(got) & set(base))
                rk = statistics.mean(got[s] for s in seeds)
                r0 = statistics.mean(base[s] for s in seeds)
                xs.append(max(k, 0.5))
                ys.append(fraction(rk, r0, random))
            # a loss whose K = 0 seeds did not all learn: faint and dotted, its fraction means little
            (line,) = ax.plot(
                xs,
                ys,
                marker="o",
                color=colour[loss],
                ls=":" if unlearned else "-",
                alpha=0.35 if unlearned else 1.0,
            )
            if not unlearned or loss not in handles:  # a solid line where there is one
                handles[loss] = line
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.axhline(0.9, color="grey", lw=0.5, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("forced lag K (updates; 0 plotted at 0.5)")
        ax.set_title(env)
    axes[0][0].set_ylabel("final return / K = 0's (over random)")
    fig.legend(
        list(handles.values()), list(handles), loc="lower center", ncol=len(handles), fontsize=8
    )
    fig.suptitle(
        f"final return ({WHAT[of]}) at lag K over the same loss and seeds at K = 0; equal "
        "env steps; dotted: a loss whose K = 0 seeds did not all learn",
        fontsize=8,
    )
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    name = "staleness_robustness" + ("" if of == "behaviour" else "_learner")
    fig.savefig(os.path.join(RESULTS, name + ".png"), dpi=110)


def main():
    global RUNS
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="train the grid's missing runs")
    r.add_argument(
        "--envs", nargs="+", default=["breakout", "spaceinvaders", "acrobot", "pendulum"]
    )
    r.add_argument("--losses", nargs="+", default=list(LOSSES), choices=list(LOSSES))
    r.add_argument("--lags", nargs="+", type=int, default=[0, 4, 16, 64])
    r.add_argument("--seeds", type=int, default=3)
    r.add_argument("--steps", type=int, default=None, help="total env steps (default: the env's)")
    t = sub.add_parser("table", help="print the table of results/runs.jsonl")
    t.add_argument(
        "--plot", action="store_true", help="also write results/staleness_robustness[_learner].png"
    )
    t.add_argument(
        "--of",
        choices=list(OF),
        default="behaviour",
        help="the return a fraction is of: the training episodes' (default) or the final "
        "learner parameters' (runs that have it)",
    )
    for p in (r, t):
        p.add_argument("--out", default=RUNS, help="the runs file (default: results/runs.jsonl)")
    args = ap.parse_args()
    RUNS = args.out
    if args.cmd == "table":
        print(table(args.plot, args.of))
        return
    randoms()
    for env in args.envs:
        for loss in args.losses:
            run_group(env, loss, sorted(args.lags), list(range(args.seeds)), args.steps)


if __name__ == "__main__":
    sys.exit(main())
