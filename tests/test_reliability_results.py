"""A results.json a run can hide behind: a wrong-typed or non-finite number, a schema the harness
does not write, a file that is not a regular one or is too large. The loader keeps each as a
failed run whose error names the file and the key; a figure drawn from the sweep is still
drawn, and says which run it left out. load_run refuses the same files, and a directory that
holds no run is "not a run"."""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from conftest import make_results

from analysis.figures import FIGURES, render
from analysis.loader import load_results
from harness.errors import DamagedFile
from harness.outputs.load import load_run
from harness.outputs import results as results_module
from harness.outputs.results import parse_results, read_results


@pytest.fixture
def sweep(tmp_path) -> Path:
    """A fresh induction sweep (16 runs) of the synthetic results."""
    return make_results.write_results_tree(tmp_path / "results", experiments=("induction",)) / "induction"


def _edit(run_dir: Path, change) -> None:
    data = json.loads((run_dir / "results.json").read_text())
    change(data)
    (run_dir / "results.json").write_text(json.dumps(data))  # json writes NaN and Infinity as such


def _failed(sweep: Path, run_dir: Path) -> str:
    runs = load_results(sweep).set_index("run_dir")
    assert (runs["status"] == "ok").sum() == len(runs) - 1
    row = runs.loc[run_dir.as_posix()]
    assert row["status"] == "failed"
    assert str(run_dir / "results.json") in row["error"]
    return row["error"]


@pytest.mark.parametrize("key,value,named", [
    ("accuracy", "high", "summary.accuracy"),      # a figure's mean failed on it: TypeError
    ("accuracy", float("nan"), "summary.accuracy"),  # dropped from every figure without a word
    ("loss", float("inf"), "summary.loss"),
    ("val_accuracy", True, "summary.val_accuracy"),
    ("accuracy", [0.5], "summary.accuracy"),
])
def test_a_bad_summary_value_is_a_failed_run_naming_the_file_and_key(sweep, key, value, named):
    run = sweep / "3"
    _edit(run, lambda d: d["summary"].__setitem__(key, value))
    assert named in _failed(sweep, run)


def test_a_wrong_typed_table_value_is_a_failed_run_naming_the_row(sweep):
    run = sweep / "5"
    _edit(run, lambda d: d["slices"][2].__setitem__("accuracy", "0.9"))
    assert "slices[2].accuracy" in _failed(sweep, run)


@pytest.mark.parametrize("schema", [2, 0, "1", None, 1.0, True])
def test_a_schema_other_than_1_is_refused_by_the_loader_and_load_run(sweep, schema):
    run = sweep / "4"
    _edit(run, lambda d: d.__setitem__("schema", schema))
    assert "'schema'" in _failed(sweep, run)
    with pytest.raises(DamagedFile, match="'schema'"):
        parse_results(run)
    assert read_results(run) is None  # a sweep's skip check redoes such a run


def test_a_missing_schema_is_refused(sweep):
    run = sweep / "4"
    _edit(run, lambda d: d.pop("schema"))
    assert "'schema'" in _failed(sweep, run)


def test_results_json_linked_to_dev_zero_is_refused_without_reading_it(sweep):
    """Loaded in a process whose address space is capped: a loader that reads the link would
    otherwise take the machine's memory before failing."""
    import resource
    import subprocess
    import sys

    run = sweep / "6"
    (run / "results.json").unlink()
    (run / "results.json").symlink_to("/dev/zero")
    code = ("import sys; from analysis.loader import load_results; "
            "print(load_results(sys.argv[1]).set_index('run_dir').loc[sys.argv[2], 'error'])")
    cap = lambda: resource.setrlimit(resource.RLIMIT_AS, (8 * 2**30, 8 * 2**30))  # noqa: E731
    out = subprocess.run([sys.executable, "-c", code, str(sweep), run.as_posix()], capture_output=True,
                         text=True, timeout=300, preexec_fn=cap)
    assert "not a regular file" in out.stdout and str(run / "results.json") in out.stdout, out.stderr[-2000:]


def test_results_json_as_a_fifo_is_refused_without_waiting(sweep):
    run = sweep / "6"
    (run / "results.json").unlink()
    os.mkfifo(run / "results.json")
    done = {}
    reader = threading.Thread(target=lambda: done.update(error=_failed(sweep, run)), daemon=True)
    reader.start()
    reader.join(timeout=60)
    if reader.is_alive():  # unblock the stuck reader so the test process can end
        with open(run / "results.json", "w"):
            pass
        pytest.fail("the loader waited on a FIFO")
    assert "FIFO" in done["error"]


def test_a_results_json_past_the_size_bound_is_refused(sweep):
    run = sweep / "6"
    with open(run / "results.json", "r+b") as f:  # sparse: past the bound without filling a disk
        f.truncate(results_module.MAX_RESULTS_BYTES + 1)
    assert "more than" in _failed(sweep, run)


def test_a_figure_is_drawn_and_names_the_run_one_bad_file_leaves_out(sweep, tmp_path, capsys):
    _edit(sweep / "3", lambda d: d["summary"].__setitem__("accuracy", "high"))
    _edit(sweep / "7", lambda d: d["summary"].__setitem__("accuracy", float("nan")))
    specs = [s for s in FIGURES if s.name == "induction"]
    written, missed = render(specs, sweep.parent, tmp_path / "figs")
    err = capsys.readouterr().err
    assert not missed and written["induction"], err
    for run in ("3", "7"):
        assert str(sweep / run / "results.json") in err, err  # the note names each file left out
    assert "summary.accuracy" in err


def test_load_run_on_a_directory_without_a_run_says_not_a_run(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="is not a run"):
        load_run(tmp_path)


def test_load_run_on_a_bad_schema_names_the_file(sweep):
    run = sweep / "2"
    _edit(run, lambda d: d.__setitem__("schema", 2))
    with pytest.raises(DamagedFile, match=r"results.json is damaged: 'schema' is 2"):
        load_run(run)
