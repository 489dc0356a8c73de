"""Shared by the experiment scripts: run a config quietly and keep its summary."""

from __future__ import annotations

import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tianjax  # noqa: E402


def run(config: str, overrides: list[str], keep_dir: str | None = None) -> dict:
    """Trains `config` with `overrides`; returns summary.json's dict (plus the metrics
    columns, TrainResult.metrics)."""
    with tempfile.TemporaryDirectory() as d:
        r = tianjax.train(config, overrides, run_dir=keep_dir or d, progress=False, verbose=False)
    return dict(r.summary, metrics=r.metrics)


def records_of(columns: dict) -> list[dict]:
    """TrainResult.metrics (columns, NaN where a record lacked a number) back to records."""
    n = len(next(iter(columns.values()), []))
    out = []
    for i in range(n):
        rec = {}
        for k, col in columns.items():
            v = col[i]
            v = v.item() if hasattr(v, "item") else v
            rec[k] = None if isinstance(v, float) and v != v else v
        out.append(rec)
    return out


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v, spec=",.0f"):
    return "-" if v is None else format(v, spec)


def summarise(runs: list[dict]) -> dict:
    """Medians of each measured key over repeats, and how many of them reached the target."""
    numeric = [
        k
        for k in runs[0]
        if all(
            isinstance(r.get(k), (int, float, type(None))) and not isinstance(r.get(k), bool)
            for r in runs
        )
    ]
    out = {key: median([r[key] for r in runs]) for key in numeric}
    out["reached"] = sum(r["conv"] is not None for r in runs)
    return out


def ratio(num, den):
    return num / den if num and den else None
