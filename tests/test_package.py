"""What a new user meets first: configs by name from any directory, `tianjax configs`,
`show` and `--dry-run`, a missing extra named before anything is written, the version,
train(save=False) writing nothing, and metrics records that follow the budget."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import yaml

import tianjax
from tianjax.cli import main
from tianjax.config import ConfigError, load_config
from tianjax.config.library import names
from tianjax.runtime.runners import preflight

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "total_env_steps=4096",
    "num_envs=4",
    "rollout_len=16",
    "eval.episodes=0",
    "ppo.num_minibatches=2",
]


def test_configs_load_by_name_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    by_name = load_config("ppo_cartpole")
    by_path = load_config(ROOT / "configs" / "ppo_cartpole.yaml")
    assert (
        by_name == by_path == load_config("configs/ppo_cartpole.yaml")
    )  # the repo's path, from elsewhere
    assert set(names()) == {p.stem for p in (ROOT / "configs").glob("*.yaml")}
    with pytest.raises(ConfigError, match="did you mean ppo_cartpole"):
        load_config("ppo_cartpol")
    with pytest.raises(ConfigError, match="not found"):
        load_config(str(tmp_path / "nope.yaml"))


def test_configs_lists_one_line_each(capsys):
    assert main(["configs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(names())
    row = next(line.split() for line in lines if line.startswith("ppo_cartpole "))
    assert row[:5] == ["ppo_cartpole", "fused", "ppo", "CartPole-v1", "(gymnax)"]


def test_show_prints_the_resolved_config_with_comments_and_loads_back(capsys, tmp_path):
    assert main(["show", "ppo_cartpole", "ppo.lr=1e-3", "total_env_steps=20000"]) == 0
    text = capsys.readouterr().out
    assert "lr: 0.001" in text and "# Adam learning rate" in text
    assert "runtime:" not in text and "dqn:" not in text  # a fused PPO run reads neither
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    assert load_config(path) == load_config(
        "ppo_cartpole", ["ppo.lr=1e-3", "total_env_steps=20000"]
    )


def test_dry_run_builds_everything_and_writes_nothing(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "ppo_cartpole", "--dry-run", "num_envs=8"]) == 0
    out = capsys.readouterr().out
    assert "observations  shape (4,), float32" in out and "discrete, 2 actions" in out
    # 4 -> 64 -> 64 -> (2 logits, 1 value), tanh MLP, separate actor and critic torsos
    n_params = (4 * 64 + 64 + 64 * 64 + 64) * 2 + (64 * 2 + 2) + (64 + 1)
    assert f"parameters    {n_params:,}" in out
    assert "1 trajectory x 1,024 = 1,024 samples per update" in out
    assert "network torso mlp)" in out  # `auto`, resolved for the observations
    assert list(tmp_path.iterdir()) == []
    assert main(["train", "ppo_cartpole", "--dry-run", "env=CartPol-v1"]) == 2
    assert "config key 'env'" in capsys.readouterr().err and list(tmp_path.iterdir()) == []


def test_a_multi_agent_dry_run_names_the_torso_each_agent_gets(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "ippo_mpe_spread", "--dry-run"]) == 0
    assert "(ippo, network torso mlp)" in capsys.readouterr().out  # each agent sees a vector


def test_a_missing_extra_is_one_line_naming_it():
    with pytest.raises(ConfigError) as e:
        preflight.require(
            "no_such_module_tianjax", "envpool", "env_backend", "env_backend 'envpool'"
        )
    assert str(e.value) == (
        "config key 'env_backend': env_backend 'envpool' needs the envpool extra, which is "
        'not installed; pip install "tianjax[envpool]" (from a clone: pip install -e '
        '".[envpool]")'
    )
    assert preflight.needed_extras(load_config("ppo_cartpole_async")) == ["envpool"]
    assert preflight.needed_extras(load_config("ppo_cartpole")) == []


def test_a_bad_env_id_leaves_no_run_directory(tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match="config key 'env'"):
        tianjax.train("ppo_cartpole", [*TINY, "env=CartPol-v1"], run_dir=run_dir, verbose=False)
    assert not run_dir.exists()


def test_version_from_one_source():
    out = subprocess.run(
        [sys.executable, "-m", "tianjax", "--version"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert out.stdout.strip() == f"tianjax {tianjax.__version__}"
    meta = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in meta and "tianjax._version.__version__" in meta


def test_train_without_saving_writes_nothing_and_returns_columns(
    tmp_path, tmp_path_factory, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    # a temp folder of this test's own: the shared one also holds other workers' runs
    own_tmp = tmp_path_factory.mktemp("tempdir")
    monkeypatch.setattr(tempfile, "tempdir", str(own_tmp))
    result = tianjax.train("ppo_cartpole", TINY, save=False, verbose=False, progress=False)
    assert (
        list(tmp_path.iterdir()) == []
        and result.run_dir is None
        and result.summary["run_dir"] is None
    )
    assert not [d for d in os.listdir(own_tmp) if d.startswith("tianjax-")]
    m = result.metrics
    # 4096 steps / (4 envs x 16 steps) = 64 iterations; null log_every aims at ~200 records: every one
    assert m["env_steps"].dtype == np.int64 and m["env_steps"].tolist() == list(range(64, 4097, 64))
    assert m["return_mean_100"].dtype == np.float64 and len(m["loss"]) == 64
    with pytest.raises(ConfigError, match="save=False"):
        tianjax.train("ppo_cartpole", TINY, save=False, run_dir=tmp_path / "x", verbose=False)


def test_records_follow_the_budget():
    # 500k steps of 4 x 128 = 976 iterations: every 4 (a divisor, so one compiled chunk) = 244
    assert load_config("ppo_cartpole").log_interval == 4
    assert load_config("ppo_cartpole", ["total_env_steps=20000"]).log_interval == 1
    for steps in (20_000, 200_000, 2_000_000, 20_000_000):
        c = load_config("ppo_cartpole", [f"total_env_steps={steps}"])
        assert 100 <= -(-c.planned_updates // c.log_interval) <= 400 or c.log_interval == 1
    assert load_config("ppo_cartpole", ["log_every=61"]).log_interval == 61


def test_a_runs_config_yaml_holds_only_what_it_reads(tmp_path):
    run = tmp_path / "run"
    tianjax.train("ppo_cartpole", TINY, run_dir=run, verbose=False, progress=False)
    saved = yaml.safe_load((run / "config.yaml").read_text())
    sections = {k for k, v in saved.items() if isinstance(v, dict) and k != "env_options"}
    assert sections == {"network", "ppo", "staleness", "checkpoint", "eval"}
    assert load_config(run / "config.yaml") == load_config(
        "ppo_cartpole", [*TINY, f"run_dir={run}"]
    )


def test_eval_on_a_run_without_checkpoints_says_so(tmp_path, capsys):
    run = tmp_path / "run"
    tianjax.train(
        "ppo_cartpole",
        [*TINY, "checkpoint.final=false"],
        run_dir=run,
        verbose=False,
        progress=False,
    )
    assert main(["eval", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith(f"tianjax: error: eval: the run in '{run}' has no checkpoints")
        and "\n" not in err
    )
    with pytest.raises(ConfigError, match="has no checkpoints"):
        tianjax.load(run)


def test_a_network_module_that_does_not_import_leaves_no_run_directory(tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(
        ConfigError, match="config key 'network.module': cannot import 'no_such_pkg_tianjax'"
    ):
        tianjax.train(
            "ppo_cartpole",
            [*TINY, "network.module=no_such_pkg_tianjax:Net"],
            run_dir=run_dir,
            verbose=False,
        )
    assert not run_dir.exists()
