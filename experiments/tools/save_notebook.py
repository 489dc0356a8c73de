"""Runs experiments/examples/quickstart.ipynb from the repository root and saves it with its outputs
(tests/test_notebook.py checks both the saved copy and a fresh run on a tiny config).

    python experiments/tools/save_notebook.py

The kernel is this interpreter; paths under the repository are written relative to it, so
the saved outputs show no path of the machine they ran on.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import nbclient
import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "experiments" / "examples" / "quickstart.ipynb"


def main() -> int:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    with tempfile.TemporaryDirectory() as tmp:
        spec_dir = Path(tmp) / "kernels" / "python3"
        spec_dir.mkdir(parents=True)
        spec = {
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3",
            "language": "python",
            "env": {"MPLBACKEND": "Agg", "IPYTHONDIR": str(Path(tmp) / "ipython")},
        }
        (spec_dir / "kernel.json").write_text(json.dumps(spec))
        km = AsyncKernelManager(
            kernel_name="python3",
            kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(Path(tmp) / "kernels")]),
        )
        nbclient.NotebookClient(
            nb,
            km=km,
            timeout=1200,
            startup_timeout=120,
            resources={"metadata": {"path": str(ROOT)}},
        ).execute()
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                out["text"] = out["text"].replace(str(ROOT) + "/", "")
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, NOTEBOOK)
    print(f"saved {NOTEBOOK.relative_to(ROOT)} with its outputs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
