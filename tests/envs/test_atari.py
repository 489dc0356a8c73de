"""Atari through envpool: frames stay uint8 from the env, through the actor's batch and the
wire, to the learner's decoded batch; the Nature torso takes them."""

import jax
import numpy as np
import pytest
import zmq

from tianjax.algos import make_algorithm
from tianjax.config import ConfigError, load_config
from tianjax.envs.factory import env_spec
from tianjax.networks import resolve_torso
from tianjax.runtime.actor.sources import batch_template, make_source
from tianjax.transport.auth import RunKey
from tianjax.transport.channels import TrajectoryReceiver, TrajectorySender

KEY = RunKey(bytes(range(32)))
T, B = 4, 2
SEED = 3


def test_pong_frames_are_uint8_from_env_to_learner():
    config = load_config("configs/ppo_pong_async.yaml", [f"num_envs={B}", f"rollout_len={T}"])
    source = make_source(config, seed=0)
    try:
        assert source.obs_dtype == np.uint8
        params = jax.jit(source.algo.init)(jax.random.key(0)).params
        assert params["params"]["Torso_0"]["NatureCNN_0"]["Conv_0"]["kernel"].shape == (8, 8, 4, 32)
        rollout = source(params, 0, 0)
    finally:
        source.close()
    obs = rollout.batch.obs
    assert obs.dtype == np.uint8 and obs.shape == (T, B, 4, 84, 84) and obs.max() > 0
    assert rollout.batch.last_obs.dtype == np.uint8

    template = batch_template(config, source.algo, (4, 84, 84), np.uint8)
    ctx = zmq.Context()
    try:
        with (
            TrajectoryReceiver(KEY, template, ctx=ctx) as rx,
            TrajectorySender(KEY, rx.endpoint, sender="actor-0", to=rx.address, ctx=ctx) as tx,
        ):
            assert tx.send(
                (rollout.batch, rollout.episodes, np.asarray(0, np.int64)), 0, timeout_ms=5000
            )
            msg = rx.recv(timeout_ms=10_000)
    finally:
        ctx.term()
    assert msg is not None and rx.accepted == 1
    got = msg.tree[0]
    assert got.obs.dtype == np.uint8 and got.obs.nbytes == T * B * 4 * 84 * 84  # one byte a pixel
    np.testing.assert_array_equal(got.obs, obs)


def test_env_options_reach_envpool_and_bad_ones_name_the_key():
    with pytest.raises(
        ConfigError,
        match="config key 'env_options.no_such_option': 'Pong-v5' takes no option 'no_such_option'",
    ):
        make_source(
            load_config(
                "configs/ppo_pong_async.yaml",
                ["num_envs=1", "rollout_len=4", "env_options.no_such_option=1"],
            ),
            seed=0,
        )
    with pytest.raises(ConfigError, match="config key 'env_options': is for host envs"):
        load_config("configs/ppo_cartpole.yaml", ["env_options.max_steps_in_episode=10"])
    with pytest.raises(ConfigError, match="config key 'env_options.stack_num': must be a number"):
        load_config("configs/ppo_pong_async.yaml", ["env_options.stack_num={a: 1}"])


# ----------------------------------------------------------------------------- configs

ATARI_CONFIGS = {
    "configs/ppo_pong_async.yaml": ("ppo", "Pong-v5"),
    "configs/ppo_breakout_async.yaml": ("ppo", "Breakout-v5"),
    "configs/dqn_pong.yaml": ("dqn", "Pong-v5"),
    "configs/dqn_breakout.yaml": ("dqn", "Breakout-v5"),
}


@pytest.mark.parametrize("path", sorted(ATARI_CONFIGS))
def test_atari_configs_load_with_the_deepmind_preprocessing(path):
    config = load_config(path)
    algo, env = ATARI_CONFIGS[path]
    assert (config.algo, config.env, config.env_backend) == (algo, env, "envpool")
    assert (config.mode, config.num_actors) == ("async", 2)
    assert config.env_options["episodic_life"] is True and config.env_options["reward_clip"] is True
    if path != "configs/ppo_pong_async.yaml":  # the new ones spell the preprocessing out
        assert {
            k: config.env_options[k]
            for k in (
                "img_height",
                "img_width",
                "gray_scale",
                "stack_num",
                "frame_skip",
                "noop_max",
            )
        } == {
            "img_height": 84,
            "img_width": 84,
            "gray_scale": True,
            "stack_num": 4,
            "frame_skip": 4,
            "noop_max": 30,
        }
    # envpool takes the options: 4 stacked 84x84 grey uint8 frames, and auto would agree
    obs_shape, obs_dtype, action_spec = env_spec(config)
    assert (tuple(obs_shape), np.dtype(obs_dtype)) == ((4, 84, 84), np.uint8)
    assert action_spec.discrete and action_spec.num_actions == {"Pong-v5": 6, "Breakout-v5": 4}[env]
    assert config.network.torso == resolve_torso("auto", obs_shape, obs_dtype) == "nature_cnn"
    template = batch_template(
        config,
        make_algorithm(config, obs_shape, action_spec, obs_dtype=obs_dtype),
        obs_shape,
        obs_dtype,
    )[0]
    assert template.obs.dtype == np.uint8 and template.obs.shape == (
        config.rollout_len,
        config.num_envs,
        4,
        84,
        84,
    )
    if algo == "dqn":
        assert template.next_obs.dtype == np.uint8
        # the replay ratio of the Nature DQN: 8 samples learned per env step
        rc = config.dqn
        assert rc.updates_per_rollout * rc.batch_size / (config.num_envs * config.rollout_len) == 8


# ----------------------------------------------------------------------------- the game score


class _Recorder:
    """Stands between EnvpoolEnv and envpool, recording what envpool itself says each step."""

    def __init__(self, env):
        self._env = env
        self.restarts = 0
        self.steps = []  # per step: (clipped reward, terminated, truncated, info["reward"],
        # info["terminated"], info["lives"]), each [B] in env-id order

    def step(self, actions, env_ids):
        obs, reward, terminated, truncated, info = out = self._env.step(actions, env_ids)
        if len(env_ids) < self._env.config["num_envs"]:  # the end-of-life restart of some envs
            assert np.all(reward == 0) and np.all(info["reward"] == 0) and not terminated.any()
            self.restarts += len(env_ids)
            return out
        assert np.array_equal(info["env_id"], np.arange(len(env_ids)))  # sync mode: in order
        self.steps.append(
            tuple(
                np.array(x)
                for x in (
                    reward,
                    terminated,
                    truncated,
                    info["reward"],
                    info["terminated"],
                    info["lives"],
                )
            )
        )
        return out

    def __getattr__(self, name):
        return getattr(self._env, name)


def _split(values, ends):
    """Per env, the sums of `values` [N, B] between the ends ([N, B] bool), in order."""
    out = []
    for b in range(values.shape[1]):
        sums, acc = [], 0.0
        for v, e in zip(values[:, b], ends[:, b]):
            acc += float(v)
            if e:
                sums.append(acc)
                acc = 0.0
        out.append(sums)
    return out


def test_breakout_reports_the_unclipped_score_of_whole_games():
    """Learning sees clipped rewards and an end at every lost life; the returns reported are
    the sums of envpool's raw info["reward"] from one game over to the next."""
    B, T = 2, 32
    # a tiny MLP policy: this is about the bookkeeping, and random play is what it needs
    config = load_config(
        "configs/ppo_breakout_async.yaml",
        [f"num_envs={B}", f"rollout_len={T}", "network.torso=mlp", "network.hidden=[8]"],
    )
    source = make_source(config, seed=SEED)
    recorder = source.env._env = _Recorder(source.env._env)
    try:
        assert source.obs_dtype == np.uint8
        params = jax.jit(source.algo.init)(jax.random.key(0)).params  # near-uniform: random play
        rollouts = []
        while len(rollouts) < 40 and not all(
            np.any([r.episodes.done[:, b] for r in rollouts]) for b in range(B)
        ):
            rollouts.append(source(params, 0, 0))
    finally:
        source.close()
    batch = rollouts[0].batch
    assert (
        batch.obs.dtype == np.uint8 and batch.obs.shape == (T, B, 4, 84, 84) and batch.obs.max() > 0
    )
    batch_rew, batch_done, ep_done, ep_ret = (
        np.concatenate(x)
        for x in zip(
            *[(r.batch.reward, r.batch.done, r.episodes.done, r.episodes.returns) for r in rollouts]
        )
    )

    clipped, term, trunc, raw, game_end, lives = (np.stack(x) for x in zip(*recorder.steps))
    assert len(clipped) == len(batch_rew)  # every env step is in the batch
    game_over = (term & game_end.astype(bool)) | trunc
    assert game_over[:, 0].any() and game_over[:, 1].any(), "a game did not end within the budget"
    # learning: the clipped reward and an episode end at every lost life
    np.testing.assert_array_equal(batch_rew, clipped)
    np.testing.assert_array_equal(batch_done, term | trunc)
    # a game goes on through its 5 lives (the adapter's reset after a lost life continues it)
    for b in range(B):
        first = lives[: np.flatnonzero(game_over[:, b])[0] + 1, b]
        assert first[0] == 5 and first[-1] == 0 and np.all(np.diff(first) <= 0)
    # reporting: one episode per game, its return the unclipped score of the whole game
    np.testing.assert_array_equal(ep_done, game_over)
    games = _split(raw, game_over)
    assert [[float(x) for x in ep_ret[ep_done[:, b], b]] for b in range(B)] == games
    # ... where the per-life bookkeeping of the clipped reward says less: each game ended as 5
    # learning episodes, and (with this seed) some game scored in more than one of its lives
    spread = False
    for b in range(B):
        life_ret, lives_of_game = 0.0, []
        for t in range(len(raw)):
            life_ret += float(clipped[t, b])
            if term[t, b] or trunc[t, b]:
                lives_of_game.append(life_ret)
                life_ret = 0.0
            if game_over[t, b]:
                assert len(lives_of_game) == 5 or trunc[t, b]
                spread |= games[b][0] > max(lives_of_game)
                games[b].pop(0)
                lives_of_game = []
    assert spread
    assert recorder.restarts == int(np.sum((term | trunc) & ~game_over))  # one per lost life
