"""Every bad input a user can type ends in one line naming the problem and a non-zero exit
code, never a traceback."""

from __future__ import annotations

import pytest

from tianjax.cli import main
from tianjax.transport.auth import KEY_ENV

CFG = "configs/ppo_cartpole.yaml"


@pytest.mark.parametrize(
    "argv, code, needle",
    [
        (["train", "nope.yaml"], 2, "config file 'nope.yaml': not found"),
        (["train", CFG, "lerning_rate=1"], 2, "config key 'lerning_rate': unknown key"),
        (["train", CFG, "ppo.lr=abc"], 2, "config key 'ppo.lr': must be a number"),
        (["train", CFG, "num_envs=0"], 2, "config key 'num_envs'"),
        (["train", CFG, "env=NoSuchEnv-v0"], 2, "'NoSuchEnv-v0' is not a gymnax environment"),
        (
            ["train", "configs/ppo_cartpole_gymnasium.yaml", "env=Nope-v9"],
            2,
            "not a registered gymnasium env id",
        ),
        (
            ["train", CFG, "total_env_steps=10000000000000"],
            2,
            "config key 'total_env_steps': must be below 2**31",
        ),
        (["train", CFG, "resume=/nonexistent/run"], 2, "config key 'resume'"),
        (["eval", "/nonexistent/run"], 2, "eval: '/nonexistent/run' does not exist"),
        (["report", "/nonexistent/run"], 2, "/nonexistent/run"),
        (
            ["launch", "--role", "actor", "configs/ppo_cartpole_async.yaml", "--actor-id", "0"],
            2,
            "no run key",
        ),
        (["launch", "--role", "learner", CFG], 2, "config key 'mode'"),
    ],
)
def test_bad_input_is_one_line(argv, code, needle, capsys, monkeypatch, tmp_path):
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.chdir(tmp_path.parent if argv[0] == "eval" else ".")
    assert main([*argv, "--no-progress"] if argv[0] == "train" else argv) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("tianjax: error: ") and needle in err[0], err[0]


def test_out_of_memory_is_one_line(capsys, monkeypatch):
    # sizes beyond the machine fail inside XLA's allocator; stand that failure in for real
    # (a real one would need tens of GiB that CI does not have)
    import sys

    import jax

    import tianjax.train  # noqa: F401 - the module (the package's `train` is the function)

    def exhausted(*args, **kwargs):
        raise jax.errors.JaxRuntimeError(
            "RESOURCE_EXHAUSTED: Out of memory allocating 562002753792 bytes.\nmore"
        )

    monkeypatch.setattr(sys.modules["tianjax.train"], "train", exhausted)
    assert main(["train", CFG, "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        (
            "tianjax: error: RESOURCE_EXHAUSTED: Out of memory allocating 562002753792 bytes; "
            "lower num_envs, rollout_len or the network size"
        )
    ]


def _train_cli(tmp_path, env_extra: dict) -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TIANJAX_COMPILE_CACHE"}
    env.update(env_extra)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tianjax",
            "train",
            CFG,
            "num_envs=2",
            "rollout_len=8",
            "total_env_steps=64",
            "ppo.num_minibatches=1",
            "target_return=null",
            f"run_dir={tmp_path / 'run'}",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]


def test_train_cli_caches_its_programs_unless_told_off(tmp_path):
    """`tianjax train` is a process of tianjax's own: without a key or variable it compiles
    into the user cache directory ($XDG_CACHE_HOME/tianjax/xla), and "off" writes nothing."""
    on, off = tmp_path / "on", tmp_path / "off"
    _train_cli(on, {"XDG_CACHE_HOME": str(on / "cache")})
    assert any((on / "cache" / "tianjax" / "xla").iterdir())
    _train_cli(off, {"XDG_CACHE_HOME": str(off / "cache"), "TIANJAX_COMPILE_CACHE": "off"})
    assert not (off / "cache").exists()
