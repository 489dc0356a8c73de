"""`tianjax report RUN_DIR ...`: figures and a summary table that compare finished runs.

Reads what a run directory holds (config.yaml, metrics.jsonl, summary.json; see
tianjax.metrics.logger) and writes, into one output directory:

- return_vs_time.png, return_vs_steps.png: the 100-episode moving-average return against
  wall-clock time and against env steps, one curve per run (the TianJi paper's comparison),
  and beside it, dashed in the run's colour, its evaluation curve where it evaluated
  (`eval_return` of each evaluation, at the version's env steps and time);
- throughput.png: env steps/s and samples consumed/s over time;
- staleness.png: each run's staleness histogram (sync and async runs; fused and in-process
  runs have none and are left out);
- balance.png: production rate p and consumption rate c over time (distributed runs);
- report.md: one table row per run with the PNGs linked.

A figure without data in any run is not written, nor a panel without data; curves have
markers (a run of one record is a point) and the return figures draw the target as a
dashed line. A run without records or summary is named under "Notes". Table numbers are rounded as follows
(ROUNDING, also stated under the table), and a missing value (target not reached, a
metric the mode does not measure) is "-": convergence time 1 decimal, env steps to target
exact, final return 2 decimals, throughputs to the nearest integer.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, NamedTuple

import yaml
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


class ReportError(Exception):
    """Bad input to the report (not a run directory, no runs): a one-line message."""


class Run(NamedTuple):
    name: str
    path: str
    config: dict
    summary: dict  # empty when the run did not finish
    records: list[dict]

    @property
    def mode(self) -> str:
        return str(self.summary.get("mode") or self.config.get("mode") or "?")

    @property
    def label(self) -> str:
        return self.name  # the mode is in the table: "sync (sync)" told nothing

    def notes(self) -> list[str]:
        """What a reader should know before the numbers: a run with no records, or none summary."""
        out = []
        if not self.records:
            out.append(
                "no metrics records (it stopped before its first record), so it is in no figure"
            )
        if not self.summary:
            out.append("no summary.json (it did not finish), so its row is empty")
        return out

    def target(self, key: str = "target_return") -> float | None:
        v = self.summary.get(key, self.config.get(key))
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


# (summary key, column header, decimals; None = text, 0 = integer)
COLUMNS = [
    ("run", "run", None),
    ("mode", "mode", None),
    ("algo", "algo", None),
    ("env", "env", None),
    ("convergence_time_s", "convergence time (s)", 1),
    ("convergence_env_steps", "env steps to target", 0),
    ("final_return", "final return", 2),
    ("final_win_rate", "final win rate", 2),
    ("eval_return", "final eval return", 2),
    ("eval_best_return", "best eval return", 2),
    ("env_steps_per_s", "env steps/s", 0),
    ("samples_fresh_per_s", "fresh samples/s", 0),
    ("samples_consumed_per_s", "samples consumed/s (reuse incl.)", 0),
    ("reuse_fraction", "reuse fraction", 2),
    ("learner_busy_fraction", "learner busy fraction", 2),
    ("actor_wait_fraction", "actor wait fraction", 2),
]
ROUNDING = (
    "convergence time to 0.1 s; env steps to target exact; returns and win rate to 2 decimals; "
    "throughputs to the nearest integer; '-' = not reached or not measured"
)


def _read_json(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ReportError(f"cannot read {path}: {e}") from None


def _read_records(path: str) -> list[dict]:
    out = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a torn last line of a run that was killed
                if isinstance(rec, dict):
                    out.append(rec)
    return out


def load_run(path: str | os.PathLike) -> Run:
    path = os.path.abspath(path)
    if not os.path.isdir(path):
        raise ReportError(f"run directory {str(path)!r} does not exist")
    has = {
        f: os.path.exists(os.path.join(path, f))
        for f in ("config.yaml", "metrics.jsonl", "summary.json")
    }
    if not has["config.yaml"] or not (has["metrics.jsonl"] or has["summary.json"]):
        raise ReportError(
            f"{str(path)!r} is not a run directory (it needs config.yaml and "
            "metrics.jsonl or summary.json)"
        )
    try:
        with open(os.path.join(path, "config.yaml")) as f:
            config = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ReportError(f"cannot read {os.path.join(path, 'config.yaml')}: {e}") from None
    summary = _read_json(os.path.join(path, "summary.json")) if has["summary.json"] else {}
    if not isinstance(config, dict) or not isinstance(summary, dict):
        raise ReportError(
            f"{str(path)!r} is not a run directory (config or summary is not a mapping)"
        )
    return Run(
        os.path.basename(path),
        path,
        config,
        summary,
        _read_records(os.path.join(path, "metrics.jsonl")),
    )


def load_runs(paths) -> list[Run]:
    if not paths:
        raise ReportError("report: give at least one run directory (tianjax report RUN_DIR ...)")
    runs = [load_run(p) for p in paths]
    names = [r.name for r in runs]
    if len(set(names)) < len(names):  # same basename in different places: add the parent
        runs = [
            r._replace(name=os.path.join(os.path.basename(os.path.dirname(r.path)), r.name))
            for r in runs
        ]
    return runs


def table_rows(runs: list[Run]) -> list[dict]:
    """One dict per run with the table's columns, unrounded (None where missing)."""
    rows = []
    for r in runs:
        row = {"run": r.name, "mode": r.mode}
        for key, _, _ in COLUMNS[2:]:
            row[key] = r.summary.get(key, r.config.get(key) if key in ("algo", "env") else None)
        rows.append(row)
    return rows


def format_cell(value, decimals: int | None) -> str:
    if value is None:
        return "-"
    if decimals is None:
        return str(value).replace("|", "\\|")
    return f"{float(value):.{decimals}f}"


def markdown_table(rows: list[dict]) -> str:
    lines = [
        "| " + " | ".join(h for _, h, _ in COLUMNS) + " |",
        "|" + "|".join("---" if d is None else "---:" for _, _, d in COLUMNS) + "|",
    ]
    for row in rows:
        lines.append("| " + " | ".join(format_cell(row[k], d) for k, _, d in COLUMNS) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- figures
def _series(run: Run, x: str, y: str) -> tuple[list, list]:
    pts = [
        (r[x], r[y])
        for r in run.records
        if isinstance(r.get(x), (int, float)) and isinstance(r.get(y), (int, float))
    ]
    return [p[0] for p in pts], [p[1] for p in pts]


def _save(fig: Figure, out_dir: str, name: str) -> str:
    FigureCanvasAgg(fig)  # the Agg canvas: no GUI backend, no global pyplot state
    fig.tight_layout()
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=100)
    return path


def _line_figure(
    runs, panels, xlabel: str, title: str, target: str | None = None, beside: dict | None = None
) -> Figure | None:
    """panels: [(x key, y key, y label)]; one subplot for each panel that some run has data
    for, one curve per run with data, with markers (a run of one record is a point).
    `target`: the summary/config key of a target drawn as a dashed line (per distinct value).
    `beside`: y key -> (another y key, its label suffix) drawn dashed beside it, in the
    run's colour (the evaluation curve beside the training one)."""
    beside = beside or {}
    panels = [
        p
        for p in panels
        if any(
            _series(run, p[0], p[1])[0]
            or (p[1] in beside and _series(run, p[0], beside[p[1]][0])[0])
            for run in runs
        )
    ]
    if not panels:
        return None
    fig = Figure(figsize=(7, 3.2 * len(panels)))
    for i, (x, y, ylabel) in enumerate(panels):
        ax = fig.add_subplot(len(panels), 1, i + 1)
        for j, run in enumerate(runs):
            xs, ys = _series(run, x, y)
            if xs:  # a run keeps its colour across figures
                ax.plot(
                    xs,
                    ys,
                    label=run.label,
                    color=f"C{j}",
                    marker="o",
                    markersize=3 if len(xs) > 40 else 5,
                )
            if y in beside:
                xs, ys = _series(run, x, beside[y][0])
                if xs:
                    ax.plot(
                        xs,
                        ys,
                        label=f"{run.label} {beside[y][1]}",
                        color=f"C{j}",
                        linestyle="--",
                        marker="s",
                        markersize=4,
                    )
        targets = (
            sorted({t for run in runs if (t := run.target(target)) is not None}) if target else []
        )
        for t in targets:
            ax.axhline(t, color="grey", linestyle="--", linewidth=1, label=f"target {t:g}")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(title)
    return fig


def _staleness_figure(runs) -> Figure | None:
    hists = [
        (j, r, {int(k): int(v) for k, v in r.summary["staleness_histogram"].items()})
        for j, r in enumerate(runs)
        if isinstance(r.summary.get("staleness_histogram"), dict)
    ]
    hists = [(j, r, h) for j, r, h in hists if sum(h.values()) > 0]
    if not hists:
        return None
    fig = Figure(figsize=(7, 3.5))
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / len(hists)
    for i, (j, run, h) in enumerate(hists):
        total = sum(h.values())
        taus = sorted(h)
        ax.bar(
            [t - 0.4 + width * (i + 0.5) for t in taus],
            [h[t] / total for t in taus],
            width=width,
            label=run.label,
            color=f"C{j}",
        )
    ax.set_xlabel("staleness tau (learner version - behaviour version)")
    ax.set_ylabel("fraction of consumed samples")
    ax.set_title("Staleness of consumed samples")
    ax.legend(fontsize="small")
    return fig


# the evaluation curve beside the training one (tianjax.runtime.record.evaluations)
EVAL_BESIDE = {"return_mean_100": ("eval_return", "(eval)")}

FIGURES = {  # file -> (caption, builder)
    "return_vs_time.png": (
        "Return against wall-clock time",
        lambda runs: _line_figure(
            runs,
            [("wall_time_s", "return_mean_100", "return (mean of 100)")],
            "wall-clock time (s)",
            "Return against wall-clock time",
            target="target_return",
            beside=EVAL_BESIDE,
        ),
    ),
    "return_vs_steps.png": (
        "Return against env steps",
        lambda runs: _line_figure(
            runs,
            [("env_steps", "return_mean_100", "return (mean of 100)")],
            "env steps",
            "Return against env steps",
            target="target_return",
            beside=EVAL_BESIDE,
        ),
    ),
    "win_rate_vs_steps.png": (
        "Win rate against env steps (envs that report wins)",
        lambda runs: _line_figure(
            runs,
            [("env_steps", "win_rate_100", "win rate (last 100 episodes)")],
            "env steps",
            "Win rate against env steps",
            target="target_win_rate",
        ),
    ),
    "throughput.png": (
        "Throughput over time",
        lambda runs: _line_figure(
            runs,
            [
                ("wall_time_s", "env_steps_per_s", "env steps/s"),
                ("wall_time_s", "samples_fresh_per_s", "fresh samples/s"),
                ("wall_time_s", "samples_consumed_per_s", "samples consumed/s (reuse incl.)"),
            ],
            "wall-clock time (s)",
            "Throughput",
        ),
    ),
    "staleness.png": ("Staleness histogram", _staleness_figure),
    "balance.png": (
        "Production rate p and consumption rate c",
        lambda runs: _line_figure(
            runs,
            [
                ("wall_time_s", "production_rate", "p (samples/s)"),
                ("wall_time_s", "consumption_rate", "c (samples/s)"),
            ],
            "wall-clock time (s)",
            "Balance: production p and consumption c",
        ),
    ),
    "controller.png": (
        "Balance controller: set-point, measurement and actions",
        lambda runs: _line_figure(
            runs,
            [
                ("wall_time_s", "balance_target_staleness", "target staleness (set-point)"),
                ("wall_time_s", "balance_staleness_measured", "measured staleness (per period)"),
                ("wall_time_s", "balance_window", "credit window (trajectories)"),
                ("wall_time_s", "balance_publish_every", "publish_every"),
                ("wall_time_s", "balance_max_reuse", "reuse budget"),
            ],
            "wall-clock time (s)",
            "Balance controller",
        ),
    ),
}


# ----------------------------------------------------------------------------- the report
class Report(NamedTuple):
    out_dir: str
    markdown: str  # path of report.md
    figures: list[str]  # paths of the PNGs written
    rows: list[dict]  # table_rows(): unrounded
    notes: list[str] = []  # "- RUN: ..." lines: runs without records or summary


def default_out_dir(run_dirs) -> str:
    """One run: its report/ subdirectory; several: reports/report_<time> here."""
    if len(run_dirs) == 1:
        return os.path.join(os.path.abspath(run_dirs[0]), "report")
    return os.path.abspath(os.path.join("reports", f"report_{time.strftime('%Y%m%d-%H%M%S')}"))


def write_report(run_dirs, out_dir: str | None = None) -> Report:
    runs = load_runs(list(run_dirs))
    out_dir = os.path.abspath(out_dir or default_out_dir(run_dirs))
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise ReportError(f"cannot create output directory {out_dir!r}: {e.strerror}") from None
    figures, links = [], []
    for name, (caption, build) in FIGURES.items():
        fig = build(runs)
        if fig is not None:
            figures.append(_save(fig, out_dir, name))
            links.append(f"### {caption}\n\n![{caption}]({name})\n")
    rows = table_rows(runs)
    notes = [f"- {r.name}: {note}" for r in runs for note in r.notes()]
    text = "\n".join(
        [
            "# tianjax report",
            "",
            f"{len(runs)} run(s), generated {time.strftime('%Y-%m-%d %H:%M:%S')}.",
            "",
            markdown_table(rows),
            "",
            f"Rounding: {ROUNDING}.",
            "",
            *(["## Notes", "", *notes, ""] if notes else []),
            "## Figures",
            "",
            *links,
            # paths relative to the report, so that a report moved with its runs still points at them
            "## Runs",
            "",
            *[f"- {r.label}: `{os.path.relpath(r.path, out_dir)}`" for r in runs],
            "",
        ]
    )
    markdown = os.path.join(out_dir, "report.md")
    with open(markdown, "w") as f:
        f.write(text)
    return Report(out_dir, markdown, figures, rows, notes)


__all__ = [
    "COLUMNS",
    "EVAL_BESIDE",
    "FIGURES",
    "ROUNDING",
    "Report",
    "ReportError",
    "Run",
    "default_out_dir",
    "format_cell",
    "load_run",
    "load_runs",
    "markdown_table",
    "table_rows",
    "write_report",
]
