"""Frame-once replay: a hand-built [T=3, B=2] chunk with a termination and a truncation
(next_obs from the frames where the episode goes on, mask 0 exactly at the truncation),
wrap-around over the oldest block, the bytes saved on Atari frames, the cut read off a
real rollout, fused DQN with it equal to the two-copy buffer, and a resume of it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tianjax.config import ConfigError, load_config
from tianjax.core.replay import frames as frame_replay
from tianjax.core.replay import ring as buffers
from tianjax.core.types import Transition

JIT = [False, True]
T, B = 3, 2


def _maybe_jit(fn, jit, **kw):
    return jax.jit(fn, **kw) if jit else fn


def _obs(v):
    """A 2-element observation that encodes the value v (v and -v)."""
    return [float(v), -float(v)]


def _hand_chunk(offset=0.0, version=0):
    """[T=3, B=2] transitions, obs values chosen so that every frame is recognisable.

    env 0: steps 0 -> 1 -> 2, terminated at t=1 (final obs 12), reset to 20 at t=2
    env 1: truncated at t=0 (final obs 51), reset to 60, then 60 -> 61 -> 62
    Observation values are offset by `offset` (to tell chunks apart).
    """
    o = offset
    obs = [[_obs(o + 10), _obs(o + 50)], [_obs(o + 11), _obs(o + 60)], [_obs(o + 20), _obs(o + 61)]]
    nxt = [
        [_obs(o + 11), _obs(o + 51)],  # env 1: final obs of the truncated episode
        [_obs(o + 12), _obs(o + 61)],  # env 0: final obs of the terminated episode
        [_obs(o + 21), _obs(o + 62)],
    ]
    term = [[False, False], [True, False], [False, False]]
    action = [[0, 1], [1, 0], [1, 1]]
    reward = [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    return Transition(
        obs=jnp.asarray(obs, jnp.float32),
        action=jnp.asarray(action, jnp.int32),
        reward=jnp.asarray(reward, jnp.float32) + offset,
        next_obs=jnp.asarray(nxt, jnp.float32),
        terminated=jnp.asarray(term),
        version=jnp.full((T, B), version, jnp.int32),
    )


def _all(state):
    """Every stored transition and its mask, in flat index order."""
    n = int(state.size) * T * B
    trans, mask = frame_replay.gather(state, jnp.arange(n))
    return jax.tree.map(np.asarray, trans), np.asarray(mask)


@pytest.mark.parametrize("jit", JIT)
def test_hand_chunk_frames_next_obs_and_mask(jit):
    rb = frame_replay.init(T * B, _hand_chunk())
    assert rb.frames.shape == (1, T + 1, B, 2) and rb.reward.shape == (1, T, B)
    rb = _maybe_jit(frame_replay.add, jit)(rb, _hand_chunk(version=7))
    assert int(rb.size) == 1 and int(rb.insert_pos) == 0
    # T + 1 frames per env: obs_0 .. obs_2, then the chunk's last next_obs
    np.testing.assert_array_equal(np.asarray(rb.frames)[0, :, 0, 0], [10, 11, 20, 21])
    np.testing.assert_array_equal(np.asarray(rb.frames)[0, :, 1, 0], [50, 60, 61, 62])
    # the cut: only env 1's truncation at t=0 (env 0's termination needs no next obs)
    np.testing.assert_array_equal(
        np.asarray(rb.cut)[0], [[False, True], [False, False], [False, False]]
    )

    trans, mask = _all(rb)  # flat index (t * B + b)
    chunk = jax.tree.map(
        lambda x: np.asarray(x).reshape((T * B,) + x.shape[2:]), _hand_chunk(version=7)
    )
    np.testing.assert_array_equal(trans.obs, chunk.obs)
    np.testing.assert_array_equal(trans.action, chunk.action)
    np.testing.assert_array_equal(trans.reward, chunk.reward)
    np.testing.assert_array_equal(trans.terminated, chunk.terminated)
    np.testing.assert_array_equal(trans.version, np.full(6, 7))
    np.testing.assert_array_equal(mask, [1, 0, 1, 1, 1, 1])  # 0 exactly at the truncated step
    goes_on = ~chunk.terminated & (mask == 1)
    np.testing.assert_array_equal(goes_on, [True, False, False, True, True, True])
    # where the episode goes on, next_obs is the true successor
    np.testing.assert_array_equal(trans.next_obs[goes_on], chunk.next_obs[goes_on])
    # and where it ended, frame t + 1 is the next episode's first obs (never bootstrapped)
    np.testing.assert_array_equal(trans.next_obs[[1, 2], 0], [60, 20])


def test_truncation_at_the_last_step_keeps_its_final_obs():
    """At t = T - 1 the stored last frame is the final obs itself: exact, mask 1."""
    chunk = _hand_chunk()
    # env 1 is truncated at t=2 as well: its next_obs (final obs 99) differs from any reset
    chunk = chunk._replace(next_obs=chunk.next_obs.at[2, 1].set(jnp.asarray(_obs(99))))
    rb = frame_replay.add(frame_replay.init(T * B, chunk), chunk)
    trans, mask = _all(rb)
    assert mask[2 * B + 1] == 1.0
    np.testing.assert_array_equal(trans.next_obs[2 * B + 1], _obs(99))


@pytest.mark.parametrize("jit", JIT)
def test_wrap_around_overwrites_the_oldest_block(jit):
    add = _maybe_jit(frame_replay.add, jit)
    # 2 blocks of 6 transitions (the 13th transition of capacity does not fit a block)
    rb = frame_replay.init(2 * T * B + 1, _hand_chunk())
    assert frame_replay.capacity(rb) == 12
    rb = add(rb, _hand_chunk(offset=100, version=1))
    rb = add(rb, _hand_chunk(offset=200, version=2))
    assert int(rb.size) == 2 and int(rb.insert_pos) == 0
    rb = add(rb, _hand_chunk(offset=300, version=3))  # overwrites block 0 (offset 100)
    assert int(rb.size) == 2 and int(rb.insert_pos) == 1
    np.testing.assert_array_equal(np.asarray(rb.frames)[:, 0, 0, 0], [310, 210])
    np.testing.assert_array_equal(np.asarray(rb.version)[:, 0, 0], [3, 2])
    np.testing.assert_array_equal(np.asarray(rb.reward)[:, 0, 0], [301, 201])
    trans, mask = _all(rb)
    assert not np.any((trans.obs[:, 0] >= 100) & (trans.obs[:, 0] < 200))  # the oldest is gone
    np.testing.assert_array_equal(mask, [1, 0, 1, 1, 1, 1] * 2)


@pytest.mark.parametrize("jit", JIT)
def test_sample_draws_stored_transitions_with_their_masks(jit):
    sample = _maybe_jit(frame_replay.sample, jit, static_argnums=2)
    rb = frame_replay.init(4 * T * B, _hand_chunk())  # 4 blocks, 1 filled
    rb = frame_replay.add(rb, _hand_chunk(version=5))
    trans, mask = sample(rb, jax.random.key(0), 600)
    assert trans.obs.shape == (600, 2) and mask.shape == (600,) and mask.dtype == jnp.float32
    chunk = jax.tree.map(lambda x: np.asarray(x).reshape((T * B,) + x.shape[2:]), _hand_chunk())
    row = {float(v): i for i, v in enumerate(chunk.obs[:, 0])}
    rows = np.array([row[float(v)] for v in np.asarray(trans.obs)[:, 0]])  # only filled blocks
    assert set(rows.tolist()) == set(range(T * B))  # all six drawn
    np.testing.assert_array_equal(np.asarray(mask), np.where(rows == 1, 0.0, 1.0))
    np.testing.assert_array_equal(np.asarray(trans.reward), chunk.reward[rows])
    np.testing.assert_array_equal(np.asarray(trans.version), np.full(600, 5))


def test_capacity_below_one_block_is_rejected():
    with pytest.raises(ValueError, match=r"capacity of 5 transitions holds no \[T, B\] = \[3, 2\]"):
        frame_replay.init(5, _hand_chunk())
    with pytest.raises(ValueError, match="chunk of"):  # a chunk of another shape
        rb = frame_replay.init(12, _hand_chunk())
        frame_replay.add(rb, jax.tree.map(lambda x: x[:2], _hand_chunk()))


def test_atari_frame_bytes_are_t_plus_1_over_2t_of_two_copies():
    """[4, 84, 84] uint8 frames, T = 32, B = 8: (T + 1) / (2 T) of the frame bytes of the
    buffer that keeps obs and next_obs, and within 0.1% of that in total."""
    T_, B_, blocks = 32, 8, 4
    obs = jax.ShapeDtypeStruct((T_, B_, 4, 84, 84), jnp.uint8)
    s = jax.ShapeDtypeStruct((T_, B_), jnp.float32)
    chunk = Transition(
        obs=obs,
        action=jax.ShapeDtypeStruct((T_, B_), jnp.int32),
        reward=s,
        next_obs=obs,
        terminated=jax.ShapeDtypeStruct((T_, B_), jnp.bool_),
        version=jax.ShapeDtypeStruct((T_, B_), jnp.int32),
    )
    cap = blocks * T_ * B_
    once = jax.eval_shape(lambda: frame_replay.init(cap, chunk))
    one = jax.tree.map(lambda x: np.zeros(x.shape[2:], x.dtype), chunk)  # one transition
    twice = jax.eval_shape(lambda: buffers.replay_init(cap, one))
    frame = 4 * 84 * 84
    assert frame_replay.nbytes(once.frames) == blocks * (T_ + 1) * B_ * frame
    two_copy_frames = frame_replay.nbytes((twice.data.obs, twice.data.next_obs))
    assert two_copy_frames == 2 * cap * frame
    assert frame_replay.nbytes(once.frames) / two_copy_frames == (T_ + 1) / (2 * T_)
    total = frame_replay.nbytes(once) / frame_replay.nbytes(twice)
    assert abs(total - (T_ + 1) / (2 * T_)) < 1e-3, total


# ------------------------------------------------------------------ with a real rollout


def _short_cartpole(max_steps):
    import gymnax

    from tianjax.envs.gymnax_env import make_gymnax

    _, params = gymnax.make("CartPole-v1")
    return make_gymnax("CartPole-v1", params.replace(max_steps_in_episode=max_steps))


def test_cut_is_read_off_a_real_rollout():
    """CartPole truncated at 12 steps, T = 32: the mask is 0 exactly where an episode was
    truncated (done, not terminated) before the chunk's last step; elsewhere the stored
    next_obs is the rollout's own (terminations aside)."""
    from tianjax.algos import make_algorithm
    from tianjax.core.rollout import make_rollout

    T_, B_ = 32, 8
    config = load_config(
        {
            "algo": "dqn",
            "num_envs": B_,
            "rollout_len": T_,
            "network": {"hidden": [8]},
            "dqn": {"buffer_size": 4 * T_ * B_, "batch_size": 8},
        }
    )
    env = _short_cartpole(12)
    algo = make_algorithm(config, env.obs_shape, env.action_spec, correct_staleness=False)
    rollout_init, rollout = make_rollout(env, algo, B_, T_)
    learner = algo.init(jax.random.key(0))
    _, trans, episodes = jax.jit(rollout)(
        learner.params, learner.version, rollout_init(jax.random.key(1))
    )
    truncated = np.asarray(episodes.done) & ~np.asarray(trans.terminated)
    assert truncated[:-1].any() and np.asarray(trans.terminated).any()  # both kinds occur

    rb = frame_replay.add(frame_replay.init(4 * T_ * B_, trans), trans)
    got, mask = frame_replay.gather(rb, jnp.arange(T_ * B_))
    expect_cut = truncated.copy()
    expect_cut[-1] = False
    np.testing.assert_array_equal(
        np.asarray(mask).reshape(T_, B_), (~expect_cut).astype(np.float32)
    )
    keep = ~np.asarray(trans.terminated).reshape(-1) & (np.asarray(mask) == 1)
    np.testing.assert_array_equal(
        np.asarray(got.next_obs)[keep], np.asarray(trans.next_obs).reshape(T_ * B_, -1)[keep]
    )
    np.testing.assert_array_equal(np.asarray(got.obs), np.asarray(trans.obs).reshape(T_ * B_, -1))


def _fused_config(**dqn):
    return load_config(
        {
            "algo": "dqn",
            "total_env_steps": 4000,
            "num_envs": 4,
            "rollout_len": 8,
            "network": {"hidden": [16]},
            "dqn": dict(
                {
                    "batch_size": 16,
                    "buffer_size": 96,
                    "learning_starts": 64,
                    "updates_per_rollout": 2,
                    "target_update_every": 4,
                },
                **dqn,
            ),
        }
    )


def test_fused_dqn_equals_the_two_copy_buffer_without_cuts():
    """Without truncations inside a chunk the two buffers hold the same transitions at the
    same flat indices and draw the same samples: fused DQN is bit for bit the same, also
    after the ring wrapped (96 transitions, 3 blocks; 10 rollouts of 32)."""
    from tianjax.algos import make_algorithm
    from tianjax.core.fused_loop import make_fused
    from tianjax.envs.gymnax_env import make_gymnax

    env = make_gymnax("CartPole-v1")
    out = {}
    for once in (False, True):
        config = _fused_config(frame_once=once)
        algo = make_algorithm(config, env.obs_shape, env.action_spec, correct_staleness=False)
        init, run = make_fused(config, env, algo)
        state = jax.jit(init)(jax.random.key(0))
        state, (metrics, episodes) = jax.jit(run, static_argnums=1)(state, 10)
        out[once] = state, metrics, episodes
    (s2, m2, e2), (s1, m1, e1) = out[False], out[True]
    assert isinstance(s1.replay, frame_replay.FrameReplayState)
    assert int(s1.replay.size) == 3 and int(s1.replay.insert_pos) == 10 % 3
    assert not np.asarray(s1.replay.cut).any()  # CartPole's 500-step limit is not reached
    np.testing.assert_array_equal(np.asarray(m1["mask_mean"])[1:], 1.0)  # learning from iteration 1
    assert int(s1.learner.version) == int(s2.learner.version) == 9 * 2
    for a, b in zip(jax.tree.leaves(s1.learner.params), jax.tree.leaves(s2.learner.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(m1["loss"]), np.asarray(m2["loss"]))
    np.testing.assert_array_equal(np.asarray(e1.returns), np.asarray(e2.returns))  # same acting


def test_fused_dqn_masks_truncated_samples():
    """CartPole cut at 5 steps inside chunks of 8: the masked fraction of the samples is
    about the buffer's share of cut transitions, and training stays finite."""
    from tianjax.algos import make_algorithm
    from tianjax.core.fused_loop import make_fused

    env = _short_cartpole(5)
    config = _fused_config(frame_once=True)
    algo = make_algorithm(config, env.obs_shape, env.action_spec, correct_staleness=False)
    init, run = make_fused(config, env, algo)
    state = jax.jit(init)(jax.random.key(0))
    state, (metrics, _) = jax.jit(run, static_argnums=1)(state, 10)
    cut_share = float(np.mean(np.asarray(state.replay.cut)))
    assert cut_share > 0.05
    mask_mean = np.asarray(metrics["mask_mean"])[1:]  # learning from iteration 1 on
    assert np.all(mask_mean < 1.0) and abs(float(np.mean(mask_mean)) - (1 - cut_share)) < 0.1
    assert np.all(np.isfinite(np.asarray(metrics["loss"])))


@pytest.mark.slow
def test_fused_frame_once_resume_equals_uninterrupted_run(tmp_path):
    """The frame-once buffer is part of the fused checkpoint: a run stopped and resumed ends
    with the parameters of an uninterrupted one (a flat epsilon: its decay follows the
    budget, which differs between the two parts)."""
    import tianjax

    def train(run_dir, steps, *extra):
        over = [
            "dqn.frame_once=true",
            "eval.episodes=0",
            "log_every=5",
            "dqn.learning_starts=200",
            "dqn.buffer_size=400",
            "network.hidden=[16]",
            "dqn.eps_start=0.1",
            "dqn.eps_end=0.1",
            f"total_env_steps={steps}",
            *extra,
        ]
        kw = {"run_dir": str(run_dir)} if run_dir is not None else {}
        return tianjax.train("configs/dqn_cartpole.yaml", over, progress=False, verbose=False, **kw)

    first = train(tmp_path / "a", 400)  # 10 iterations of 40 env steps
    resumed = train(None, 800, f"resume={tmp_path / 'a'}")
    whole = train(tmp_path / "b", 800)
    assert first.summary["updates"] > 0
    assert resumed.summary["resumed_from_step"] == 10 * 4  # iterations x updates_per_rollout
    assert resumed.summary["updates"] == whole.summary["updates"]
    for a, b in zip(jax.tree.leaves(resumed.params), jax.tree.leaves(whole.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ------------------------------------------------------------------ config


def test_config_rejects_frame_once_where_it_is_not_served():
    # (dqn.frame_once under another algo is an unread key of dqn's own section, as dqn.lr
    # is: no algorithm borrows another's section any more)
    with pytest.raises(
        ConfigError, match=r"^config key 'dqn.frame_once': is served by mode: fused and by actor"
    ):
        load_config("configs/dqn_pong.yaml", ["dqn.frame_once=true", "mode=sync", "num_actors=0"])
    assert load_config("configs/dqn_pong.yaml").dqn.frame_once  # async, with actors
    assert load_config("configs/dqn_cartpole.yaml", ["dqn.frame_once=true"]).dqn.frame_once
    assert not load_config("configs/dqn_cartpole.yaml").dqn.frame_once
