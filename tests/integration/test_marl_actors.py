"""QMIX and MADDPG with actors (modes sync and async), as single-agent replay runs are.

A learner in this process and 2 actors in threads, over real sockets (the in-process
pattern of test_budgets.py), on tiny configs:

- a run ends at its budget (env steps admitted within one trajectory per actor of
  total_env_steps), what the actors sent is what was admitted, and the learner held the
  replay ratio of the algorithm's own replay section (maddpg.* / qmix.*, not dqn.*);
- every replayed sample carries its behaviour version: its staleness is finite and >= 0,
  in the buffer and in every sampled batch, and the summary's histogram counts them all;
- QMIX actors carry the agents' GRU state from one trajectory to the next: the state
  stored with a trajectory's first step is the one the previous trajectory of the same
  actor ended with (unrolled again here from its own stored state, observations and
  parameters), zeros where an episode began;
- the learner's checkpoint holds the sequence replay buffer and a resumed learner gets it
  back; sequences are learned with burn-in from their stored state.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tianjax.algos.qmix import loss as Q
from tianjax.config import ConfigError, load_config
from tianjax.core.types import MAObs, Sequences
from tianjax.runtime.learner.learner import Learner
from tianjax.transport.auth import new_run_key

from .conftest import REPO, run_in_process

MADDPG = str(REPO / "configs" / "maddpg_mpe_spread_async.yaml")
QMIX = str(REPO / "configs" / "qmix_smax_3m_async.yaml")
TOTAL = 3000  # not a multiple of a round (2 actors x 64 env steps)
COMMON = [
    f"total_env_steps={TOTAL}",
    "num_actors=2",
    "log_every=10",
    "compile_cache=null",
    "eval.episodes=0",
    "runtime.heartbeat_timeout_s=60",
]
TINY = {
    # 64 transitions per trajectory, 1 gradient step of 64 per trajectory: replay ratio 1
    "maddpg": (
        MADDPG,
        [
            "num_envs=4",
            "rollout_len=16",
            "maddpg.batch_size=64",
            "maddpg.buffer_size=5000",
            "maddpg.learning_starts=0",
            "maddpg.updates_per_rollout=1",
            "network.hidden=[32,32]",
        ],
    ),
    # QMIX on MPE's discrete simple_spread (it compiles in a fraction of SMAX's time; the
    # runtime is the same): 4 sequences of 8 steps per trajectory, 1 gradient step of 8
    # sequences (64 samples) per trajectory: replay ratio 2; burn-in 2 of the 8 steps
    "qmix": (
        QMIX,
        [
            "env=MPE_simple_spread_v3",
            "target_win_rate=null",
            "num_envs=4",
            "rollout_len=8",
            "qmix.batch_size=8",
            "qmix.buffer_size=500",
            "qmix.learning_starts=0",
            "qmix.updates_per_rollout=1",
            "qmix.burn_in=2",
            "qmix.hidden_dim=16",
            "qmix.mixer_embed=8",
            "qmix.hyper_hidden=16",
        ],
    ),
}


class RecordingSource:
    """An actor's own rollout source, recording each rollout's parameters and batch."""

    def __init__(self, source):
        self.source, self.calls = source, []

    def __call__(self, params, version, env_steps):
        rollout = self.source(params, version, env_steps)
        self.calls.append((params, int(version), rollout.batch))
        return rollout

    def __getattr__(self, name):
        return getattr(self.source, name)


def _run(config):
    """Learner here, actors in threads; returns (learner, result, sampled, sources), where
    sampled lists (learner version, behaviour versions) of every replayed batch."""
    sampled, sources = [], []

    def record_batches(learner):
        replay_batch = learner.batches.next

        def recording_batch(*args, **kwargs):
            got = replay_batch(*args, **kwargs)
            if got is not None:
                sampled.append((learner.state_version, np.array(got[1])))
            return got

        learner.batches.next = recording_batch

    def record_rollouts(actor):
        actor.source = RecordingSource(actor.source)
        sources.append(actor.source)

    learner, out = run_in_process(
        config,
        instrument=record_rollouts,
        prepare=record_batches,
        learner_kwargs={"checkpoint_root": config.run_dir},
    )
    return learner, out, sampled, sources


_RUNS: dict = {}


@pytest.fixture(scope="module")
def run_of(tmp_path_factory):
    """One run per (algo, mode), shared by the tests below."""

    def get(algo, mode):
        if (algo, mode) not in _RUNS:
            path, overrides = TINY[algo]
            run_dir = tmp_path_factory.mktemp(f"{algo}-{mode}")
            config = load_config(
                path,
                [*COMMON, *overrides, f"mode={mode}", "checkpoint.replay=true"],
                run_dir=str(run_dir),
            )
            _RUNS[algo, mode] = (config, str(run_dir), *_run(config))
        return _RUNS[algo, mode]

    yield get
    _RUNS.clear()


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("algo", ["maddpg", "qmix"])
def test_replay_run_with_two_actors_ends_at_the_budget_holding_its_replay_ratio(run_of, algo, mode):
    config, _, learner, out, sampled, _ = run_of(algo, mode)
    s = out.extra_summary
    per_actor = config.num_envs * config.rollout_len
    assert TOTAL - config.num_actors * per_actor <= out.env_steps <= TOTAL, out.env_steps
    assert out.skipped_updates == 0 and s["rejected_messages"] == 0
    # the actors stopped at the budget: what they sent is what was admitted (or dropped)
    assert s["trajectories_received"] * per_actor == out.env_steps + s["dropped_samples"], s
    # the algorithm's own replay section sized the buffer and the batches, not dqn.*
    rc = config.replay_config
    assert rc is getattr(config, algo) and rc.batch_size != config.dqn.batch_size
    item = config.rollout_len if algo == "qmix" else 1
    assert jax.tree.leaves(learner.replay.rb.data)[0].shape[0] == rc.buffer_size
    assert learner.replay.batch_samples == rc.batch_size * item
    expected_ratio = rc.updates_per_rollout * rc.batch_size * item / per_actor
    assert s["replay_ratio_target"] == pytest.approx(expected_ratio)
    assert abs(s["replay_ratio"] / s["replay_ratio_target"] - 1) <= 0.1, s
    assert len(sampled) == out.updates > 0
    assert learner.replay.learned == out.updates * rc.batch_size * item


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("algo", ["maddpg", "qmix"])
def test_every_replayed_sample_keeps_its_behaviour_version(run_of, algo, mode):
    config, _, learner, out, sampled, _ = run_of(algo, mode)
    shape = (config.replay_config.batch_size,) + ((config.rollout_len,) if algo == "qmix" else ())
    for version, behaviour in sampled:
        assert behaviour.shape == shape
        tau = version - behaviour.astype(np.float64)
        assert np.isfinite(tau).all() and (tau >= 0).all(), (version, behaviour)
    # in the buffer: every filled slot's version is one the learner had reached
    size = int(learner.replay.rb.size)
    stored = np.asarray(learner.replay.rb.data.version)[:size]
    assert size > 0 and stored.min() >= 0 and stored.max() <= out.updates
    if algo == "qmix":  # a sequence is one rollout, acted with one version
        assert (stored == stored[:, :1]).all()
    hist = out.extra_summary["staleness_histogram"]
    assert min(hist) >= 0 and sum(hist.values()) == learner.replay.learned
    # the last update learned at the version before it
    assert max(v for v, _ in sampled) == out.updates - 1


def final_hidden_fn(agent):
    """final(params, seq_batch) -> the GRU state after a [B, T] sequence batch, unrolled
    from its stored carry (jitted once: every batch has one shape)."""
    fn = jax.jit(lambda params, seq: Q._final_hidden(agent, params.agent, Q.time_major(seq)))
    return lambda params, seq: np.asarray(fn(params, seq))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_qmix_actors_carry_the_hidden_state_across_their_trajectories(run_of, mode):
    config, _, learner, _, _, sources = run_of("qmix", mode)
    final_hidden = final_hidden_fn(learner.algo.network[0])
    carried = reset = 0
    for source in sources:
        calls = source.calls
        assert len(calls) >= 14  # MPE episodes are 26 steps: one ends on a boundary at 104
        np.testing.assert_array_equal(calls[0][2].carry, 0.0)  # the first trajectory starts fresh
        for (params, _, prev), (_, _, cur) in zip(calls, calls[1:]):
            expected = final_hidden(params, prev)
            np.testing.assert_allclose(cur.carry, expected, rtol=1e-5, atol=1e-5)
            ended = prev.done[:, -1]  # an episode ended on the boundary: a fresh state
            np.testing.assert_array_equal(cur.carry[ended], 0.0)
            reset += int(ended.sum())
            carried += int((np.abs(cur.carry[~ended]).max(axis=(1, 2)) > 0).sum())
        # the source still holds where its next rollout would start
        np.testing.assert_allclose(
            np.asarray(source.carry), final_hidden(calls[-1][0], calls[-1][2]), rtol=1e-5, atol=1e-5
        )
    assert carried > 0 and reset > 0


def test_a_resumed_learner_gets_the_sequence_replay_buffer_back(run_of, tmp_path):
    config, run_dir, learner, out, _, _ = run_of("qmix", "async")
    resumed = Learner(
        load_config(config, [f"resume={run_dir}"], run_dir=str(tmp_path / "resumed")), new_run_key()
    )
    try:
        assert resumed.state_version == out.updates and resumed.env_steps == out.env_steps
        assert (
            resumed.replay.added == learner.replay.added
            and resumed.replay.learned == learner.replay.learned
        )
        jax.tree.map(
            np.testing.assert_array_equal,
            jax.device_get(resumed.replay.rb),
            jax.device_get(learner.replay.rb),
        )
    finally:
        resumed.close()


def test_burn_in_warms_the_stored_hidden_state_of_every_sequence():
    """Burn-in unrolls each sequence's own stored carry (B sequences, B != burn_in): the loss
    equals the loss without burn-in on the rest, started from the warmed state."""
    n, d, a, h, s, T, B, k = 3, 5, 4, 8, 7, 6, 3, 2
    agent, mixer = Q.AgentRNN(h, a), Q.Mixer(8, 16)

    @jax.jit  # one program (op by op, the inits and scans compile dozens of small ones)
    def losses(key):
        keys = jax.random.split(key, 8)
        params = Q.QMIXParams(
            agent.init(keys[0], jnp.zeros((1, n, h)), jnp.zeros((1, n, d + n))),
            mixer.init(keys[1], jnp.zeros((1, n)), jnp.zeros((1, s))),
        )
        obs = MAObs(
            jax.random.normal(keys[2], (T + 1, B, n, d)),
            jax.random.normal(keys[3], (T + 1, B, s)),
            jnp.ones((T + 1, B, n, a), bool),
        )
        seq = Sequences(
            jax.tree.map(lambda x: x[:-1], obs),
            jax.random.randint(keys[4], (T, B, n), 0, a),
            jax.random.normal(keys[5], (T, B)),
            jax.tree.map(lambda x: x[1:], obs),
            jnp.zeros((T, B), bool),
            jnp.zeros((T, B), bool),
            jax.random.normal(keys[6], (B, n, h)),
            jnp.zeros((T, B), jnp.int32),
        )
        w = jnp.ones((T, B))
        burn_in_loss = Q.make_loss(agent, mixer, gamma=0.9, burn_in=k)
        warmed = Q._final_hidden(agent, params.agent, Q.time_slice(seq, slice(None, k)))
        rest = Q.time_slice(seq, slice(k, None))._replace(carry=warmed)
        plain = Q.make_loss(agent, mixer, gamma=0.9, burn_in=0)(params, params, rest, w[k:])[0]
        other = seq._replace(carry=jnp.zeros_like(seq.carry))
        return (
            burn_in_loss(params, params, seq, w)[0],
            plain,
            burn_in_loss(params, params, other, w)[0],
        )

    with_burn_in, plain, from_zeros = (float(x) for x in losses(jax.random.key(0)))
    assert with_burn_in == pytest.approx(plain, rel=1e-5)
    # and the stored state matters: another carry, another loss
    assert abs(from_zeros - with_burn_in) > 1e-6


@pytest.mark.parametrize("algo", ["maddpg", "qmix"])
def test_modes_with_actors_are_accepted_and_sync_needs_learning_in_the_first_round(algo):
    path, _ = TINY[algo]
    for mode in ("sync", "async"):
        c = load_config(path, [f"mode={mode}", f"{algo}.learning_starts=0"])
        assert c.mode == mode and c.replay_config is getattr(c, algo)
    # the shipped async configs hold the fused configs' replay ratio (8)
    assert load_config(path).replay_ratio == pytest.approx(8.0)
    # a sync actor waits for the next version: a first round that owes no update would hang
    with pytest.raises(ConfigError, match=rf"config key '{algo}.learning_starts'"):
        load_config(path, ["mode=sync"])
    with pytest.raises(ConfigError, match="config key 'runtime.replay_ratio'"):
        load_config(path, ["mode=sync", f"{algo}.learning_starts=0", "runtime.replay_ratio=0.01"])
    # acting inside the learner is for host envs
    with pytest.raises(ConfigError, match="config key 'num_actors'"):
        load_config(path, ["mode=sync", "num_actors=0", f"{algo}.learning_starts=0"])
