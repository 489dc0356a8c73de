"""In-flight parameters (runtime.param_refresh: step): a host source takes a newer version
between two vector steps and stamps every step with the version that acted; the actor's
refresh takes only newer versions of the learner its rollout is for, without waiting; the
config says where it applies."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

from tianjax.config import ConfigError, load_config
from tianjax.core import distributions as D
from tianjax.core.types import ParamsMessage
from tianjax.runtime.actor.actor import Actor
from tianjax.runtime.actor.sources import HostSource, make_source

REPO = Path(__file__).resolve().parents[3]
LATENCY_CFG = str(REPO / "configs" / "ppo_latency_async.yaml")
FAST = [
    "num_envs=3",
    "rollout_len=8",
    "network.hidden=[8]",
    "env_options.step_ms=0.01",
    "env_options.sigma=0",
    "env_options.hiccup_p=0",
]


@pytest.fixture(scope="module")
def source():
    config = load_config(LATENCY_CFG, FAST)
    src = make_source(config, seed=3)
    assert isinstance(src, HostSource)
    yield src
    src.close()


def _params(src, seed):
    return src.algo.init(jax.random.key(seed)).params


def test_every_step_is_stamped_with_the_version_whose_params_chose_its_action(source):
    """Versions 4, 5 and 6 act in one rollout (refreshed before steps 3 and 6): each step's
    stamp is its version, and its stored log mu and value are that version's params', not
    the rollout's first (recomputed here from the network for every step)."""
    by_version = {4: _params(source, 0), 5: _params(source, 1), 6: _params(source, 2)}
    offers = {3: 5, 6: 6}  # before step t: the newest version on the channel
    asked = []

    def refresh():  # a fake parameter channel, never waiting
        t = len(asked) + 1  # asked before steps 1 .. T-1
        asked.append(t)
        v = offers.get(t)
        return None if v is None else (by_version[v], v)

    rollout = source(by_version[4], 4, 0, refresh)
    traj = rollout.batch
    T, B = traj.version.shape
    assert asked == list(range(1, T))  # before every vector step after the first
    want = np.array([4, 4, 4, 5, 5, 5, 6, 6])[:, None].repeat(B, 1)
    np.testing.assert_array_equal(traj.version, want)
    apply = source.algo.network.apply
    for t in range(T):
        for v, params in by_version.items():
            dist, value = apply(params, traj.obs[t])
            logp = np.asarray(D.log_prob(dist, traj.action[t]))
            same = np.allclose(logp, traj.behaviour_log_prob[t], atol=1e-5) and np.allclose(
                np.asarray(value), traj.behaviour_value[t], atol=1e-5
            )
            assert same == (v == want[t, 0]), (t, v)


def test_without_a_refresh_a_rollout_has_one_version(source):
    traj = source(_params(source, 0), 9, 0).batch
    assert (traj.version == 9).all()


class _FakeParams:
    """The parameter channel as the actor sees it: `latest(0)` hands out what was queued."""

    def __init__(self, source: str):
        self.queue, self.source = [], source

    def latest(self, timeout_ms=0):
        assert timeout_ms == 0  # a refresh mid-rollout never waits
        if not self.queue:
            return None
        version, params, self.source = self.queue.pop(0)
        return version, ParamsMessage(params, np.asarray(0, np.int64))


class _FakeChannel:
    def __init__(self, to):
        self.to, self.sent = to, []

    def send(self, msg):
        self.sent.append(msg)


def _actor(params_in, learner="learner-0@a"):
    actor = Actor.__new__(Actor)  # no sockets: one function's test
    actor.params_in = params_in
    actor.control = _FakeChannel(learner)
    actor.traj_out = _FakeChannel(learner)
    actor.version, actor.params, actor.lag, actor._pending = 4, {"w": np.zeros(2)}, 0, None
    actor._last_heard, actor.global_steps = 0.0, 0
    actor.credits = actor.sent = actor.sent_before = actor._learner_restarts = 0
    actor.env_steps = actor.unsent = 0
    actor.learner_restarted, actor.actor_id = False, 0
    return actor


def test_the_actor_refresh_takes_newer_versions_of_its_learner_only():
    params_in = _FakeParams("learner-0@a")
    actor = _actor(params_in)
    assert actor._refresh_in_flight() is None  # nothing new: act on
    params_in.queue.append((6, {"w": np.ones(2)}, "learner-0@a"))
    params, version = actor._refresh_in_flight()
    assert version == 6 and actor.version == 6 and np.asarray(params["w"]).sum() == 2
    # a restarted learner's first version: not mixed into this rollout (it is dropped)
    params_in.queue.append((2, {"w": np.full(2, 7.0)}, "learner-0@b"))
    assert actor._refresh_in_flight() is None
    assert actor.version == 6 and actor.control.to == "learner-0@b"
    assert actor.control.sent[-1]["type"] == "register"


def test_param_refresh_step_is_for_async_actors_on_host_envs():
    cfg = load_config(LATENCY_CFG, FAST)
    assert cfg.runtime.param_refresh is None and cfg.refresh_per_step  # the default here
    assert not load_config(LATENCY_CFG, FAST + ["runtime.param_refresh=rollout"]).refresh_per_step
    assert not load_config(LATENCY_CFG, FAST + ["mode=sync"]).refresh_per_step
    with pytest.raises(ConfigError, match="runtime.param_refresh"):
        load_config(LATENCY_CFG, FAST + ["mode=sync", "runtime.param_refresh=step"])
    jax_env = str(REPO / "configs" / "ppo_cartpole_async.yaml")
    gymnax = ["env_backend=gymnax"]
    assert load_config(jax_env).refresh_per_step  # envpool: a Python loop over vector steps
    assert not load_config(jax_env, gymnax).refresh_per_step  # one lax.scan: between rollouts
    with pytest.raises(ConfigError, match="runtime.param_refresh.*lax.scan"):
        load_config(jax_env, gymnax + ["runtime.param_refresh=step"])
    with pytest.raises(ConfigError, match="runtime.param_refresh"):
        load_config(LATENCY_CFG, ["runtime.param_refresh=always"])
