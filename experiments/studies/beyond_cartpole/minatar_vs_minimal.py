"""tianjax's fused PPO against the in-repo minimal PPO on a MinAtar env, same settings, one run.

    python experiments/studies/beyond_cartpole/minatar_vs_minimal.py
        [--env SpaceInvaders-MinAtar] [--steps 10000000] [--seed 0]

Both sides take their hyperparameters from the env's shipped tianjax config
(configs/ppo_<name>_minatar.yaml: envs, rollout length, epochs, minibatches, learning rate and
whether it anneals, gamma, lambda, clip, entropy and value coefficients, grad-norm clip).
The network is the minimal PPO's (flatten,
then separate 2x64 tanh actor and critic towers), set in tianjax by `network.torso=mlp
network.hidden=[64,64] network.activation=tanh`, so the two differ only in tianjax's own
parts (truncation bootstrap, version stamps, non-finite guard, episode bookkeeping).
experiments/benchmarks/minimal_ppo.py is the bare algorithm, written apart from tianjax.

Printed: per side, the mean return of the last 100 finished episodes at the end (what
tianjax calls final_return), the env steps, and the training time with compilation apart.
The same for tianjax with the config's own network, as a third row.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import jax
import numpy as np

# experiments/benchmarks/, for the reference PPO
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks")
)

from minimal_ppo import make_train  # noqa: E402

import tianjax  # noqa: E402

MLP = ["network.torso=mlp", "network.hidden=[64,64]", "network.activation=tanh"]


def last_episodes_mean(r: np.ndarray, d: np.ndarray, n: int = 100) -> float:
    """Mean return of the last `n` episodes to finish, from rewards and done flags [time, env]."""
    ends, rets = [], []
    for e in range(r.shape[1]):
        total = np.cumsum(r[:, e])
        idx = np.flatnonzero(d[:, e])
        if idx.size == 0:
            continue
        at_end = total[idx]
        rets.append(np.diff(np.concatenate([[0.0], at_end])))
        ends.append(idx)
    ends, rets = np.concatenate(ends), np.concatenate(rets)
    return float(rets[np.argsort(ends, kind="stable")][-n:].mean())


def run_minimal(cfg, steps: int, seed: int) -> dict:
    p = cfg.ppo
    train, total = make_train(
        env_name=cfg.env,
        num_envs=cfg.num_envs,
        num_steps=cfg.rollout_len,
        total_steps=steps,
        epochs=p.num_epochs,
        minibatches=p.num_minibatches,
        lr=p.lr,
        gamma=p.gamma,
        lam=p.gae_lambda,
        clip=p.clip_eps,
        ent=p.ent_coef,
        vf=p.vf_coef,
        max_norm=p.max_grad_norm,
        anneal=p.anneal_lr,
    )
    t = time.perf_counter()
    compiled = jax.jit(train).lower(jax.random.key(seed)).compile()
    compile_s = time.perf_counter() - t
    t = time.perf_counter()
    _, r, d = jax.block_until_ready(compiled(jax.random.key(seed)))
    train_s = time.perf_counter() - t
    r = np.asarray(r).reshape(-1, cfg.num_envs)
    d = np.asarray(d).reshape(-1, cfg.num_envs)
    return {
        "final_return": last_episodes_mean(r, d),
        "env_steps": total,
        "train_s": train_s,
        "compile_s": compile_s,
    }


def run_tianjax(config: str, overrides: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as d:
        s = tianjax.train(config, overrides, run_dir=d, progress=False, verbose=False).summary
    return {
        "final_return": s["final_return"],
        "env_steps": s["env_steps"],
        "train_s": s["env_steps"] / s["env_steps_per_s"],
        "compile_s": s["compile_time_s"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="SpaceInvaders-MinAtar")
    ap.add_argument("--steps", type=int, default=10_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--no-own", action="store_true", help="skip the third row (the config's own network)"
    )
    args = ap.parse_args()
    name = args.env.split("-")[0].lower()
    config = f"configs/ppo_{name}_minatar.yaml"
    common = [
        f"total_env_steps={args.steps}",
        f"seed={args.seed}",
        "eval.episodes=0",
        "log_every=50",
        "target_return=null",
    ]
    cfg = tianjax.load_config(config, common + MLP)
    rows = [
        ("minimal PPO, 2x64 tanh MLP", run_minimal(cfg, args.steps, args.seed)),
        ("tianjax fused PPO, 2x64 tanh MLP", run_tianjax(config, common + MLP)),
    ]
    if not args.no_own:
        rows.append(("tianjax fused PPO, the config's own network", run_tianjax(config, common)))
    print(
        f"\n{args.env}, {args.steps:,} env steps, seed {args.seed}; return = mean of the last 100 episodes"
    )
    print("| run | final return | env steps | training s (compile apart) | compile s |")
    print("|---|---|---|---|---|")
    for label, r in rows:
        print(
            f"| {label} | {r['final_return']:.2f} | {r['env_steps']:,} | {r['train_s']:.1f} | {r['compile_s']:.1f} |"
        )
    print(
        f"tianjax/minimal final return (same MLP): {rows[1][1]['final_return'] / rows[0][1]['final_return']:.2f}"
    )


if __name__ == "__main__":
    main()
