"""The run recorder every runner keeps its record with (runtime/recorder.py), on a
hand-made clock."""

from pathlib import Path

from tianjax.config import load_config
from tianjax.runtime.recorder import RunRecorder

CONFIG = str(Path(__file__).resolve().parents[1] / "configs" / "ppo_cartpole.yaml")


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
    assert list(out) == ["env_steps", "updates", "wall_time_s", "env_steps_per_s", "r", "return_mean_100",
                         "episodes", "loss"]
    assert out["wall_time_s"] == 114.0 and out["env_steps_per_s"] == 100.0
    assert out["return_mean_100"] == 8.0 and out["episodes"] == 2 and logger.records == [out]
    rec.end_training(70.0)
    result = rec.result(params=None, algo=None, env=None, env_steps=1400, updates=7, skipped_updates=0,
                        compile_time_s=1.0, interrupted=False, extra_summary={})
    assert result["env_steps"] == 2800 and result["env_steps_per_s"] == 80.0  # both seeds' steps
    assert result["final_return_per_seed"] == [12.0, 4.0] and result["wall_offset_s"] == 100.0
