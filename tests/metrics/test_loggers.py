"""The logger protocol: a user's `module:Class` gets the config, every record and the
summary; TensorBoard holds the config as hparams; W&B offline holds the records."""

import json
import os
import sys
import textwrap
import time

import pytest

import tianjax
from tianjax.config import ConfigError, load_config

TINY = [
    "total_env_steps=2048",
    "num_envs=4",
    "rollout_len=16",
    "eval.episodes=0",
    "ppo.num_minibatches=2",
]

USER_LOGGER = """
CALLS = []

class Collect:
    def start(self, config, run_dir):
        CALLS.append(("start", config.algo, run_dir))
    def record(self, record):
        CALLS.append(("record", record["env_steps"]))
    def summary(self, summary):
        CALLS.append(("summary", summary["env_steps"]))
    def close(self):
        CALLS.append(("close",))
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_logs.py").write_text(textwrap.dedent(USER_LOGGER))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_logs"
    sys.modules.pop("my_logs", None)


def test_a_users_logger_gets_config_records_and_summary(tmp_path, user_module):
    run = tmp_path / "run"
    tianjax.train(
        "ppo_cartpole",
        [*TINY, "loggers=[my_logs:Collect]"],
        run_dir=run,
        verbose=False,
        progress=False,
    )
    calls = sys.modules["my_logs"].CALLS
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert calls[0] == ("start", "ppo", str(run))
    recorded = [c[1] for c in calls if c[0] == "record"]
    assert recorded == [r["env_steps"] for r in records] == list(range(64, 2049, 64))
    assert calls[-2:] == [("summary", 2048), ("close",)]
    assert not (run / "tb").exists()  # only the loggers named


def test_a_bad_logger_name_fails_before_the_run(tmp_path, user_module):
    with pytest.raises(ConfigError, match="config key 'loggers'"):
        load_config("ppo_cartpole", ["loggers=[tensorbord]"])
    with pytest.raises(ConfigError, match="config key 'loggers': module 'my_logs' has no 'Nope'"):
        tianjax.train(
            "ppo_cartpole", [*TINY, "loggers=[my_logs:Nope]"], run_dir=tmp_path / "r", verbose=False
        )
    assert not (tmp_path / "r").exists()


def test_the_console_logger_prints_a_line_per_record(tmp_path, capsys):
    tianjax.train(
        "ppo_cartpole",
        [*TINY, "loggers=[console]"],
        run_dir=tmp_path / "run",
        verbose=False,
        progress=False,
    )
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("tianjax: ")]
    assert len(lines) == 32 and lines[-1].startswith("tianjax: 2,048/2,048 env steps  return ")


def test_tensorboard_holds_the_config_as_hparams(tmp_path):
    from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData

    from tests.metrics.test_tensorboard import read_events

    run = tmp_path / "run"
    tianjax.train("ppo_cartpole", TINY, run_dir=run, verbose=False, progress=False)
    (events,) = sorted((run / "tb").glob("*tfevents*"))  # one file: records and hparams together
    values = [v for ev in read_events(events) for v in ev.summary.value]
    tags = {v.tag for v in values}
    assert {
        "return/mean_100",
        "summary/final_return",
        "_hparams_/experiment",
        "_hparams_/session_start_info",
    } <= tags
    start = next(v for v in values if v.tag == "_hparams_/session_start_info")
    hp = HParamsPluginData.FromString(start.metadata.plugin_data.content).session_start_info.hparams
    assert (
        hp["ppo.lr"].number_value == pytest.approx(2.5e-4)
        and hp["env"].string_value == "CartPole-v1"
    )
    assert hp["total_env_steps"].number_value == 2048
    assert "runtime.publish_every" not in hp  # a fused run reads no runtime section


def wandb_log_records(path):
    """The records of a .wandb file: a 7-byte header (":W&B", magic, version), then LevelDB's
    log format: 32 KiB blocks of chunks, each with a 7-byte header (crc32, u16 length, type:
    1 full, 2 first, 3 middle, 4 last); a block's last < 7 bytes are padding."""
    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    pos, out, part = 7, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if kind == 0:  # zero padding to the end of the block
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            part = chunk
        elif kind == 3:
            part += chunk
        elif kind == 4:
            out.append(part + chunk)
    return out


def test_wandb_offline_run_holds_the_records(tmp_path, monkeypatch):
    pytest.importorskip(
        "wandb",
        reason='wandb is not installed (pip install -e ".[wandb]"; the [test] extra has it)',
    )
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    tianjax.train(
        "ppo_cartpole",
        [*TINY, "loggers=[wandb]", "wandb.project=tianjax-test", "wandb.tags=[ci]"],
        run_dir=run,
        verbose=False,
        progress=False,
    )
    offline = [d for d in (run / "wandb").iterdir() if d.name.startswith("offline-run-")]
    assert len(offline) == 1
    # the offline run's .wandb file (what `wandb sync` uploads) holds every record
    from wandb.proto import wandb_internal_pb2

    (path,) = offline[0].glob("*.wandb")

    def parsed():
        out = []
        for data in wandb_log_records(path):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(data)
            out.append(rec)
        return out

    # NOTE: W&B's service process writes the file and closes its last block after finish()
    # returns (at the latest when this process exits): wait for the run's exit record
    deadline = time.monotonic() + 60
    while (
        not any(r.WhichOneof("record_type") == "exit" for r in parsed())
        and time.monotonic() < deadline
    ):
        time.sleep(0.2)
    history = [
        {
            item.key or "/".join(item.nested_key): json.loads(item.value_json)
            for item in r.history.item
        }
        for r in parsed()
        if r.WhichOneof("record_type") == "history"
    ]
    steps = [h["env_steps"] for h in history if "env_steps" in h]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [r["env_steps"] for r in records] == list(range(64, 2049, 64))
    assert all(h["loss"] == pytest.approx(r["loss"]) for h, r in zip(history, records))
    assert os.environ["WANDB_MODE"] == "offline"


FULL_DISK_LOGGER = """
import errno

class FailsToClose:
    def start(self, config, run_dir):
        pass
    def record(self, record):
        pass
    def summary(self, summary):
        pass
    def close(self):
        raise OSError(errno.ENOSPC, "No space left on device")
"""


def test_a_logger_that_cannot_close_for_the_runs_own_reason_is_not_reported_twice(
    tmp_path, monkeypatch, capsys
):
    import errno

    from tianjax.metrics.loggers import Loggers

    (tmp_path / "full_disk_logs.py").write_text(textwrap.dedent(FULL_DISK_LOGGER))
    monkeypatch.syspath_prepend(str(tmp_path))
    config = load_config("ppo_cartpole", ["loggers=[full_disk_logs:FailsToClose]"])

    def closed_after(failing):
        loggers = Loggers(config, str(tmp_path), config.loggers)
        loggers.record({"env_steps": 1})
        loggers.close(failing)
        return capsys.readouterr().err

    disk_full = RuntimeError("checkpoint failed")
    disk_full.__cause__ = OSError(errno.ENOSPC, "No space left on device")
    assert closed_after(disk_full) == ""  # the run's own error line says it
    for failing in (None, ValueError("a NaN"), OSError(errno.EMFILE, "Too many open files")):
        err = closed_after(
            failing
        )  # a finished run, or one failing for another reason: the logger's failure is news
        assert (
            err.count("\n") == 1
            and "logger 'full_disk_logs:FailsToClose' failed in close (OSError:" in err
        ), err
    sys.modules.pop("full_disk_logs", None)
