"""tianjax sweep: grid parsing and grouping, and a point of a vmapped sweep equals the
separate `tianjax train` run of its config (same seeds)."""

import json
import os

import jax
import numpy as np
import pytest

import tianjax
from tianjax.cli import main
from tianjax.config import ConfigError
from tianjax.runtime.runners.sweep import make_points, parse_args, run_sweep, split_values

CFG = "configs/ppo_cartpole.yaml"


def test_values_split_on_commas_outside_brackets():
    assert split_values("1e-3,3e-3") == ["1e-3", "3e-3"]
    assert split_values("[32,32],[64, 64]") == ["[32,32]", "[64, 64]"]
    assert split_values("[64,64]") == ["[64,64]"]
    overrides, axes = parse_args(["ppo.lr=1e-3,3e-3", "num_seeds=4", "network.hidden=[64,64]"])
    assert overrides == ["num_seeds=4", "network.hidden=[64,64]"]
    assert axes == [("ppo.lr", ["1e-3", "3e-3"])]


def test_points_group_by_what_changes_the_program():
    points = make_points(
        CFG, ["ppo.lr=1e-3,3e-3", "ppo.ent_coef=0,0.01", "network.hidden=[32],[64,64]"]
    )
    assert len(points) == 8
    assert {p.group for p in points} == {
        0,
        1,
    }  # one program per width, lr x ent_coef vmapped in each
    for p in points:
        assert p.group == (0 if p.config.network.hidden == (32,) else 1)
    assert {(p.config.ppo.lr, p.config.ppo.ent_coef) for p in points if p.group == 0} == {
        (1e-3, 0.0),
        (1e-3, 0.01),
        (3e-3, 0.0),
        (3e-3, 0.01),
    }
    assert {p.group for p in make_points(CFG, ["ppo.lr=1e-3,3e-3", "num_envs=4,8"])} == {0, 1}


def test_bad_grids_name_the_key_and_point():
    with pytest.raises(ConfigError, match=r"ppo.lr.*must be > 0.*sweep point ppo.lr=-1"):
        make_points(CFG, ["ppo.lr=1e-3,-1"])
    with pytest.raises(ConfigError, match="'ppo.lrr': unknown key"):
        make_points(CFG, ["ppo.lrr=1,2"])
    with pytest.raises(ConfigError, match="'num_seeds': not a grid axis"):
        make_points(CFG, ["num_seeds=1,2"])
    with pytest.raises(ConfigError, match="'mode'"):
        make_points("configs/ppo_cartpole_async.yaml", ["ppo.lr=1e-3,3e-3"])


def test_cli_bad_sweep_is_one_line_and_exit_2(capsys):
    assert main(["sweep", CFG, "ppo.gamma=0.9,2"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("tianjax: error: config key 'ppo.gamma'")
        and len(err.strip().splitlines()) == 1
    )


def test_a_sweep_point_is_the_separate_run_of_its_config(tmp_path):
    small = [
        "total_env_steps=1024",
        "num_envs=2",
        "rollout_len=64",
        "log_every=4",
        "eval.episodes=0",
    ]
    result = run_sweep(
        CFG, small + ["ppo.lr=1e-3,3e-3", "num_seeds=2"], out=str(tmp_path / "sw"), verbose=False
    )
    assert len(result.groups) == 1 and result.groups[0]["points"] == 2
    point = result.points[1]  # ppo.lr=3e-3
    assert point.name == "ppo.lr=3e-3"
    separate = tianjax.train(
        CFG,
        small + ["ppo.lr=3e-3", "num_seeds=2"],
        run_dir=str(tmp_path / "one"),
        progress=False,
        verbose=False,
    )
    np.testing.assert_allclose(
        point.final_return_per_seed, separate.summary["final_return_per_seed"], rtol=1e-5
    )
    loaded = tianjax.load(point.run_dir)
    for a, b in zip(jax.tree.leaves(loaded.params), jax.tree.leaves(separate.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    summary = json.load(open(os.path.join(point.run_dir, "summary.json")))
    assert (
        summary["env_steps"] == 2 * 1024 and summary["updates"] == 8 and summary["num_seeds"] == 2
    )
    assert summary["sweep_point"] == {"ppo.lr": "3e-3"}
    records = [json.loads(x) for x in open(os.path.join(point.run_dir, "metrics.jsonl"))]
    assert [r["updates"] for r in records] == [4, 8] and records[-1]["env_steps"] == 2 * 1024
    # the ranking table lists both points, best first
    md = open(tmp_path / "sw" / "sweep.md").read()
    ranked = result.ranked()
    assert ranked[0].final_return >= ranked[1].final_return
    assert md.index(ranked[0].name) < md.index(ranked[1].name)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: one XLA:CPU device")
def test_the_cli_splits_the_points_over_the_cores_and_gets_the_same_runs(tmp_path):
    """`tianjax sweep` in a fresh process makes each core an XLA:CPU device and splits the
    4 runs (2 points x 2 seeds) over them (2 devices on 2 or 3 cores); every point's
    parameters equal the one-device sweep's (this process has one device)."""
    import subprocess
    import sys

    small = [
        "total_env_steps=1024",
        "num_envs=2",
        "rollout_len=64",
        "log_every=4",
        "eval.episodes=0",
        "ppo.lr=1e-3,3e-3",
        "num_seeds=2",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "tianjax.cli", "sweep", CFG, *small, "--out", str(tmp_path / "cli")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    cores = len(os.sched_getaffinity(0))
    devices = max(k for k in range(1, min(4, cores) + 1) if 4 % k == 0)  # as many as split 4 evenly
    assert f"on {devices} devices" in proc.stdout, proc.stdout
    cli = json.load(open(tmp_path / "cli" / "sweep.json"))
    assert cli["groups"][0]["devices"] == devices
    here = run_sweep(CFG, small, out=str(tmp_path / "one"), verbose=False)
    assert here.groups[0]["devices"] == len(jax.local_devices())
    for p in here.points:
        other = tianjax.load(os.path.join(tmp_path / "cli", os.path.basename(p.run_dir)))
        for a, b in zip(
            jax.tree.leaves(tianjax.load(p.run_dir).params),
            jax.tree.leaves(other.params),
            strict=True,
        ):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
