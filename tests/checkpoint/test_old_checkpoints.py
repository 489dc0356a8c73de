"""Checkpoints written by an earlier layout of the package still resume.

tests/golden/checkpoints_v0 holds three small runs written before the algorithms became
packages (PPO fused, DQN fused with its replay buffer and target network, async PPO with
its learner counters). Each must resume with today's code: the arrays read back into
today's state template, the digest matches, and the run goes on from the step it saved.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

import tianjax
from tianjax.checkpoint import store as ckpt
from tianjax.config import ConfigError, read_yaml

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "checkpoints_v0"


def _copy(name: str, tmp_path: Path) -> Path:
    """The old run, its config.yaml brought up to today's keys as the refusal of an old key
    tells (eval_episodes is eval.episodes since evaluation during training)."""
    run = tmp_path / name
    shutil.copytree(GOLDEN / name, run)
    data = read_yaml(run / "config.yaml")
    with pytest.raises(ConfigError, match="'eval_episodes': renamed to 'eval.episodes'"):
        tianjax.load_config(data)
    data["eval"] = {"episodes": data.pop("eval_episodes")}
    (run / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return run


@pytest.mark.parametrize("name,more", [("ppo", 4096), ("dqn", 2048)])
def test_a_fused_checkpoint_from_before_the_rooms_resumes(tmp_path, name, more):
    old = _copy(name, tmp_path)
    meta = ckpt.read_meta(str(old))
    config = tianjax.load_config(
        str(old / "config.yaml"),
        [
            f"total_env_steps={meta['env_steps'] + more}",
            f"resume={old}",
            "loggers=[]",
            "eval.episodes=0",
        ],
    )
    result = tianjax.train(config, progress=False, verbose=False)
    assert result.summary["resumed_from_step"] == meta["step"]
    assert result.summary["env_steps"] > meta["env_steps"]
    assert result.summary["updates"] > meta["updates"]


@pytest.mark.slow
def test_an_async_learner_checkpoint_from_before_the_rooms_resumes(tmp_path):
    old = _copy("async", tmp_path)
    meta = ckpt.read_meta(str(old))
    config = tianjax.load_config(
        str(old / "config.yaml"),
        [f"total_env_steps={meta['env_steps'] + 4096}", f"resume={old}", "loggers=[]"],
    )
    result = tianjax.train(config, progress=False, verbose=False)
    assert result.summary["resumed_from_step"] == meta["step"] == meta["updates"]
    assert result.summary["updates"] > meta["updates"]
    assert result.summary["env_steps"] > meta["env_steps"]


def test_an_old_run_directory_loads_under_todays_key_names():
    # its config.yaml says eval_episodes: a config tianjax wrote is read under the new
    # names (tianjax.config.loading.migrate), where a config a user names is refused
    run = tianjax.load(str(GOLDEN / "ppo"))
    written = read_yaml(GOLDEN / "ppo" / "config.yaml")["eval_episodes"]
    assert run.config.eval.episodes == written and run.config.algo == "ppo"
    assert run.params is not None


def test_migrate_renames_every_renamed_key_and_value():
    from tianjax.config.loading import migrate

    data, done = migrate(
        {
            "eval_episodes": 3,
            "maddpg": {"tau": 0.05},
            "runtime": {"security": "mac"},
            "algo": "maddpg",
        }
    )
    assert data["eval"] == {"episodes": 3} and data["maddpg"] == {"target_tau": 0.05}
    assert data["runtime"]["security"] == "plain" and "eval_episodes" not in data
    assert len(done) == 3
