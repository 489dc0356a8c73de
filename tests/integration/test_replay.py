"""Async runs replayed bit for bit: a learner and 2 actor processes train over real sockets
and write the run's replay log; `tianjax replay RUN_DIR` acts every logged rollout again in
one process, applies the logged updates, and must end with the run's parameters' SHA-256.
A log changed after the run (an update's trajectories swapped, an update moved before what
it takes, a trajectory lost on the way) gives another hash or is refused. A run on a host
env (envpool) replays too, each step with the version that acted it; one on a host env
whose copies from one seed differ is refused before any work, with the reason. An actor killed with -9 mid-run and
restarted (a new process from the same seed) is replayed too (in a sync run, whose learner
waits for the new process however long it takes to start)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

import tianjax
from tianjax.errors import ReplayRefused
from tianjax.runtime.record.replay_log import REPLAY_LOG, read_events

from .conftest import ASYNC_CFG, REPO, actor_processes, child_env, read_summary, wait_for

pytestmark = pytest.mark.slow

DQN_CFG = str(REPO / "configs" / "dqn_cartpole.yaml")
COMMON = ["mode=async", "num_actors=2", "eval.episodes=0", "target_return=null", "log_every=4"]


def _train(cfg, overrides, run_dir):
    return tianjax.train(cfg, [*COMMON, *overrides], run_dir=str(run_dir), progress=False)


def _cli_replay(run_dir) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tianjax", "replay", str(run_dir)],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory):
    """An async PPO run on gymnax CartPole: 16 updates of 2 trajectories, 2 actor processes.
    One credit each: an actor cannot fill a batch alone, so both are learned from however
    late one starts (each still acts with the newest version it holds)."""
    run_dir = tmp_path_factory.mktemp("ppo") / "run"
    overrides = ["env_backend=gymnax", "total_env_steps=16384", "runtime.credits_per_actor=1"]
    _train(ASYNC_CFG, overrides, run_dir)
    return run_dir


def _copy_log(run_dir, to, edit) -> str:
    """The run's config and summary, with its replay log as `edit(events)` gives it back."""
    to.mkdir()
    for name in ("config.yaml", "summary.json"):
        shutil.copy(run_dir / name, to / name)
    events = edit(list(read_events(str(run_dir))))
    (to / REPLAY_LOG).write_text("".join(json.dumps(e) + "\n" for e in events))
    return str(to)


def _updates(events) -> list[dict]:
    return [e for e in events if e["e"] == "update"]


def test_async_ppo_run_replays_bit_for_bit(ppo_run):
    summary = read_summary(ppo_run)
    events = list(read_events(str(ppo_run)))
    trajs = [e for e in events if e["e"] == "traj"]
    assert {e["actor"] for e in trajs} == {0, 1}  # both actor processes' rollouts
    # async: trajectories of several versions learned from, some behind the learner
    assert len({e["v"][0][0] for e in trajs}) > 1
    version, stale = 0, 0
    by_index = {e["i"]: e for e in trajs}
    for u in _updates(events):
        stale += sum(by_index[i]["v"][0][0] < version for i in u["items"])
        version += 1
    assert stale > 0
    assert len(_updates(events)) == summary["updates"]
    done = _cli_replay(ppo_run)
    assert done.returncode == 0, done.stderr[-3000:]
    h = summary["params_sha256"][:16]
    assert f"params sha256 {h} vs the run's {h}: equal" in done.stdout


def test_async_dqn_run_replays_bit_for_bit(tmp_path):
    run = _train(
        DQN_CFG,
        ["total_env_steps=4000", "dqn.learning_starts=1000"],
        tmp_path / "run",
    )
    events = list(read_events(run.run_dir))
    assert sum(e["e"] == "traj" and e["to"] == "replay" for e in events) == 100
    out = tianjax.replay_run(run.run_dir)
    assert out.updates == run.summary["updates"] > 0
    assert out.params_sha256 == run.summary["params_sha256"]
    assert out.equal


def test_a_log_with_an_update_reordered_gives_other_parameters(ppo_run, tmp_path):
    def swap(events):
        first = _updates(events)[0]
        assert len(set(first["items"])) == 2
        first["items"] = first["items"][::-1]  # the same trajectories, joined the other way
        return events

    out = tianjax.replay_run(_copy_log(ppo_run, tmp_path / "swapped", swap))
    assert not out.equal and out.params_sha256 != out.recorded_sha256


def test_a_log_out_of_order_is_refused(ppo_run, tmp_path):
    def early(events):
        update = _updates(events)[-1]
        events.remove(update)
        events.insert(1, update)  # before the trajectories it takes arrived
        return events

    with pytest.raises(ReplayRefused, match="out of order"):
        tianjax.replay_run(_copy_log(ppo_run, tmp_path / "early", early))


def _restarted(events):
    # a learner killed after update 8 and restarted from its checkpoint there
    cut = events.index(_updates(events)[8])
    start = {
        "e": "start",
        "version": 8,
        "resumed_from": 8,
        "seed": 0,
        "processes": 1,
        "group": False,
    }
    return events[:cut] + [start] + events[cut:]


@pytest.mark.parametrize(
    "edit,reason",
    [
        (_restarted, "the learner restarted (from checkpoint 8): the trajectories it held"),
        (lambda events: events[:-1], f"{REPLAY_LOG} has no end: the learner did not finish"),
    ],
    ids=["learner-restarted", "no-end"],
)
def test_a_run_whose_learner_restarted_or_never_ended_is_refused(ppo_run, tmp_path, edit, reason):
    with pytest.raises(ReplayRefused) as e:
        tianjax.replay_run(_copy_log(ppo_run, tmp_path / "edited", edit))
    assert str(e.value).startswith(reason)


def test_a_deterministic_lag_run_is_refused_as_one_to_train_again(ppo_run, tmp_path):
    to = _copy_log(ppo_run, tmp_path / "deterministic", lambda events: events)
    path = os.path.join(to, "config.yaml")
    with open(path) as f:
        text = f.read()
    assert "deterministic: false" in text
    with open(path, "w") as f:
        f.write(text.replace("deterministic: false", "deterministic: true", 1))
    with pytest.raises(ReplayRefused, match="runtime.deterministic: .* training it again"):
        tianjax.replay_run(to)


def test_a_trajectory_lost_on_the_way_is_refused_before_it_starts(ppo_run, tmp_path):
    lost = {}

    def drop(events):
        # actor 1's first rollout never arrived; its later ones were learned from
        t = next(e for e in events if e["e"] == "traj" and e["actor"] == 1 and e["rollout"] == 0)
        lost.update(t)
        for u in _updates(events):
            u["items"] = [i for i in u["items"] if i != t["i"]]
        return [e for e in events if e is not t]

    run_dir = _copy_log(ppo_run, tmp_path / "lost", drop)
    done = _cli_replay(run_dir)
    assert done.returncode == 2 and done.stdout == ""
    assert f"actor 1 (process {lost['inc']}) rollout 0 never arrived" in done.stderr


def test_an_envpool_run_with_versions_taken_mid_rollout_replays_bit_for_bit(tmp_path):
    # the shipped config: envpool actors take a newer version between vector steps
    run = _train(ASYNC_CFG, ["total_env_steps=16384"], tmp_path / "run")
    events = list(read_events(run.run_dir))
    assert any(len(e["v"]) > 1 for e in events if e["e"] == "traj")
    out = tianjax.replay_run(run.run_dir)
    assert out.params_sha256 == run.summary["params_sha256"] and out.equal


NOISY_ENV = """
import gymnasium as gym
import numpy as np


class Noisy(gym.Env):
    \"\"\"A corridor whose observations carry noise no seed controls.\"\"\"

    observation_space = gym.spaces.Box(-1.0, 2.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.pos, self.t = 0, 0
        return self._obs(), {}

    def _obs(self):
        o = np.random.default_rng().uniform(-0.1, 0.1, 4).astype(np.float32)
        o[self.pos] += 1.0
        return o

    def step(self, action):
        self.t += 1
        self.pos = min(max(self.pos + (1 if int(action) == 1 else -1), 0), 3)
        return self._obs(), float(self.pos == 3), self.pos == 3, self.t >= 20, {}


gym.register("ReplayNoisy-v0", entry_point=Noisy)
"""


def test_a_host_env_that_is_not_deterministic_is_refused_with_the_reason(tmp_path, monkeypatch):
    (tmp_path / "replay_noisy.py").write_text(NOISY_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    overrides = [
        "env=replay_noisy:ReplayNoisy-v0",
        "env_backend=gymnasium",
        "num_envs=2",
        "rollout_len=16",
        "total_env_steps=256",
        "network.hidden=[8]",
        "ppo.num_minibatches=2",
    ]
    run = _train(ASYNC_CFG, overrides, tmp_path / "run")
    assert run.summary["updates"] > 0
    done = subprocess.run(
        [sys.executable, "-m", "tianjax", "replay", run.run_dir],
        cwd=REPO,
        env=child_env(PYTHONPATH=f"{REPO}{os.pathsep}{tmp_path}"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == (
        f"tianjax: cannot replay {run.run_dir}: env 'replay_noisy:ReplayNoisy-v0' "
        "(gymnasium) is not deterministic: two copies made from one seed differ in rollout "
        "0's .batch.obs"
    )


def test_a_run_with_an_actor_killed_and_restarted_replays_bit_for_bit(tmp_path, procs):
    run_dir = tmp_path / "run"
    cli = procs.start(
        [
            "-m",
            "tianjax",
            "train",
            ASYNC_CFG,
            *COMMON,
            # sync: every update waits for a trajectory of each actor, so the restarted
            # process is learned from however long it takes to start
            "mode=sync",
            "env_backend=gymnax",
            "total_env_steps=40960",
            f"run_dir={run_dir}",
            "--no-progress",
        ],
        "train",
    )

    def sent_by_actor_0() -> int:
        try:
            return sum(e["e"] == "traj" and e["actor"] == 0 for e in read_events(str(run_dir)))
        except FileNotFoundError:
            return 0

    wait_for(lambda: sent_by_actor_0() >= 2, 120, what="2 trajectories of actor 0")
    victim = next(p for p in actor_processes(cli.pid) if "--actor-id 0" in " ".join(p.cmdline()))
    os.kill(victim.pid, signal.SIGKILL)
    assert procs.wait(cli, 180) == 0, procs.stderr(cli)[-3000:]
    summary = read_summary(run_dir)
    assert summary["actor_restarts"] == 1
    events = list(read_events(str(run_dir)))
    taken = {i for e in _updates(events) for i in e["items"]}
    learned_from = {(e["actor"], e["inc"]) for e in events if e["e"] == "traj" and e["i"] in taken}
    # both processes of actor 0 were learned from, and the new one started at rollout 0
    assert len({inc for actor, inc in learned_from if actor == 0}) == 2
    out = tianjax.replay_run(str(run_dir))
    assert out.params_sha256 == summary["params_sha256"] and out.equal
