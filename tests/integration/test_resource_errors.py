"""Resource errors end a run with one line, `tianjax: error: ...`, naming where: a full disk
(a small tmpfs as the run directory; the checkpoints before it stay whole and a resume
goes on from the newest), a port in use, descriptors exhausted; and the descriptor
reserve lends a checkpoint descriptors that peers left none of.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from tianjax.checkpoint import store as ckpt
from tianjax.runtime.process.resources import describe_os_error

from .conftest import REPO, child_env, free_port, free_port_block

FUSED_CFG = str(REPO / "configs" / "ppo_cartpole.yaml")


def _errors(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("tianjax: error:")]


@pytest.fixture
def small_disk(tmp_path):
    """A 1.5 MB tmpfs (needs the right to mount: root in a container or VM)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if (
        shutil.which("mount") is None
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1500k", "tmpfs", str(mnt)], capture_output=True
        ).returncode
    ):
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_full_disk_is_one_line_and_resume_goes_on_from_the_last_whole_checkpoint(
    small_disk, tmp_path
):
    run_dir = small_disk / "run"
    args = [
        FUSED_CFG,
        "checkpoint.every=5",
        "checkpoint.keep=100",
        "total_env_steps=200000",
        "--no-progress",
    ]
    p = subprocess.run(
        [sys.executable, "-m", "tianjax.cli", "train", *args[:-1], f"run_dir={run_dir}", args[-1]],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 1, p.stderr[-3000:]
    assert p.stderr.strip().splitlines() == _errors(p.stderr), p.stderr[
        -3000:
    ]  # one line, no traceback
    assert len(_errors(p.stderr)) == 1
    line = _errors(p.stderr)[0]
    assert (
        "no space left on the device" in line
        and str(run_dir) in line
        and f"resume={run_dir}" in line
    )
    steps = ckpt.Checkpointer(str(run_dir)).steps
    assert len(steps) >= 1
    assert not [
        n for n in os.listdir(ckpt.checkpoint_dir(str(run_dir))) if "tmp" in n
    ]  # half a step: removed
    last = ckpt.restore_latest(str(run_dir))[0]  # reads back whole (digest checked)
    assert last == max(steps)

    resumed = tmp_path / "resumed"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "tianjax.cli",
            "train",
            FUSED_CFG,
            f"resume={run_dir}",
            f"run_dir={resumed}",
            "total_env_steps=200000",
            "--no-progress",
        ],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads((resumed / "summary.json").read_text())
    assert summary["resumed_from_step"] == last and summary["updates"] > last


def test_port_in_use_is_one_line_naming_it(tmp_path):
    import socket

    base = free_port_block(3)
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", base + 1))  # the trajectory port of learner 0
    squatter.listen(1)
    try:
        env = child_env(TIANJAX_RUN_KEY=os.urandom(32).hex())
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "tianjax.cli",
                "launch",
                "--role",
                "learner",
                FUSED_CFG,
                "mode=sync",
                "env_backend=envpool",
                f"run_dir={tmp_path / 'run'}",
                "--coordinator",
                f"127.0.0.1:{free_port()}",
                "--num-processes",
                "1",
                "--process-id",
                "0",
                "--base-port",
                str(base),
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        squatter.close()
    assert p.returncode == 1, p.stderr[-3000:]
    errors = _errors(p.stderr)
    assert len(errors) == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert f"tcp://127.0.0.1:{base + 1}" in errors[0] and "already in use" in errors[0]


def test_descriptor_errors_are_described_and_the_reserve_lends_descriptors():
    line = describe_os_error(OSError(errno.EMFILE, "Too many open files"))
    assert line.startswith("out of file descriptors:") and "limit" in line
    assert describe_os_error(OSError(errno.ENOENT, "x")) is None
    # a process whose every descriptor is taken still opens files inside released()
    code = textwrap.dedent("""
        import os, resource
        from tianjax.runtime.process.resources import FdReserve
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        reserve = FdReserve(16)
        taken = []
        try:
            while True:
                taken.append(os.open(os.devnull, os.O_RDONLY))
        except OSError as e:
            assert e.errno == 24
        with reserve.released():
            lent = [os.open(os.devnull, os.O_RDONLY) for _ in range(16)]
        print(len(lent), len(reserve))
    """)
    p = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [
        "16",
        "0",
    ]  # lent all 16; the lent ones still held, nothing to take back
