"""A multi-host run on one machine: two learner processes joined by jax.distributed into
one data-parallel mesh, and two actor processes, each started by its own
`tianjax launch --role ...` command as on separate hosts, sharing the run key through
TIANJAX_RUN_KEY. The commands are docs/multihost.md's, as written (only the ports and the run
directory are made this test's own). Both learners must learn, and hold bit-identical
parameters at the end. A lost learner process ends every process of the run, non-zero,
with one line, within heartbeat_timeout_s + 10 s; a SIGTERM ends a learner blocked in a
collective within 10 s.
"""

from __future__ import annotations

import os
import shlex
import signal
import time
from pathlib import Path

import jax
import numpy as np
import psutil
import pytest

from tianjax.checkpoint import store as ckpt

from .conftest import (
    REPO,
    actor_processes,
    child_env,
    free_port,
    free_port_block,
    read_summary,
    updates_logged,
    wait_for,
)


def readme_commands(run_dir: Path, base_port: int, coordinator: str) -> list[list[str]]:
    """docs/multihost.md's one-machine multi-host commands, as argv lists for `python`: `tianjax`
    is `-m tianjax.cli`, and the ports and run directory are this test's own."""
    text = (REPO / "docs" / "multihost.md").read_text()
    block = text[text.index("On one machine (two learners") :]
    block = block[block.index("```bash") + len("```bash") :]
    block = block[: block.index("```")].replace("\\\n", " ")
    out = []
    for line in block.splitlines():
        line = line.split("#")[0].strip().rstrip("&").strip()
        if not line.startswith("tianjax launch"):
            continue
        line = (
            line.replace("--coordinator 127.0.0.1:23456", f"--coordinator {coordinator}")
            .replace("--base-port 5555", f"--base-port {base_port}")
            .replace("run_dir=runs/multihost", f"run_dir={run_dir}")
        )
        out.append(["-m", "tianjax.cli", *shlex.split(line)[1:]])
    return out


def _start_readme_run(tmp_path, procs, *overrides: str, actors: tuple[int, ...] = (0, 1)):
    base = free_port_block(6)
    coordinator = f"127.0.0.1:{free_port()}"
    env = child_env(TIANJAX_RUN_KEY=os.urandom(32).hex())
    cmds = readme_commands(tmp_path / "run", base, coordinator)
    roles = [c[c.index("--role") + 1] for c in cmds]
    assert roles == ["learner", "learner", "actor", "actor"], cmds
    if overrides:  # key=value overrides go with the config's (before the flags)
        cmds = [
            c[: c.index("mode=sync")] + list(overrides) + c[c.index("mode=sync") :] for c in cmds
        ]
    learners = [procs.start(c, name=f"learner-{i}", env=env) for i, c in enumerate(cmds[:2])]
    actors = [
        procs.start(c, name=f"actor-{k}", env=env) for k, c in enumerate(cmds[2:]) if k in actors
    ]
    return env, learners, actors


@pytest.mark.slow
def test_two_learners_two_actors_learn_with_identical_params(tmp_path, procs):
    env, learners, actors = _start_readme_run(tmp_path, procs)

    # an actor process that dies mid-run is replaced by its `launch --role actor` command
    wait_for(
        lambda: (
            updates_logged(tmp_path / "run" / "learner-0") >= 10
            or any(p.poll() is not None for p in learners)
        ),
        180,
        what="10 updates",
    )
    victim = wait_for(lambda: actor_processes(actors[0].pid), 30, what="actor 0's process")[0]
    victim.send_signal(signal.SIGKILL)

    for p in learners:
        assert procs.wait(p, 240) == 0, procs.stderr(p)[-3000:]
    for p in actors:
        assert procs.wait(p, 30) == 0, procs.stderr(p)[-3000:]
    assert "actor 0 (killed by SIGKILL) restarted (1/3)" in procs.stderr(actors[0])

    key = env["TIANJAX_RUN_KEY"]
    for p in [*learners, *actors]:
        assert key not in procs.stdout(p) + procs.stderr(p)  # the key is never printed

    for i, p in enumerate(learners):  # each says which actors it expects, and where
        assert f"its actors are --actor-id {i} (of 0-1; num_actors=1 per learner)" in procs.stdout(
            p
        )
    summaries = [read_summary(tmp_path / "run" / f"learner-{i}") for i in range(2)]
    for i, s in enumerate(summaries):
        assert s["process_index"] == i and s["process_count"] == 2
        assert s["learner_devices"] == 2  # one global mesh over both processes
        assert s["updates"] == summaries[0]["updates"] == 75_000 // (16 * 32)
        assert s["staleness_max"] == 0  # sync
        assert s["final_return"] >= 475, s
    params = [np.load(tmp_path / "run" / f"learner-{i}" / "final_params.npz") for i in range(2)]
    assert sorted(params[0].files) == sorted(params[1].files) and params[0].files
    for name in params[0].files:
        a, b = params[0][name], params[1][name]
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes(), name  # bit-identical, not merely close

    # both processes wrote one checkpoint together, and it reads back whole (digest checked)
    step, state, meta = ckpt.restore_latest(str(tmp_path / "run"))
    assert step == meta["updates"] == summaries[0]["updates"]
    flat = jax.tree_util.tree_flatten_with_path(state["learner"]["params"])[0]
    saved = {jax.tree_util.keystr(k): np.asarray(v) for k, v in flat}
    assert sorted(saved) == sorted(params[0].files)
    for name in params[0].files:
        assert saved[name].tobytes() == params[0][name].tobytes(), name


def _one_error_line(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("tianjax: error:")]


@pytest.mark.slow
@pytest.mark.parametrize("victim", [1, 0])  # 0 also hosts JAX's coordination service
def test_a_killed_learner_ends_every_process_nonzero_with_one_line(tmp_path, procs, victim):
    timeout = 20
    env, learners, actors = _start_readme_run(
        tmp_path, procs, f"runtime.heartbeat_timeout_s={timeout}"
    )
    wait_for(
        lambda: (
            updates_logged(tmp_path / "run" / "learner-0") >= 10
            or any(p.poll() is not None for p in learners)
        ),
        240,
        what="10 updates",
    )
    ended = [p for p in [*learners, *actors] if p.poll() is not None]
    assert not ended, [(p.log_name, p.returncode, procs.stderr(p)[-2000:]) for p in ended]
    learners[victim].send_signal(signal.SIGKILL)  # the whole process group stays: its host is gone
    killed_at = time.monotonic()
    survivor = learners[1 - victim]
    rest = [survivor, *actors]
    codes = [procs.wait(p, timeout + 10 - (time.monotonic() - killed_at)) for p in rest]
    assert all(c not in (0, None) for c in codes), codes
    err = procs.stderr(survivor)
    assert codes[0] == 1, err[-3000:]  # not SIGABRT from JAX's client or heartbeat
    assert "Traceback" not in err and len(_one_error_line(err)) == 1, err[-3000:]
    line = _one_error_line(err)[0]
    assert f"learner {1 - victim}/2" in line and f"{victim}" in line.split(":", 3)[3], line
    assert err.rstrip().splitlines()[-1] == line  # the last word is ours
    for p in actors:
        lines = _one_error_line(procs.stderr(p))
        assert len(lines) == 1 and "its learner" in lines[0], procs.stderr(p)[-3000:]
        assert "restarted" not in procs.stderr(p)  # given up on, not restarted to wait again


@pytest.mark.slow
def test_a_learner_left_without_actors_says_so_and_the_run_ends(tmp_path, procs):
    """docs/multihost.md's learners with only `--actor-id 0` started (learner 1 has no actor): learner
    1 says which flags would start its actors (every 30 s, or halfway through a shorter
    runtime.connect_timeout_s), and once that timeout has passed both learners end, non-zero,
    with one line naming them; actor 0, whose learner went without telling it, gives up
    after runtime.heartbeat_timeout_s."""
    env, learners, actors = _start_readme_run(
        tmp_path,
        procs,
        "runtime.connect_timeout_s=24",
        "runtime.heartbeat_timeout_s=12",
        actors=(0,),
    )
    codes = [procs.wait(p, 150) for p in learners]
    assert codes == [1, 1], codes
    err1 = procs.stderr(learners[1])
    assert "learner 1/2: no actor has connected after 12 s" in err1, err1[-3000:]
    assert "--actor-id 1 --num-learners 2" in err1
    lines = _one_error_line(err1)
    assert len(lines) == 1 and "no trajectory from any actor for 24 s" in lines[0], err1[-3000:]
    assert "start its actors with --actor-id 1 --num-learners 2" in lines[0]
    lines0 = _one_error_line(procs.stderr(learners[0]))
    assert len(lines0) == 1 and "learner 1 failed" in lines0[0], procs.stderr(learners[0])[-3000:]
    assert procs.wait(actors[0], 60) not in (0, None)


def test_a_learner_needs_actors(tmp_path):
    from tianjax.config import ConfigError, load_config
    from tianjax.runtime.runners.multihost import run_learner

    config = load_config(
        str(REPO / "configs" / "ppo_cartpole.yaml"),
        ["env_backend=gymnasium", "num_actors=0", "mode=sync"],
    )
    with pytest.raises(ConfigError, match="num_actors must be >= 1"):
        run_learner(
            config,
            coordinator=None,
            num_processes=None,
            process_id=None,
            bind_host="127.0.0.1",
            base_port=5555,
            key_file=None,
        )


@pytest.mark.slow
def test_sigterm_ends_a_learner_blocked_in_a_collective(tmp_path, procs):
    """Learner 1 hangs (SIGSTOP: a host that stops answering, no connection reset), so
    learner 0's next update waits in its all-reduce for it, where no Python runs; a SIGTERM
    must still end learner 0 within 10 s (heartbeat_timeout_s is long: the lost-learner
    check must not be what ends it)."""
    env, learners, actors = _start_readme_run(tmp_path, procs, "runtime.heartbeat_timeout_s=120")
    learner0 = learners[0]
    wait_for(
        lambda: (
            updates_logged(tmp_path / "run" / "learner-0") >= 10
            or any(p.poll() is not None for p in learners)
        ),
        240,
        what="10 updates",
    )
    learners[1].send_signal(signal.SIGSTOP)
    ps = psutil.Process(learner0.pid)

    def idle():  # blocked: (nearly) no CPU time while its actor keeps delivering
        t = sum(ps.cpu_times()[:2])
        time.sleep(2.0)
        return sum(ps.cpu_times()[:2]) - t < 0.1

    wait_for(idle, 60, interval=0.1, what="learner 0 to block")
    learner0.send_signal(signal.SIGTERM)
    start = time.monotonic()
    code = procs.wait(learner0, 10)
    assert time.monotonic() - start <= 10 and code != 0
    err = procs.stderr(learner0)
    assert "did not stop within" in err, err[-3000:]  # it was blocked: the watchdog ended it
    assert "Traceback" not in err
