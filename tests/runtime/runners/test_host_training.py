"""The in-process host trainer (tianjax.runtime.runners.inprocess): the batches it builds, the
run directory it writes, and PPO learning CartPole on envpool."""

import json
import os

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import tianjax
from tianjax.algos import make_algorithm
from tianjax.config import ConfigError, load_config
from tianjax.core.algorithm import ActOutput, Algorithm
from tianjax.core.update import init_state
from tianjax.envs.factory import make_host_env
from tianjax.metrics import Progress, RunLogger
from tianjax.runtime.runners.inprocess import run_host

ENVPOOL_CFG = "configs/ppo_cartpole_envpool.yaml"
GYM_CFG = "configs/ppo_cartpole_gymnasium.yaml"


def _in_process_actors() -> int:
    """The num_actors that selects this trainer: 0 where the config knows actor processes
    (0 = act inside the learner), 1 where it does not (num_actors >= 1)."""
    try:
        load_config(ENVPOOL_CFG, ["num_actors=0"])
        return 0
    except ConfigError:
        return 1


IN_PROCESS = f"num_actors={_in_process_actors()}"


class _Ticker(gymnasium.Env):
    """obs = [steps so far, parity]: envs seeded odd terminate after 3 steps; the others run
    into the 4-step time limit (truncation), so both kinds of ending happen at known steps."""

    observation_space = gymnasium.spaces.Box(0.0, 10.0, (2,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)
    parity = 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.parity = seed % 2
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        return np.array([self.t, self.parity], np.float32)

    def step(self, action):
        self.t += 1
        return self._obs(), float(self.t), bool(self.parity and self.t == 3), False, {}


gymnasium.register("TianjaxTestTicker-v0", entry_point=_Ticker, max_episode_steps=4)


class _Recorder:
    """A HostEnv proxy that keeps every step it returns."""

    def __init__(self, env):
        self.env, self.steps = env, []
        for k in ("num_envs", "obs_shape", "obs_dtype", "action_spec", "name"):
            setattr(self, k, getattr(env, k))

    def reset(self, seed=None):
        self.first_obs = self.env.reset(seed).copy()
        return self.first_obs

    def step(self, actions):
        s = self.env.step(actions)
        self.steps.append(jax.tree.map(np.copy, s))
        return s

    def close(self):
        self.env.close()


def _run(config, tmp_path, env=None, algo=None):
    logger = RunLogger(config, str(tmp_path / "run"))
    try:
        return run_host(
            config, logger, Progress(config.total_env_steps, enabled=False), env=env, algo=algo
        )
    finally:
        logger.close()


def test_ppo_batches_bootstrap_truncations_only(tmp_path):
    B, T = 4, 8
    config = load_config(
        GYM_CFG,
        [
            IN_PROCESS,
            "env=TianjaxTestTicker-v0",
            f"num_envs={B}",
            f"rollout_len={T}",
            f"total_env_steps={2 * B * T}",
            "ppo.num_minibatches=2",
            "network.hidden=[16]",
        ],
    )
    env = _Recorder(make_host_env("gymnasium", config.env, B, seed=config.seed))
    base = make_algorithm(config, env.obs_shape, env.action_spec, correct_staleness=False)
    seen = []

    def update(state, traj):
        jax.debug.callback(lambda p, b: seen.append((p, b)), state.params, traj, ordered=True)
        return base.update(state, traj)

    out = _run(config, tmp_path, env, base._replace(update=update))
    env.close()
    assert out.updates == 2 and out.env_steps == 2 * B * T and len(seen) == 2
    steps = env.steps
    assert len(steps) == 2 * T
    value = jax.jit(base.value)
    n_cut = n_term = 0
    for k, (params, traj) in enumerate(seen):
        np.testing.assert_array_equal(traj.version, k)  # stamped with the learner version
        for t in range(T):
            s = steps[k * T + t]
            prev_obs = env.first_obs if k == t == 0 else steps[k * T + t - 1].obs
            np.testing.assert_array_equal(traj.obs[t], prev_obs)
            np.testing.assert_array_equal(traj.reward[t], s.reward)
            np.testing.assert_array_equal(traj.done[t], s.terminated | s.truncated)
            cut = s.truncated & ~s.terminated
            want = np.where(cut, np.asarray(value(params, s.final_obs)), 0.0)
            np.testing.assert_allclose(traj.bootstrap_value[t], want, rtol=1e-5, atol=1e-6)
            n_cut += int(cut.sum())
            n_term += int(s.terminated.sum())
        np.testing.assert_array_equal(traj.last_obs, steps[k * T + T - 1].obs)
        np.testing.assert_allclose(
            traj.behaviour_value, np.asarray(value(params, traj.obs)), rtol=1e-5, atol=1e-6
        )
        logits, _ = base.network.apply(params, traj.obs)
        logp = np.take_along_axis(
            np.asarray(jax.nn.log_softmax(logits)), traj.action[..., None], -1
        )[..., 0]
        np.testing.assert_allclose(traj.behaviour_log_prob, logp, rtol=1e-5, atol=1e-5)
    assert n_cut > 0 and n_term > 0
    # episodes: odd envs end after 3 steps (return 1+2+3), even ones after 4 (return 10)
    assert out.episodes == n_cut + n_term
    returns = [
        6.0 if s.terminated[i] else 10.0
        for s in steps
        for i in np.flatnonzero(s.terminated | s.truncated)
    ]
    assert out.final_return == pytest.approx(np.mean(returns[-100:]))


def _fake_replay_algo(seen):
    """A replay algorithm that learns nothing and records the sampled transitions."""

    def init(key):
        return init_state({"w": jnp.zeros(())}, optax.sgd(0.0), key)

    def act(params, obs, key, env_steps):
        a = jax.random.randint(key, obs.shape[:1], 0, 2)
        return ActOutput(a, jnp.zeros(obs.shape[:1]), jnp.zeros(obs.shape[:1]))

    def update(state, batch):
        jax.debug.callback(lambda b: seen.append(b), batch, ordered=True)
        return state._replace(version=state.version + 1), {"loss": jnp.mean(batch.reward)}

    zeros = lambda params, obs: jnp.zeros(obs.shape[:1])  # noqa: E731
    return Algorithm(
        "fake",
        "replay",
        init,
        act,
        zeros,
        lambda p, o: jnp.zeros(o.shape[:1], jnp.int32),
        update,
        None,
        None,
    )


def test_replay_transitions_carry_the_final_obs(tmp_path):
    B, T = 4, 4
    config = load_config(
        GYM_CFG,
        [
            IN_PROCESS,
            "algo=dqn",
            "env=TianjaxTestTicker-v0",
            f"num_envs={B}",
            f"rollout_len={T}",
            f"total_env_steps={4 * B * T}",
            "dqn.buffer_size=64",
            "dqn.batch_size=16",
            f"dqn.learning_starts={2 * B * T}",
            "dqn.updates_per_rollout=2",
            "log_every=1",
        ],
    )
    seen = []
    out = _run(config, tmp_path, algo=_fake_replay_algo(seen))
    # updates start once learning_starts env steps are in: after rollouts 2, 3 and 4
    assert out.updates == 6 and len(seen) == 6
    for b in seen:
        # next_obs is the true next obs (the final one where an episode ended), never a reset
        np.testing.assert_array_equal(b.next_obs[:, 0], b.obs[:, 0] + 1)
        np.testing.assert_array_equal(b.terminated, (b.next_obs[:, 0] == 3) & (b.obs[:, 1] == 1))
        np.testing.assert_array_equal(b.reward, b.next_obs[:, 0])
    assert all(b.terminated.any() for b in seen[-2:])
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        assert len(f.read().splitlines()) == 4  # one record per rollout with log_every=1


def test_several_actors_are_refused(tmp_path):
    config = load_config(ENVPOOL_CFG, ["num_actors=2"])
    with pytest.raises(ConfigError, match="config key 'num_actors'"):
        _run(config, tmp_path)


def test_unknown_env_is_a_config_error(tmp_path):
    config = load_config(ENVPOOL_CFG, [IN_PROCESS, "env=NoSuchEnv-v0"])
    with pytest.raises(ConfigError, match="config key 'env'"):
        _run(config, tmp_path)


def test_gymnasium_short_run_writes_the_run_dir(tmp_path):
    run_dir = str(tmp_path / "r")
    res = tianjax.train(
        GYM_CFG,
        [IN_PROCESS, "total_env_steps=2048", "log_every=1"],
        verbose=False,
        progress=False,
        run_dir=run_dir,
    )
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    assert summary["env_backend"] == "gymnasium" and summary["mode"] == "sync"
    assert (
        summary["env_steps"] == 2048 and summary["updates"] == 2 and summary["skipped_updates"] == 0
    )
    assert summary["compile_time_s"] > 0 and summary["env_steps_per_s"] > 0
    assert summary["episodes"] > 0 and summary["final_return"] > 0
    assert {"act_time_s", "update_time_s"} <= set(summary)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    assert [r["env_steps"] for r in records] == [1024, 2048]
    # the result holds the same records as columns, keyed like them
    assert set(res.metrics) == set().union(*records)
    assert res.metrics["env_steps"].tolist() == [1024, 2048]
    assert np.allclose(res.metrics["loss"], [r["loss"] for r in records])
    assert {
        "updates",
        "wall_time_s",
        "env_steps_per_s",
        "return_mean_100",
        "episodes",
        "loss",
        "approx_kl",
    } <= set(records[-1])
    assert jax.tree.leaves(res.params)


@pytest.mark.slow
def test_async_mode_runs_the_same_loop_with_staleness_correction(tmp_path):
    config = load_config(ENVPOOL_CFG, ["mode=async", "num_actors=1", "total_env_steps=2048"])
    out = _run(config, tmp_path)
    assert out.updates == 2 and out.env_steps == 2048 and out.skipped_updates == 0
