"""A multi-host run on one machine: two learner processes joined by jax.distributed into
one data-parallel mesh, and two actor processes, each started by its own
`tianjax launch --role ...` command as on separate hosts, sharing the run key through
TIANJAX_RUN_KEY. Both learners must learn, and hold bit-identical parameters at the end.
"""

from __future__ import annotations

import os
import signal

import jax
import numpy as np
import pytest
import yaml

from tianjax import checkpoint as ckpt

from .conftest import (
    ASYNC_CFG,
    actor_processes,
    child_env,
    free_port,
    free_port_block,
    read_summary,
    updates_logged,
    wait_for,
)

# per learner process: steps_per_update is one learner's share (1 actor x 16 envs x 32),
# so 75 000 steps each is 146 updates of a 1024-sample global batch, ~150 000 steps in all
STEPS_PER_LEARNER = 75_000


def _config_file(tmp_path) -> str:
    with open(ASYNC_CFG) as f:
        data = yaml.safe_load(f)
    data.update(mode="sync", num_actors=1, total_env_steps=STEPS_PER_LEARNER,
                run_dir=str(tmp_path / "run"))
    path = tmp_path / "multihost.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.slow
def test_two_learners_two_actors_learn_with_identical_params(tmp_path, procs):
    cfg = _config_file(tmp_path)
    base = free_port_block(6)
    coordinator = f"127.0.0.1:{free_port()}"
    env = child_env(TIANJAX_RUN_KEY=os.urandom(32).hex())
    learners = [procs.start(["-m", "tianjax.cli", "launch", "--role", "learner", cfg,
                             "--coordinator", coordinator, "--num-processes", "2",
                             "--process-id", str(i), "--base-port", str(base)],
                            name=f"learner-{i}", env=env) for i in range(2)]
    actors = [procs.start(["-m", "tianjax.cli", "launch", "--role", "actor", cfg,
                           "--actor-id", str(k), "--num-learners", "2", "--base-port", str(base)],
                          name=f"actor-{k}", env=env) for k in range(2)]

    # an actor process that dies mid-run is replaced by its `launch --role actor` command
    wait_for(lambda: updates_logged(tmp_path / "run" / "learner-0") >= 10
             or any(p.poll() is not None for p in learners), 180, what="10 updates")
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

    summaries = [read_summary(tmp_path / "run" / f"learner-{i}") for i in range(2)]
    for i, s in enumerate(summaries):
        assert s["process_index"] == i and s["process_count"] == 2
        assert s["learner_devices"] == 2  # one global mesh over both processes
        assert s["updates"] == summaries[0]["updates"] == STEPS_PER_LEARNER // (16 * 32)
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
