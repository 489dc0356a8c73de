"""The in-process trainer for host envs (envpool, gymnasium): a Python loop around jitted
policy and learner functions.

One batch of `config.num_envs` host envs (tianjax.envs.host) is stepped from Python. Each
iteration:

1. acts for `rollout_len` steps with a jitted `algo.act` (the policy stays on the device;
   one device->host transfer per step brings back the actions, log-probs and values of
   the whole batch), building a numpy [T, B] Trajectory stamped with the learner version;
   Python works per batch, never per sample;
2. evaluates the truncation bootstrap V(final_obs) with `algo.value` once per rollout,
   batched over only the (step, env) pairs where an episode was cut by a time limit, B
   observations per call (padded, so one shape is compiled), and not at all when no
   episode was cut;
3. applies the jitted `algo.update` to that batch.

Replay algorithms (DQN) run the same loop, adding each rollout's [T * B] transitions to an
on-device replay buffer and taking `dqn.updates_per_rollout` gradient steps once
`dqn.learning_starts` env steps have been collected, exactly as the fused loop does.

Modes: `sync` is this loop. `async` runs the same single-process loop (its learner uses
the staleness-corrected losses, which reduce to the plain ones because every batch here is
fresh); actor and learner processes that really run apart, and several actors, are the
distributed runtime's. Here `num_actors` is 0 or 1: one batch of envs, acted on inside the
learner's process.

Everything jitted (init, act, value, update) is compiled ahead of time (lower + compile)
before the first env step, so that compile time is reported apart from training time.
"""

from __future__ import annotations

import math
import time

import jax
import numpy as np

from tianjax import buffers
from tianjax.algos import make_algorithm
from tianjax.algos.base import Algorithm
from tianjax.config import Config, ConfigError
from tianjax.envs.host import HostEnv, make_host_env
from tianjax.metrics import EpisodeTracker, Progress, RunLogger
from tianjax.types import Trajectory, Transition


def _check_config(config: Config) -> None:
    if config.num_actors not in (0, 1):
        raise ConfigError(f"config key 'num_actors': the in-process host trainer acts with one batch "
                          f"of envs in the learner's process (num_actors 0 or 1), got "
                          f"{config.num_actors}; several actor processes need the distributed "
                          "runtime (or raise num_envs for more envs here)")


def _mean_metrics(metrics: list[dict]) -> dict:
    if not metrics:
        return {}
    host = jax.device_get(metrics)
    return {k: float(np.mean([np.mean(m[k]) for m in host])) for k in host[0]}


class _Compiled:
    """AOT-compiled callables and the time spent compiling them."""

    def __init__(self):
        self.time_s = 0.0

    def compile(self, fn, *args, donate_argnums=(), run_once=False):
        t = time.perf_counter()
        lowered = jax.jit(fn, donate_argnums=donate_argnums).lower(*args)
        # A program that runs once (init) is not worth optimising: that halves its compile.
        out = lowered.compile({"xla_backend_optimization_level": 0} if run_once else None)
        self.time_s += time.perf_counter() - t
        return out


def run_host(config: Config, logger: RunLogger, progress: Progress, env: HostEnv | None = None,
             algo: Algorithm | None = None) -> dict:
    """Trains `config` on host envs in this process. Returns the same keys as run_fused.

    `env` (a HostEnv of config.num_envs envs) and `algo` may be passed in instead of being
    built from the config (tests, custom envs); an env built here is closed at the end.
    """
    t_start = time.perf_counter()
    _check_config(config)
    own_env = env is None
    if own_env:
        env = make_host_env(config.env_backend, config.env, config.num_envs, config.seed)
    try:
        if env.num_envs != config.num_envs:
            raise ConfigError(f"config key 'num_envs': is {config.num_envs} but the env passed in "
                              f"has {env.num_envs} envs")
        if algo is None:
            algo = make_algorithm(config, env.obs_shape, env.action_spec,
                                  correct_staleness=config.mode == "async")
        out = _train(config, logger, progress, env, algo, t_start)
    finally:
        if own_env:
            env.close()
    return out


def _train(config: Config, logger: RunLogger, progress: Progress, env: HostEnv, algo: Algorithm,
           t_start: float) -> dict:
    B, T = config.num_envs, config.rollout_len
    per_iter = B * T
    n_iters = math.ceil(config.total_env_steps / per_iter)
    replay = algo.buffer == "replay"

    def setup(seed):
        k_learn, k_act = jax.random.split(jax.random.key(seed))
        return algo.init(k_learn), k_act

    cc = _Compiled()
    learner, k_act = cc.compile(setup, np.int32(0), run_once=True)(np.int32(config.seed))
    obs = env.reset(config.seed)
    obs_dtype = jax.dtypes.canonicalize_dtype(obs.dtype)
    obs = np.asarray(obs, obs_dtype)

    def act_step(params, obs, key, env_steps):
        key, sub = jax.random.split(key)
        out = algo.act(params, obs, sub, env_steps)
        return key, (out.action, out.log_prob, out.value)

    # ------------------------------------------------------------------ compile
    steps0 = np.int32(0)
    act_c = cc.compile(act_step, learner.params, obs, k_act, steps0)
    _, (a_shape, _, _) = jax.eval_shape(act_step, learner.params, obs, k_act, steps0)
    act_dtype, act_tail = a_shape.dtype, tuple(a_shape.shape[1:])
    sds = jax.ShapeDtypeStruct
    obs_sds = sds((T, B) + obs.shape[1:], obs_dtype)
    tb_f32, tb_i32 = sds((T, B), np.float32), sds((T, B), np.int32)
    if replay:
        trans_sds = Transition(obs_sds, sds((T, B) + act_tail, act_dtype), tb_f32, obs_sds,
                               sds((T, B), np.bool_), tb_i32)
        one = jax.tree.map(lambda s: np.zeros(s.shape[2:], s.dtype), trans_sds)
        rb = cc.compile(lambda x: buffers.replay_init(config.dqn.buffer_size, x), one, run_once=True)(one)
        learn_c = cc.compile(_make_replay_learn(config, algo), learner, rb, trans_sds, steps0,
                             donate_argnums=(0, 1))
    else:
        traj_sds = Trajectory(obs_sds, sds((T, B) + act_tail, act_dtype), tb_f32, sds((T, B), np.bool_),
                              tb_f32, tb_f32, tb_f32, tb_i32, sds(obs.shape, obs_dtype))
        learn_c = cc.compile(algo.update, learner, traj_sds, donate_argnums=0)
        # V(final obs) of truncated steps, B observations at a time (one compiled shape)
        value_c = cc.compile(algo.value, learner.params, sds(obs.shape, obs_dtype))
    compile_time = cc.time_s

    # ------------------------------------------------------------------ train
    tracker = EpisodeTracker(config.target_return)
    ep_ret = np.zeros(B, np.float64)
    key = k_act
    env_steps = 0
    pending: list[dict] = []
    t_env = t_act = t_update = 0.0
    version = int(learner.version)
    t_train = time.perf_counter()
    for it in range(n_iters):
        params = learner.params
        obs_buf = np.empty((T, B) + obs.shape[1:], obs_dtype)
        act_buf = np.empty((T, B) + act_tail, act_dtype)
        rew_buf = np.empty((T, B), np.float32)
        if replay:
            next_buf = np.empty_like(obs_buf)
            term_buf = np.empty((T, B), bool)
        else:
            done_buf = np.empty((T, B), bool)
            logp_buf = np.empty((T, B), np.float32)
            val_buf = np.empty((T, B), np.float32)
            cuts: list[tuple[int, np.ndarray, np.ndarray]] = []  # (t, env ids, final obs)
        for t in range(T):
            t0 = time.perf_counter()
            key, out = act_c(params, obs, key, np.int32(env_steps))
            action, log_prob, value = (np.asarray(x) for x in out)  # faster than device_get
            t1 = time.perf_counter()
            step = env.step(action)
            t2 = time.perf_counter()
            t_act += t1 - t0
            t_env += t2 - t1
            env_steps += B
            obs_buf[t] = obs
            act_buf[t] = action
            rew_buf[t] = step.reward
            done = step.terminated | step.truncated
            if replay:
                next_buf[t] = step.final_obs
                term_buf[t] = step.terminated
            else:
                done_buf[t] = done
                logp_buf[t] = log_prob
                val_buf[t] = value
                cut = step.truncated & ~step.terminated
                if cut.any():
                    ids = np.flatnonzero(cut)
                    cuts.append((t, ids, np.asarray(step.final_obs)[ids]))
            ep_ret += step.reward
            if done.any():
                tracker.add(ep_ret[done], env_steps, time.perf_counter() - t_start)
                ep_ret[done] = 0.0
            obs = np.asarray(step.obs, obs_dtype)

        t0 = time.perf_counter()
        v_stamp = np.full((T, B), version, np.int32)
        if replay:
            batch = Transition(obs_buf, act_buf, rew_buf, next_buf, term_buf, v_stamp)
            learner, rb, metrics = learn_c(learner, rb, batch, np.int32(env_steps))
        else:
            boot = np.zeros((T, B), np.float32)
            if cuts:
                ts = np.concatenate([np.full(len(ids), t) for t, ids, _ in cuts])
                ids = np.concatenate([ids for _, ids, _ in cuts])
                final = np.concatenate([f for _, _, f in cuts]).astype(obs_dtype, copy=False)
                n = len(final)
                padded = np.zeros((-(-n // B) * B,) + obs.shape[1:], obs_dtype)
                padded[:n] = final
                values = [value_c(params, chunk) for chunk in np.split(padded, len(padded) // B)]
                boot[ts, ids] = np.concatenate([np.asarray(v) for v in values])[:n]
            batch = Trajectory(obs_buf, act_buf, rew_buf, done_buf, boot, logp_buf, val_buf,
                               v_stamp, obs)
            learner, metrics = learn_c(learner, batch)
        pending.append(metrics)
        version = int(learner.version)  # waits for the update (the next act would anyway)
        t_update += time.perf_counter() - t0

        if (it + 1) % config.log_every == 0 or it + 1 == n_iters:
            now = time.perf_counter()
            train_time = now - t_train
            ma = tracker.moving_average
            record = {
                "env_steps": env_steps,
                "updates": version,
                "wall_time_s": now - t_start,
                "env_steps_per_s": env_steps / max(train_time, 1e-9),
                "return_mean_100": ma,
                "episodes": tracker.episodes,
            }
            record.update(_mean_metrics(pending))
            pending = []
            logger.log(record)
            progress.update(env_steps, ret=ma, sps=int(record["env_steps_per_s"]))

    train_time = time.perf_counter() - t_train
    return {
        "params": learner.params,
        "algo": algo,
        "env": env,
        "env_steps": env_steps,
        "updates": int(learner.version),
        "skipped_updates": int(learner.skipped_updates),
        "train_time_s": train_time,
        "compile_time_s": compile_time,
        "env_steps_per_s": env_steps / max(train_time, 1e-9),
        "episodes": tracker.episodes,
        "final_return": tracker.moving_average,
        "convergence_time_s": tracker.convergence_time_s,
        "convergence_env_steps": tracker.convergence_env_steps,
        "extra_summary": {
            # where the training time went: env.step, policy (act + transfer), learner
            "env_time_s": t_env,
            "act_time_s": t_act,
            "update_time_s": t_update,
        },
    }


def _make_replay_learn(config: Config, algo: Algorithm):
    """learn(learner, replay, transitions [T, B], env_steps) -> (learner, replay, metrics):
    the fused loop's replay step (tianjax.fused) for a batch that came from the host."""
    import jax.numpy as jnp

    def learn(learner, rb, trans, env_steps):
        rb = buffers.replay_add(rb, buffers.flatten_time_batch(trans))

        def run(l0):
            def one(l, _):
                key, sub = jax.random.split(l.key)
                batch = buffers.replay_sample(rb, sub, config.dqn.batch_size)
                return algo.update(l._replace(key=key), batch)

            return jax.lax.scan(one, l0, None, length=config.dqn.updates_per_rollout)

        def skip(l0):
            _, m = jax.eval_shape(run, l0)
            return l0, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), m)

        learner, metrics = jax.lax.cond(env_steps >= config.dqn.learning_starts, run, skip, learner)
        return learner, rb, jax.tree.map(lambda x: jnp.mean(x, axis=0), metrics)

    return learn


__all__ = ["run_host"]
