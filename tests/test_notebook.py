"""experiments/examples/quickstart.ipynb runs end to end (on a tiny config) and is stored clean."""

import json
import math
import re
import sys
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "experiments" / "examples" / "quickstart.ipynb"
CELL_TIMEOUT_S = 600  # per cell; the training cell compiles and trains in well under this


def _kernel_manager(tmp_path: Path):
    """An async kernel manager whose 'python3' kernel is this interpreter.

    The default lookup of 'python3' can resolve to a kernelspec installed for some other
    Python (user or system Jupyter paths); a spec in a private directory, with an absolute
    argv, makes the kernel run in the environment that runs the tests. Its connection file
    is kept in the test's folder too: by default it goes to the system's temp folder, and
    outlives the kernel there.
    """
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    spec_dir = tmp_path / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (tests)",
        "language": "python",
        "env": {"MPLBACKEND": "Agg", "IPYTHONDIR": str(tmp_path / "ipython")},
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    ksm = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])
    return AsyncKernelManager(
        kernel_name="python3",
        kernel_spec_manager=ksm,
        connection_file=str(tmp_path / "kernel-connection.json"),
    )


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:  # ended meanwhile
        return []


def _cell(nb, cell_id: str):
    return next(c for c in nb.cells if c.get("id") == cell_id)


def _stdout(cell) -> str:
    return "".join(
        o.get("text", "") for o in cell.outputs if o.output_type == "stream" and o.name == "stdout"
    )


def test_notebook_is_stored_with_its_outputs():
    """Saved executed, as a reader opens it: every code cell ran once, in order, without an
    error, the learning curve is a picture, and no path of the machine it ran on is shown
    (they are written relative to the repository)."""
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and "parameters" in code[0].metadata.get("tags", [])
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1))
    outputs = [o for c in code for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in _cell(nb, "plot").outputs)
    assert "reached" in _stdout(_cell(nb, "train")) and "greedy evaluation" in _stdout(
        _cell(nb, "evaluate")
    )
    text = json.dumps([o for o in outputs if o.output_type == "stream"])
    assert str(ROOT) not in text and "run directory: runs/" in text


def test_notebook_runs_end_to_end(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")

    nb = nbformat.read(NOTEBOOK, as_version=4)
    run_dir = tmp_path / "run"
    overrides = ["total_env_steps=16384", "log_every=4", "eval.episodes=2", f"run_dir={run_dir}"]
    params = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1
    injected = nbformat.v4.new_code_cell(
        f"OVERRIDES = {overrides!r}\nEVAL_EPISODES = 2\nimport sys\nprint('kernel prefix:', sys.prefix)"
    )
    injected.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(params[0] + 1, injected)

    client = nbclient.NotebookClient(
        nb,
        km=_kernel_manager(tmp_path),
        timeout=CELL_TIMEOUT_S,
        startup_timeout=120,
        resources={"metadata": {"path": str(ROOT)}},
    )
    # raises CellExecutionError on the first failing cell; cleanup_kc: the client shuts the
    # kernel down even though it did not make its manager (by default it would leave it
    # running, a child of this process, until the test session ends)
    client.execute(cleanup_kc=True)
    kernels = [
        p
        for p in psutil.Process().children(recursive=True)
        if str(tmp_path) in " ".join(_cmdline(p))
    ]
    assert not kernels, kernels  # the kernel is gone with the notebook's run

    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"
    ]
    assert not errors, errors
    assert f"kernel prefix: {sys.prefix}" in _stdout(injected)  # the kernel ran this environment

    # training wrote its run directory where the override sent it
    summary = json.loads((run_dir / "summary.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert summary["env_steps"] == 16384 and summary["updates"] == 32
    train = [r for r in records if "eval_return" not in r]
    assert len(train) == 8 and train[-1]["env_steps"] == 16384
    # and the config's final evaluation, a record of its own
    assert [(r["updates"], r["env_steps"]) for r in records if "eval_return" in r] == [(32, 16384)]
    assert str(run_dir) in _stdout(_cell(nb, "train"))

    # the learning curve was drawn
    assert any("image/png" in o.get("data", {}) for o in _cell(nb, "plot").outputs)

    # the evaluation printed its statistics; it builds env and algorithm as train does and
    # uses train's evaluation key, so with as many episodes it matches the summary
    text = _stdout(_cell(nb, "evaluate"))
    m = re.search(
        r"over 2 episodes: mean return (-?\d+\.\d+), std (\d+\.\d+), "
        r"min (-?\d+\.\d+), max (-?\d+\.\d+)",
        text,
    )
    assert m, text
    mean, std, lo, hi = map(float, m.groups())
    assert math.isfinite(mean) and 0 < lo <= mean <= hi <= 500 and std >= 0
    assert mean == pytest.approx(summary["eval_return"], abs=0.01)
