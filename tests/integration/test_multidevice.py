"""The learner's update, data-parallel over two devices: a run in a subprocess that sees
two CPU devices (XLA_FLAGS must be set before jax is imported, hence the subprocess)."""

from __future__ import annotations

import json
import textwrap

from .conftest import ASYNC_CFG, child_env

SCRIPT = textwrap.dedent("""
    import json, sys
    import jax
    import tianjax
    import tianjax.runtime.runners.local as local

    assert len(jax.devices()) == 2, jax.devices()
    made = []

    class Recording(local.Learner):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    local.Learner = Recording
    result = tianjax.train(sys.argv[1], sys.argv[3:], run_dir=sys.argv[2], progress=False, verbose=False)
    learner = made[0]
    state_sharding, batch_sharding, _ = learner.sgd.update.input_shardings[0]
    report = {
        "summary": result.summary,
        "mesh_devices": int(learner.mesh.devices.size),
        # every batch field is split over both devices, along its B axis (a field the
        # update does not read, such as the behaviour values decoupled PPO recomputes, has
        # no input sharding: XLA drops it)
        "batch_devices": sorted({len(s.device_set) for s in batch_sharding if s is not None}),
        "global_shapes": {n: list(getattr(learner.sgd.global_sds, n).shape)
                          for n, sh in zip(batch_sharding._fields, batch_sharding) if sh is not None},
        "shard_shapes": {n: list(sh.shard_shape(getattr(learner.sgd.global_sds, n).shape))
                         for n, sh in zip(batch_sharding._fields, batch_sharding) if sh is not None},
        "params_replicated": all(s.is_fully_replicated for s in jax.tree.leaves(state_sharding)),
    }
    print("REPORT " + json.dumps(report))
""")


def test_update_is_data_parallel_over_two_devices(tmp_path, procs):
    env = child_env(XLA_FLAGS="--xla_force_host_platform_device_count=2")
    total = 12 * 2 * 16 * 32  # 12 updates
    p = procs.start(
        [
            "-c",
            SCRIPT,
            ASYNC_CFG,
            str(tmp_path / "run"),
            "mode=async",
            "runtime.learner_devices=2",
            "runtime.max_reuse=0",
            f"total_env_steps={total}",
        ],
        name="run",
        env=env,
    )
    assert procs.wait(p, 240) == 0, procs.stderr(p)[-3000:]
    line = [text for text in procs.stdout(p).splitlines() if text.startswith("REPORT ")]
    assert line, procs.stdout(p)[-3000:]
    report = json.loads(line[-1][len("REPORT ") :])
    s = report["summary"]
    assert s["learner_devices"] == 2
    assert s["updates"] == 12
    assert s["env_steps"] >= total
    assert report["mesh_devices"] == 2
    assert report["batch_devices"] == [2]
    T, B = report["global_shapes"]["obs"][:2]
    assert (T, B) == (32, 2 * 16)  # two actor trajectories of 16 envs, joined along B
    for name, shape in report["global_shapes"].items():
        b_axis = (
            0 if name in ("last_obs", "trunc_obs", "trunc_t") else 1
        )  # [T, B, ...], per-env [B, ...]
        half = list(shape)
        half[b_axis] //= 2
        assert report["shard_shapes"][name] == half, name  # each device holds half of B
    assert report["params_replicated"]
