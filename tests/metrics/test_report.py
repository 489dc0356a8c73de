"""`tianjax report` on two real runs (an in-process sync run and a 2-actor async run): the
figures are real PNGs, the table has one row per run that matches its summary.json within
the documented rounding, and bad input ends with one line and exit code 2."""

import json
from pathlib import Path

import matplotlib.image
import pytest

import tianjax
import tianjax.metrics.report
from tianjax.cli import main
from tianjax.metrics.report import COLUMNS, load_runs, table_rows

REPO = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"
# a low target, so that both short runs converge and every column has a number
SHORT = ["log_every=1", "target_return=15"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    out = {}
    for name, cfg, steps in [
        ("sync_run", "ppo_cartpole_gymnasium.yaml", 6144),
        ("async_run", "ppo_cartpole_async.yaml", 8192),
    ]:
        result = tianjax.train(
            str(REPO / "configs" / cfg),
            [f"total_env_steps={steps}", *SHORT],
            run_dir=str(base / name),
            progress=False,
            verbose=False,
        )
        out[name] = Path(result.run_dir)
    return out


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def parse_table(markdown: str) -> list[dict]:
    lines = [ln for ln in markdown.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == [h for _, h, _ in COLUMNS]
    keys = [k for k, _, _ in COLUMNS]
    return [dict(zip(keys, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines[2:]]


def check_cell(cell: str, value, decimals):
    if value is None:
        assert cell == "-"
    elif decimals is None:
        assert cell == str(value)
    else:
        assert abs(float(cell) - value) <= 0.5 * 10.0**-decimals + 1e-9, (cell, value)
        assert cell == f"{float(cell):.{decimals}f}"  # always the same number of decimals


def test_report_figures_and_table_match_the_runs(runs, tmp_path, capsys):
    dirs = [runs["sync_run"], runs["async_run"]]
    out = tmp_path / "report"
    assert main(["report", *map(str, dirs), "--out", str(out)]) == 0
    assert str(out / "report.md") in capsys.readouterr().out

    figures = [
        "return_vs_time.png",
        "return_vs_steps.png",
        "throughput.png",
        "staleness.png",
        "balance.png",
        "controller.png",
    ]
    text = (out / "report.md").read_text()
    for name in figures:
        data = (out / name).read_bytes()
        assert data.startswith(PNG), name
        img = matplotlib.image.imread(out / name)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100, name
        assert f"]({name})" in text, name  # linked from the report

    rows = parse_table(text)
    assert [r["run"] for r in rows] == ["sync_run", "async_run"]
    data_rows = table_rows(load_runs(dirs))
    for row, data, run_dir in zip(rows, data_rows, dirs):
        s = summary(run_dir)
        assert s["convergence_time_s"] is not None  # the low target was reached
        for key, _, decimals in COLUMNS[1:]:
            assert data[key] == s.get(key), key  # the rows as data are the summary's values
            check_cell(row[key], s.get(key), decimals)
    assert rows[0]["mode"] == "sync" and rows[1]["mode"] == "async"
    for row in rows:  # every mode counts fresh and consumed samples
        assert row["samples_fresh_per_s"] != "-" and row["samples_consumed_per_s"] != "-"


def test_async_run_logs_interval_staleness_and_tensorboard_events(runs):
    run_dir = runs["async_run"]
    s = summary(run_dir)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # the per-record histograms partition the run's consumed samples by tau
    total = [0] * (s["staleness_max"] + 1)
    for r in records:
        for tau, n in enumerate(r["staleness_hist"]):
            total[tau] += n
    assert sum(total) == s["balance"]["samples_consumed"]
    assert {int(k): v for k, v in s["staleness_histogram"].items()} == {
        t: n for t, n in enumerate(total) if n
    }
    for run in runs.values():
        events = list((run / "tb").glob("*tfevents*"))
        assert len(events) == 1 and events[0].stat().st_size > 0


def test_one_run_reports_into_its_own_dir_without_the_figures_it_lacks(runs, capsys):
    run_dir = runs["sync_run"]
    assert main(["report", str(run_dir)]) == 0
    out = run_dir / "report"
    assert str(out / "report.md") in capsys.readouterr().out
    assert (out / "return_vs_time.png").read_bytes().startswith(PNG)
    # no staleness histogram, no p and c: the in-process trainer has neither
    assert not (out / "staleness.png").exists() and not (out / "balance.png").exists()
    assert not (out / "controller.png").exists()
    assert len(parse_table((out / "report.md").read_text())) == 1


@pytest.mark.parametrize("case", ["missing", "empty", "no_runs", "one_bad"])
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, capsys, case):
    (tmp_path / "empty").mkdir()
    (tmp_path / "good").mkdir()
    (tmp_path / "good" / "config.yaml").write_text("mode: sync\n")
    (tmp_path / "good" / "metrics.jsonl").write_text("")
    args = {
        "missing": [str(tmp_path / "nope")],
        "empty": [str(tmp_path / "empty")],
        "no_runs": [],
        "one_bad": [str(tmp_path / "good"), str(tmp_path / "empty")],
    }[case]
    assert main(["report", *args, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("tianjax: error: "), err
    assert "Traceback" not in err
    assert not (tmp_path / "out" / "report.md").exists()


def _fake_run(
    base: Path, name: str, records: list[dict], summary: dict | None, config: dict
) -> Path:
    d = base / name
    d.mkdir()
    (d / "config.yaml").write_text(json.dumps(config))  # JSON is YAML
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))
    return d


def test_figures_have_markers_the_target_no_empty_panels_and_names_as_labels(tmp_path):
    from tianjax.metrics.report import FIGURES

    cfg = {"mode": "fused", "algo": "ppo", "env": "CartPole-v1", "target_return": 475}
    one = _fake_run(
        tmp_path,
        "one_record",
        [{"env_steps": 512, "wall_time_s": 1.0, "return_mean_100": 20.0, "env_steps_per_s": 900.0}],
        {"mode": "fused"},
        cfg,
    )
    none = _fake_run(tmp_path, "no_records", [], None, dict(cfg, mode="sync"))
    runs = load_runs([one, none])
    fig = FIGURES["return_vs_steps.png"][1](runs)
    (ax,) = fig.axes
    curve, target = ax.get_lines()
    assert (
        curve.get_label() == "one_record"
        and list(curve.get_xdata()) == [512]
        and curve.get_marker() == "o"
    )
    assert list(target.get_ydata()) == [475, 475] and target.get_linestyle() == "--"
    # a fused run measures env steps/s only: one panel, not three with two empty
    assert len(FIGURES["throughput.png"][1](runs).axes) == 1
    assert FIGURES["balance.png"][1](runs) is None
    report = tianjax.metrics.report.write_report([one, none], tmp_path / "out")
    text = Path(report.markdown).read_text()
    assert "- no_records: no metrics records (it stopped before its first record)" in text
    assert "- no_records: no summary.json (it did not finish)" in text
    assert "(sync)" not in text and "one_record" in text
