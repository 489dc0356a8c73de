"""Actor and learner devices on a CPU host with four XLA CPU devices, with real processes:
the learner's update spans only the devices listed, each actor process is placed on its
own device and sees only it, and a device the host does not have is refused at the start
with one line (the run in a subprocess: JAX's device count is set before it starts)."""

from __future__ import annotations

import json
import textwrap

from .conftest import ASYNC_CFG, child_env

SCRIPT = textwrap.dedent("""
    import json, sys
    import jax
    import tianjax
    from tianjax.config import ConfigError, load_config
    import tianjax.runtime.runners.local as local
    from tianjax.runtime.learner.sharded_update import learner_mesh

    assert len(jax.devices()) == 4, jax.devices()
    def ids(devices):
        config = load_config(sys.argv[1], [f"runtime.learner_devices={devices}"])
        return [d.id for d in learner_mesh(config).devices.flat]
    meshes = {"cpu:1,3": ids("cpu:1,3"), "cpu:2": ids("cpu:2"), "2": ids(2)}
    try:
        ids("cpu:1,7")
    except ConfigError as e:
        meshes["refused"] = str(e)
    made = []

    class Recording(local.Learner):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    local.Learner = Recording
    result = tianjax.train(sys.argv[1], sys.argv[3:], run_dir=sys.argv[2], progress=False, verbose=False)
    shardings = made[0].sgd.update.input_shardings[0][1]
    print("REPORT " + json.dumps({
        "meshes": meshes,
        "run_mesh": [d.id for d in made[0].mesh.devices.flat],
        "batch_devices": sorted({d.id for s in shardings if s is not None for d in s.device_set}),
        "summary": result.summary,
    }))
""")


def test_the_learner_spans_its_listed_devices_and_each_actor_sees_only_its_own(tmp_path, procs):
    env = child_env(JAX_NUM_CPU_DEVICES="4")
    run_dir = tmp_path / "run"
    p = procs.start(
        [
            "-c",
            SCRIPT,
            ASYNC_CFG,
            str(run_dir),
            "mode=async",
            "runtime.learner_devices=cpu:1,3",
            "runtime.actor_devices=cpu:3,2",
            "runtime.max_reuse=0",
            f"total_env_steps={8 * 2 * 16 * 32}",
        ],
        name="run",
        env=env,
    )
    assert procs.wait(p, 300) == 0, procs.stderr(p)[-3000:]
    line = [t for t in procs.stdout(p).splitlines() if t.startswith("REPORT ")]
    report = json.loads(line[-1][len("REPORT ") :])
    assert report["meshes"]["cpu:1,3"] == [1, 3]
    assert report["meshes"]["cpu:2"] == [2]
    assert report["meshes"]["2"] == [0, 1]  # a count: the first of this host's, as before
    assert report["meshes"]["refused"].startswith(
        "config key 'runtime.learner_devices': this process has cpu devices [0, 1, 2, 3], "
        "so cpu:1,7 names one it does not have (7)"
    )
    assert report["run_mesh"] == [1, 3] and report["batch_devices"] == [1, 3]
    assert report["summary"]["learner_devices"] == 2 and report["summary"]["updates"] == 8
    for actor, device in ((0, 3), (1, 2)):
        log = (run_dir / "actors" / f"actor-{actor}.log").read_text()
        # placed on its own device, and JAX in it sees one CPU device
        assert f"tianjax: actor {actor} on cpu:{device}; JAX sees cpu:0\n" in log, log[-2000:]


def test_a_device_the_host_does_not_have_is_refused_at_the_start(tmp_path, procs):
    p = procs.start(
        [
            "-m",
            "tianjax.cli",
            "train",
            ASYNC_CFG,
            f"run_dir={tmp_path / 'run'}",
            "runtime.actor_devices=cpu:0,4",
        ],
        name="refused",
        env=child_env(JAX_NUM_CPU_DEVICES="4"),
    )
    assert procs.wait(p, 120) == 2
    err = procs.stderr(p).strip().splitlines()
    assert err == [
        "tianjax: error: config key 'runtime.actor_devices': this host has 4 cpu device(s) "
        "(ids 0-3), so cpu:0,4 names one it does not have (4)"
    ]
    assert not (tmp_path / "run").exists()  # refused before anything is written
