"""Where an actor's samples come from: JAX envs (one jitted scan per rollout) or host envs
(a Python loop over batched env steps with the jitted policy in it).

Both produce the same thing per call: a numpy [T, B] batch (a Trajectory for on-policy
algorithms, Transitions for replay ones; for recurrent replay agents such as QMIX, JAX
envs only, Sequences [B, T] with the recurrent state each env's rollout started from)
stamped per step with the behaviour version, plus the episodes that finished during it.
Python touches each step's batch, never a sample. A host source can take a newer version
between two vector steps (runtime.param_refresh: step), so its trajectory may hold several
versions, non-decreasing along T; a JAX source's rollout is one scan with one version.

A recurrent policy's state lives in the source between calls: each rollout starts from
the state the previous one ended with (reset to `init_carry` where an episode ended), so
an actor's trajectories continue one another as the fused loop's do.

The episodes are what is reported, the batch what is learned from; for host envs they can
differ: with Atari's reward clipping and episodic life the batch has clipped rewards and
an episode end at each lost life, while the reported return is the unclipped score of the
whole game (tianjax.envs.factory).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tianjax.algos import make_algorithm
from tianjax.config import Config, ConfigError
from tianjax.core.algorithm import Algorithm
from tianjax.core.episodes import Episodes, track_episodes, truncation_bootstrap, values_where_cut
from tianjax.core.rollout import make_rollout
from tianjax.core.types import EpisodeStats, Trajectory, Transition
from tianjax.envs.factory import HostEnv, make_host_env, make_jax_env

_JAX_BACKENDS = ("gymnax", "jaxmarl", "brax")


class Rollout(NamedTuple):
    batch: Trajectory | Transition  # numpy leaves, [T, B, ...] (last_obs [B, ...])
    episodes: Episodes  # numpy [T, B] done / returns / lengths


def batch_template(config: Config, algo: Algorithm, obs_shape, obs_dtype) -> tuple:
    """ShapeDtypeStructs of one actor's rollout message: (batch, episodes, act_steps), where
    act_steps (int64 scalar) is the global env-step count the actor's schedules used."""
    T, B = config.rollout_len, config.num_envs
    sds = jax.ShapeDtypeStruct
    if config.env_backend == "jaxmarl" or (
        not algo.buffer.host_envs and config.env_backend in _JAX_BACKENDS
    ):
        # structured observations (MAObs), episodes with wins, sequences with their start
        # carry: the rollout's own shapes
        init, rollout = make_rollout(
            make_jax_env(config.env_backend, config.env, config.env_options), algo, B, T
        )
        params = jax.eval_shape(algo.init, jax.random.key(0)).params
        state = jax.eval_shape(init, jax.random.key(0))
        _, batch, episodes = jax.eval_shape(rollout, params, 0, state, 0)
        return batch, episodes, sds((), np.int64)
    params = jax.eval_shape(algo.init, jax.random.key(0)).params
    out = jax.eval_shape(
        algo.act, params, sds((B,) + tuple(obs_shape), obs_dtype), jax.random.key(0), 0
    )
    act = sds((T,) + out.action.shape, out.action.dtype)
    obs = sds((T, B) + tuple(obs_shape), obs_dtype)
    if not algo.buffer.host_envs:
        raise ConfigError(
            f"config key 'env_backend': '{algo.name}' replays {algo.buffer.items} of a recurrent "
            f"policy, which actors run on JAX envs only ({', '.join(_JAX_BACKENDS)})"
        )
    batch = algo.buffer.batch_template(T, B, obs, act, sds((B,) + tuple(obs_shape), obs_dtype))
    f32, i32, b = (sds((T, B), d) for d in (np.float32, np.int32, np.bool_))
    return batch, Episodes(b, f32, i32), sds((), np.int64)


class JaxSource:
    """B JAX envs; each call is one jitted lax.scan rollout and one device->host copy. The
    rollout state (envs, key, episode stats, a recurrent policy's carry) stays on the
    device from one call to the next."""

    def __init__(self, config: Config, algo: Algorithm, seed: int, env=None):
        env = env or make_jax_env(config.env_backend, config.env, config.env_options)
        self.algo = algo
        init, rollout = make_rollout(env, algo, config.num_envs, config.rollout_len)
        self._state = jax.jit(init)(jax.random.key(seed))
        self._rollout = jax.jit(rollout, donate_argnums=2)
        self.steps_per_call = config.num_envs * config.rollout_len

    def compile(self, params) -> None:
        """Compiles the rollout now (params may be ShapeDtypeStructs) rather than at the first call."""
        self._rollout = self._rollout.lower(params, np.int32(0), self._state, np.int32(0)).compile()

    def share_compiled(self, other: "JaxSource") -> None:
        """Steps with `other`'s compiled rollout (same config: the same shapes), so that
        several shards of one process run one program, as one shard per process would."""
        self._rollout = other._rollout

    def snapshot(self):
        """A copy of the rollout state the next call starts from (envs, key, episode stats,
        carry): `restore` rewinds to it. A copy, since each call donates the state."""
        return jax.tree.map(jnp.copy, self._state)

    def restore(self, snapshot) -> None:
        """Rewinds to a `snapshot()`: the next calls repeat the rollouts made from it."""
        self._state = jax.tree.map(jnp.copy, snapshot)

    @property
    def carry(self):
        """A recurrent policy's state [B, ...] the next rollout starts from (None otherwise)."""
        return self._state.carry

    def __call__(self, params, version: int, env_steps: int) -> Rollout:
        self._state, batch, episodes = self._rollout(
            params, np.int32(version), self._state, np.int32(env_steps)
        )
        batch, episodes = jax.device_get((batch, episodes))
        return Rollout(batch, episodes)

    def close(self):
        pass


class HostSource:
    """B host envs (envpool or gymnasium) stepped from Python with the jitted policy.

    Episodes and the truncation bootstrap are tianjax.core.episodes' (as in the JAX rollout);
    the bootstrap values are evaluated once per rollout, batched over the truncated steps.
    """

    def __init__(
        self,
        config: Config,
        algo: Algorithm,
        seed: int,
        env: HostEnv | None = None,
        key: jax.Array | None = None,
    ):
        self.env = env or make_host_env(
            config.env_backend, config.env, config.num_envs, seed, **config.env_options
        )
        self.algo = algo
        self.T, self.B = config.rollout_len, config.num_envs
        self.replay = algo.buffer.replayed
        self.steps_per_call = self.T * self.B
        self._obs_dtype = jax.dtypes.canonicalize_dtype(self.env.obs_dtype)
        self._obs = np.asarray(self.env.reset(seed), self._obs_dtype)
        self._key = jax.random.key(seed) if key is None else key
        self._stats = EpisodeStats(np.zeros(self.B, np.float64), np.zeros(self.B, np.int32))

        def act(params, obs, key, env_steps):
            key, sub = jax.random.split(key)
            out = algo.act(params, obs, sub, env_steps)
            return key, (out.action, out.log_prob, out.value)

        self._act = jax.jit(act)
        self._value = jax.jit(algo.value)

    @property
    def obs_dtype(self):
        return self._obs_dtype

    def compile(self, params) -> None:
        """Compiles the policy and value calls now rather than at the first step (or at the
        first truncation, mid-training)."""
        obs = jax.ShapeDtypeStruct(self._obs.shape, self._obs_dtype)
        self._act = self._act.lower(params, obs, self._key, np.int32(0)).compile()
        self._value = self._value.lower(params, obs).compile()

    def __call__(self, params, version: int, env_steps: int, refresh=None) -> Rollout:
        """One rollout acted with `params` of `version`. `refresh() -> (params, version) or
        None` (runtime.param_refresh: step), when given, is asked before every vector step
        after the first for a newer version, which acts from that step on; every step is
        stamped with the version that chose its action, and its log mu and value are that
        version's. It must never wait."""
        T, B = self.T, self.B
        obs_shape = self._obs.shape[1:]
        obs_buf = np.empty((T, B) + obs_shape, self._obs_dtype)
        rew_buf = np.empty((T, B), np.float32)
        done_buf = np.empty((T, B), bool)
        ep_done = np.zeros((T, B), bool)
        ep_ret = np.zeros((T, B), np.float32)
        ep_len = np.zeros((T, B), np.int32)
        act_buf = logp_buf = val_buf = None
        term_buf = np.empty((T, B), bool) if self.replay else None
        # replay: every step's next observation; on-policy: the final ones where a time
        # limit cut an episode (zeros elsewhere: the pages stay untouched)
        final_buf = (np.empty if self.replay else np.zeros)((T, B) + obs_shape, self._obs_dtype)
        cut_buf = np.zeros((T, B), bool)
        versions = np.empty(T, np.int32)  # the version that acted at each vector step
        for t in range(T):
            if refresh is not None and t and (newer := refresh()) is not None:
                params, version = newer
            versions[t] = version
            self._key, (action, log_prob, value) = self._act(
                params, self._obs, self._key, np.int32(env_steps + t * B)
            )
            action = np.asarray(action)
            if act_buf is None:
                act_buf = np.empty((T,) + action.shape, action.dtype)
                logp_buf = np.empty((T, B), np.float32)
                val_buf = np.empty((T, B), np.float32)
            step = self.env.step(action)
            obs_buf[t] = self._obs
            act_buf[t] = action
            logp_buf[t] = np.asarray(log_prob)
            val_buf[t] = np.asarray(value)
            rew_buf[t] = step.reward
            done_buf[t] = step.terminated | step.truncated
            if self.replay:
                final_buf[t] = step.final_obs
                term_buf[t] = step.terminated
            else:
                cut = cut_buf[t] = step.truncated & ~step.terminated
                if cut.any():
                    final_buf[t, cut] = np.asarray(step.final_obs, self._obs_dtype)[cut]
            # the reported episode is the whole game, scored unclipped (HostStep.report_*);
            # learning above keeps the clipped reward and the per-life ends
            self._stats, ep_ret[t], ep_len[t] = track_episodes(
                self._stats, step.report_reward, step.report_done, np
            )
            ep_done[t] = step.report_done
            self._obs = np.asarray(step.obs, self._obs_dtype)
        v_stamp = np.repeat(versions[:, None], B, axis=1)
        episodes = Episodes(ep_done, ep_ret, ep_len)
        if self.replay:
            return Rollout(
                Transition(
                    obs=obs_buf,
                    action=act_buf,
                    reward=rew_buf,
                    next_obs=final_buf,
                    terminated=term_buf,
                    version=v_stamp,
                ),
                episodes,
            )
        # NOTE: the newest params the rollout acted with value the cut episodes' final
        # observations (one batched call; a learner may bootstrap with its own critic)
        values = values_where_cut(lambda obs: self._value(params, obs), cut_buf, final_buf, B)
        boot, trunc_obs, trunc_t = truncation_bootstrap(values, cut_buf, final_buf, np)
        traj = Trajectory(
            obs=obs_buf,
            action=act_buf,
            reward=rew_buf,
            done=done_buf,
            bootstrap_value=boot,
            behaviour_log_prob=logp_buf,
            behaviour_value=val_buf,
            version=v_stamp,
            last_obs=self._obs.copy(),
            trunc_obs=trunc_obs,
            trunc_t=trunc_t,
        )
        return Rollout(traj, episodes)

    def close(self):
        self.env.close()


def make_source(config: Config, seed: int):
    """The configured env's rollout source, with the algorithm built for its spaces."""
    if config.env_backend in _JAX_BACKENDS:
        env = make_jax_env(config.env_backend, config.env, config.env_options)
        algo = make_algorithm(
            config, env.obs_shape, env.action_spec, obs_dtype=getattr(env, "obs_dtype", None)
        )
        return JaxSource(config, algo, seed, env=env)
    env = make_host_env(config.env_backend, config.env, config.num_envs, seed, **config.env_options)
    algo = make_algorithm(config, tuple(env.obs_shape), env.action_spec, obs_dtype=env.obs_dtype)
    return HostSource(config, algo, seed, env=env)


__all__ = ["HostSource", "JaxSource", "Rollout", "batch_template", "make_source"]
