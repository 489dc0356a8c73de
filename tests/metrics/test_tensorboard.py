"""TensorBoard events: what RunLogger logs is what the event files hold, read back with our
own TFRecord reader (u64 length, u32 masked crc, data, u32 masked crc)."""

import struct
from pathlib import Path

import numpy as np
import pytest
from tensorboardX.proto.event_pb2 import Event
from tensorboardX.record_writer import masked_crc32c

from tianjax.config import load_config
from tianjax.metrics import RunLogger
from tianjax.metrics.tensorboard import tag_for
from tianjax.runtime.balance.limits import Limits


def read_events(path: Path) -> list[Event]:
    data, events, i = path.read_bytes(), [], 0
    while i < len(data):
        header = data[i : i + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[i + 8 : i + 12])
        assert header_crc == masked_crc32c(header)
        body = data[i + 12 : i + 12 + length]
        (body_crc,) = struct.unpack("<I", data[i + 12 + length : i + 16 + length])
        assert body_crc == masked_crc32c(body)
        events.append(Event.FromString(body))
        i += 16 + length
    assert i == len(data)  # no torn record at the end
    return events


def tb_contents(run_dir: Path):
    """({(tag, step): value} of scalars, [(step, limits, counts)] of histograms, files)."""
    files = sorted((run_dir / "tb").glob("*tfevents*"))
    scalars, hists = {}, []
    for f in files:
        for ev in read_events(f):
            for v in ev.summary.value:
                if v.HasField("histo"):
                    hists.append((ev.step, list(v.histo.bucket_limit), list(v.histo.bucket)))
                else:
                    assert (v.tag, ev.step) not in scalars
                    scalars[(v.tag, ev.step)] = v.simple_value
    return scalars, hists, files


RECORDS = [
    {
        "env_steps": 1024,
        "updates": 1,
        "wall_time_s": 2.5,
        "return_mean_100": float("nan"),
        "env_steps_per_s": 410.0,
        "samples_consumed_per_s": 820.0,
        "staleness_mean": 0.25,
        "staleness_max": 1,
        "production_rate": 400.0,
        "consumption_rate": 800.0,
        "dropped_samples": 0,
        "rejected_messages": 0,
        "policy_loss": np.float32(-0.125),
        "entropy": 0.69,
        "my_metric": 7,
        "mode": "async",
        "balance": {"p": 1.0},
        "flag": True,
        "staleness_hist": [768, 256],
    },
    {
        "env_steps": np.int64(2048),
        "updates": 2,
        "wall_time_s": 4.0,
        "return_mean_100": 21.5,
        "env_steps_per_s": 512.0,
        "samples_consumed_per_s": 1024.0,
        "staleness_mean": 1.5,
        "staleness_max": 3,
        "production_rate": 500.0,
        "consumption_rate": 1000.0,
        "dropped_samples": 64,
        "rejected_messages": 2,
        "policy_loss": -0.25,
        "entropy": 0.68,
        "my_metric": 8,
        "staleness_hist": [0, 512, 0, 512],
    },
    {"env_steps": 3072, "return_mean_100": float("inf"), "staleness_hist": []},
]


def test_run_logger_writes_every_finite_scalar_under_its_tag(tmp_path):
    log = RunLogger(load_config(None), str(tmp_path / "run"))
    for r in RECORDS:
        log.log(r)
    log.close()
    scalars, hists, files = tb_contents(tmp_path / "run")
    assert len(files) == 1

    expected = {}
    for r in RECORDS:
        for k, v in r.items():
            if k in ("env_steps", "mode", "balance", "flag", "staleness_hist") or not np.isfinite(
                v
            ):
                continue
            expected[(tag_for(k), int(r["env_steps"]))] = float(v)
    assert set(scalars) == set(expected)
    for key, v in expected.items():
        assert scalars[key] == pytest.approx(v, rel=1e-6), key  # simple_value is a float32
    tags = {t for t, _ in scalars}
    assert {
        "return/mean_100",
        "throughput/env_steps_per_s",
        "throughput/samples_consumed_per_s",
        "staleness/mean",
        "staleness/max",
        "balance/p",
        "balance/c",
        "loss/policy_loss",
        "counts/dropped",
        "counts/rejected",
        "misc/my_metric",
    } <= tags
    assert ("return/mean_100", 1024) not in scalars  # NaN is skipped, not written

    # the interval histograms (the empty one is skipped): counts by tau, summing to the taus
    assert [(s, c) for s, _, c in hists] == [(1024, [768, 256]), (2048, [0, 512, 0, 512])]
    for (step, limits, counts), r in zip(hists, RECORDS):
        assert sum(counts) == sum(r["staleness_hist"])
        assert limits == [t + 0.5 for t in range(len(counts))]


def test_a_resumed_run_adds_an_event_file_to_the_same_dir(tmp_path):
    cfg = load_config(None)
    for part in (RECORDS[:1], RECORDS[1:2]):
        log = RunLogger(cfg, str(tmp_path / "run"))
        for r in part:
            log.log(r)
        log.close()
    scalars, hists, files = tb_contents(tmp_path / "run")
    assert len(files) == 2
    assert scalars[("throughput/env_steps_per_s", 1024)] == 410.0
    assert scalars[("throughput/env_steps_per_s", 2048)] == 512.0
    assert [s for s, _, _ in hists] == [1024, 2048]


def test_logger_without_tensorboard_writes_no_events(tmp_path):
    log = RunLogger(load_config(None), str(tmp_path / "run"), tensorboard=False)
    log.log(RECORDS[0])
    log.close()
    assert not (tmp_path / "run" / "tb").exists()


def test_interval_histogram_counts_consumed_taus_since_the_last_take():
    b = Limits(max_staleness=None, max_pool=4, max_reuse=0)
    assert b.measures.take_interval_histogram() == []
    b.measures.consumed_batch(np.array([0, 0, 2]), 3, now=0.0)
    b.measures.consumed_batch(np.array([[1, 2], [2, 2]]), 4, now=1.0)
    assert b.measures.take_interval_histogram() == [2, 1, 4]
    assert b.measures.take_interval_histogram() == []
    b.measures.consumed_batch(np.array([1]), 1, now=2.0)
    assert b.measures.take_interval_histogram() == [0, 1]
    assert b.measures.staleness_histogram() == {0: 2, 1: 2, 2: 4}  # the run total is unchanged
