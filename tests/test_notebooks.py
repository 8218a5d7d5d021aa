"""Each analysis notebook (jupytext py:percent) executes top to bottom on synthetic results
and draws its figures. The notebooks are those the figures declare (analysis.plots: each
figure's `notebook`), so a new figure's notebook is run here without being listed."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext")
nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")

from analysis.plots import notebooks  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = [REPO / "analysis" / f"{name}.py" for name in notebooks()]


@pytest.fixture(scope="module")
def kernel(tree, tmp_path_factory):
    """One python3 kernel of this interpreter for every notebook (each starts from a cleared
    namespace; only the imported modules carry over, which saves a start-up per notebook).

    Its kernelspec runs sys.executable, so the kernel sees this environment whatever other
    kernelspecs the machine has registered; it reads results from the fixture tree."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    specs = tmp_path_factory.mktemp("kernels")
    (specs / "python3").mkdir()
    (specs / "python3" / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (ipykernel)", "language": "python"}))
    km = KernelManager(kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(specs)]))
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}  # the notebook picks inline
    km.start_kernel(cwd=str(REPO), env={**env, "HARNESS_RESULTS": str(tree)})
    yield km
    km.shutdown_kernel(now=True)


def test_every_notebook_is_declared_by_a_figure_and_exists():
    """No notebook outside the figures' declarations (it would run in no test), none missing."""
    from analysis.plots import figures

    on_disk = {p.stem for p in (REPO / "analysis").glob("nb_*.py")}
    assert on_disk == {p.stem for p in NOTEBOOKS}
    assert all(spec.notebook for spec in figures()), [s.name for s in figures() if not s.notebook]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes_on_fixture_results(path, kernel):
    nb = jupytext.read(path)
    assert nb.metadata["jupytext"]["text_representation"]["format_name"] == "percent"
    nb.cells.insert(0, nbformat.v4.new_code_cell("%reset -f"))
    client = nbclient.NotebookClient(nb, km=kernel, timeout=120)
    client.execute()   # raises CellExecutionError, with the failing cell, on any error
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, "the notebook shows its figure"
    stderr = "".join(o.get("text", "") for o in outputs if o.get("name") == "stderr")
    assert "skipped" not in stderr, stderr


def _run_with(path, kernel, assignment: str):
    """Execute the notebook with `assignment` run right after its parameters cell; return the
    error output of the cell that stopped it."""
    nb = jupytext.read(path)
    at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(assignment))
    nb.cells.insert(0, nbformat.v4.new_code_cell("%reset -f"))
    client = nbclient.NotebookClient(nb, km=kernel, timeout=120)
    with pytest.raises(nbclient.exceptions.CellExecutionError):
        client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert len(errors) == 1
    return errors[0]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_bad_results_parameter_is_one_line(path, kernel):
    error = _run_with(path, kernel, "results_dir = '/nonexistent/results'")
    assert error["ename"] == "ParameterError"
    assert len(error["traceback"]) == 1, error["traceback"]
    assert "results_dir" in error["traceback"][0] and "/nonexistent/results" in error["traceback"][0]


def test_a_bad_width_parameter_is_one_line(kernel):
    error = _run_with(REPO / "analysis" / "nb_cost.py", kernel, "d_head = 0")
    assert error["traceback"] == ["ParameterError: d_head must be a positive integer at most 65,536, got 0"]
