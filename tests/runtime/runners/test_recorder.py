"""The run recorder every runner keeps its record with (runtime/recorder.py), and the
learner's watch on arrivals (runtime/watchdog.py), on hand-made clocks."""

from pathlib import Path

import pytest

from tianjax.config import load_config
from tianjax.errors import LearnerStalled
from tianjax.runtime.learner.watchdog import ArrivalWatch
from tianjax.runtime.record.recorder import RunRecorder

CONFIG = str(Path(__file__).resolve().parents[3] / "configs" / "ppo_cartpole.yaml")


class _Logger:
    def __init__(self):
        self.records = []

    def log(self, record):
        self.records.append(record)


def test_records_open_with_the_common_fields_and_a_resumed_clock_goes_on():
    logger = _Logger()
    rec = RunRecorder(load_config(CONFIG, ["target_return=10"]), logger, seeds=2)
    rec.wall_offset = 100.0  # as a resume sets it
    rec.start(50.0)
    rec.training(60.0, env_steps=1000)
    rec.add([12.0], 1100, 61.0, seed=0)
    rec.add([4.0], 1200, 62.0, seed=1)
    out = rec.record(1400, 7, 64.0, rates={"r": 1.0}, fields={"loss": 0.5})
    assert list(out) == [
        "env_steps",
        "updates",
        "wall_time_s",
        "env_steps_per_s",
        "r",
        "return_mean_100",
        "episodes",
        "loss",
    ]
    assert out["wall_time_s"] == 114.0 and out["env_steps_per_s"] == 100.0
    assert out["return_mean_100"] == 8.0 and out["episodes"] == 2 and logger.records == [out]
    rec.end_training(70.0)
    result = rec.result(
        params=None,
        algo=None,
        env=None,
        env_steps=1400,
        updates=7,
        skipped_updates=0,
        compile_time_s=1.0,
        interrupted=False,
        extra_summary={},
    )
    assert result.env_steps == 2800 and result.env_steps_per_s == 80.0  # both seeds' steps
    assert result.final_return_per_seed == [12.0, 4.0] and result.wall_offset_s == 100.0


def test_the_watch_says_so_while_no_actor_registered_then_stalls(capsys):
    watch = ArrivalWatch(connect_timeout_s=10.0, heartbeat_timeout_s=3.0)
    watch.start(0.0)
    watch.check(4.0, received=0, actors=0, started=False)
    assert capsys.readouterr().err == ""
    watch.check(6.0, received=0, actors=0, started=False)  # halfway through the wait
    assert "no actor has connected after 6 s" in capsys.readouterr().err
    watch.check(8.0, received=1, actors=1, started=True)
    watch.check(10.5, received=0, actors=1, started=True)
    with pytest.raises(LearnerStalled, match="for 3 s"):
        watch.check(11.5, received=0, actors=1, started=True)
