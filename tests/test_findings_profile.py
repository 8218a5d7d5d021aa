"""The findings profile: its experiment files, figures drawn only for its own experiments, sweeps
rerun until complete, the time each sweep took from its runs' own times, and committed results
(gzip'd, without weights) that redraw every CSV byte for byte (analysis.archive)."""
from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import pytest
from omegaconf import OmegaConf
from conftest import make_results
from analysis.synthetic.lr_window import WINDOW_CURVES, WINDOW_RATES

from analysis import archive, figures, pipeline, smoke, times
from analysis.loader import find_results, load_results
from harness.outputs.results import MAX_RESULTS_BYTES, DamagedResults, parse_results_file

OWN = ("lr_window", "reassignment", "mechanism", "anatomy", "hybrid")  # findings experiments the fixture writes


def test_the_findings_profile_draws_the_figures_of_its_own_experiments():
    names = pipeline.profile_experiments("findings")
    assert set(OWN) <= set(names) and smoke.experiments("findings") == names
    drawn = pipeline.profile_figures(figures.FIGURES, "findings")
    assert {s.name for s in drawn} == {s.name for s in figures.FIGURES if s.experiment in names}
    assert all(set(s.also) <= set(names) for s in drawn)
    # committed results carry no weights: every findings figure draws from results.json alone, a
    # figure that can reopen model.pt only where its findings runs store what it would read there
    reopening = [s.name for s in drawn if s.reopens_runs and not (
        s.stored_by and OmegaConf.select(pipeline.compose_experiment("findings", s.experiment), s.stored_by) is True)]
    assert not reopening, f"findings figures that reopen model.pt, which analysis.archive leaves behind: {reopening}"
    quick = {s.name for s in pipeline.profile_figures(figures.FIGURES, "quick")}
    assert quick == {s.name for s in figures.FIGURES if s.experiment is None or pipeline.in_profile("quick", s.experiment)}
    assert quick >= {"capacity", "hybrid", "mechanism", "lr_window"}


def test_a_figure_outside_the_profile_is_refused_in_one_line(capsys):
    assert figures.main(["--profile", "findings", "--only", "mqar", "--out", "/tmp/unused-findings"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--only mqar: not a figure of the findings profile" in err[0]


def test_an_unfinished_sweep_is_run_again_and_a_finished_one_is_not(tmp_path):
    root = tmp_path / "results"
    make_results.write_results_tree(root, ["lr_window"])  # 100 runs: the quick grid's 15 and more
    assert pipeline.sweep_complete(root, "lr_window", "quick")
    assert not pipeline.sweep_complete(root, "lr_window", "findings")  # its grid has 300 jobs
    calls = []

    def runner(cmd, check):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0)

    assert pipeline.run_missing_sweeps(root, ["lr_window"], "quick", runner) == []
    assert pipeline.run_missing_sweeps(root, ["lr_window"], "findings", runner) == ["lr_window"]
    assert calls and calls[0][4] == "+experiment=findings/lr_window"
    failed = json.loads((root / "lr_window" / "0" / "results.json").read_text())
    (root / "lr_window" / "0" / "results.json").write_text(json.dumps({**failed, "status": "failed"}))
    assert pipeline.finished_runs(root / "lr_window") == 99  # a failed run is one to redo


def test_each_sweeps_time_is_summed_from_its_runs(tmp_path, capsys):
    root = tmp_path / "findings"
    make_results.write_results_tree(root, ["lr_window", "reassignment"])
    table = times.sweep_times(root).set_index("sweep")
    runs = len(WINDOW_CURVES) * len(WINDOW_RATES) * 5
    per_run = [10.0 * layers for (_, layers) in WINDOW_CURVES]
    assert table.loc["lr_window", "runs"] == runs
    assert table.loc["lr_window", "wall_s"] == pytest.approx(sum(per_run) * len(WINDOW_RATES) * 5)
    assert table.loc["all", "wall_s"] == table.loc["lr_window", "wall_s"]  # the re-assignment fixture has no times
    assert table.loc["lr_window", "minutes_at_parallel"] == pytest.approx(table.loc["lr_window", "wall_s"] / 120)
    assert times.main([str(root)]) == 0
    out = capsys.readouterr().out
    assert "budget:" in out and "of 2.50 h at 2 runs at a time" in out
    # and by CPU time (the fixture's runs spent 0.9 of their wall time on a core)
    assert table.loc["all", "cpu_s"] == pytest.approx(0.9 * table.loc["all", "wall_s"])
    idle = table.loc["all", "cpu_s"] / 2
    assert f"by CPU time, on an idle machine with a core per run, {idle / 3600:.2f} h ({idle / 9000:.0%})" in out


def test_committed_results_redraw_every_csv_byte_for_byte(tmp_path):
    source = tmp_path / "results" / "findings"
    make_results.write_results_tree(source, [e for e in pipeline.profile_experiments("findings")
                                                  if e in make_results.EXPERIMENTS])
    for results in find_results(source):  # a findings run stores its rows: none needs its weights
        if (results.parent / "model.pt").exists() and "ablate" not in json.loads(results.read_text()):
            shutil.rmtree(results.parent)
    for results in find_results(source)[:3]:  # weights and checkpoints stay behind
        (results.parent / "model.pt").write_bytes(b"weights")
        (results.parent / "checkpoint-10-abc.pt").write_bytes(b"state")
    committed = tmp_path / "docs" / "results" / "findings"
    assert archive.main([str(source), str(committed), "--profile", "findings"]) == 0
    files = sorted(p.relative_to(committed).as_posix() for p in committed.rglob("*") if p.is_file())
    assert files and all(f.endswith(".gz") for f in files if f != archive.MANIFEST)
    assert not any(".pt" in f for f in files) and archive.profile_of(committed) == "findings"
    again = tmp_path / "again"
    archive.copy_results(source, again, "findings")
    assert all((committed / f).read_bytes() == (again / f).read_bytes() for f in files)  # no time stamps
    assert len(load_results(committed)) == len(load_results(source))

    drawn_from = {}
    for name, args in (("source", ["--profile", "findings", "--results", str(source)]),
                       ("committed", ["--results", str(committed)])):  # the profile from the manifest
        out = tmp_path / f"figs-{name}"
        assert figures.main([*args, "--out", str(out)]) == 0
        drawn_from[name] = {p.name: p.read_bytes() for p in out.glob("*.csv")}
    assert set(drawn_from["source"]) >= {"lr_window.csv", "reassignment.csv", "reassignment_points.csv"}
    assert drawn_from["committed"] == drawn_from["source"]


def test_a_gzip_file_that_inflates_past_any_results_json_is_refused(tmp_path):
    bomb = tmp_path / "results.json.gz"
    with gzip.open(bomb, "wb") as fh:
        fh.write(b"{" + b" " * (MAX_RESULTS_BYTES + 1) + b"}")
    assert bomb.stat().st_size < 1_000_000
    with pytest.raises(DamagedResults, match="more than"):
        parse_results_file(bomb)
    cut = tmp_path / "cut" / "results.json.gz"
    cut.parent.mkdir()
    cut.write_bytes(gzip.compress(b'{"schema": 1}')[:-6])
    with pytest.raises(DamagedResults, match="not a whole gzip file"):
        parse_results_file(cut)
    frame = load_results(cut.parent)  # kept as a failed run that names the file
    assert frame["status"].iat[0] == "failed" and "results.json.gz" in frame["error"].iat[0]


def test_the_smoke_runs_the_findings_experiments(tree, tmp_path, capsys):
    calls = []
    specs = [s for s in figures.FIGURES if s.name == "lr_window"]
    code = smoke.run("findings", tmp_path / "smoke", tmp_path / "figs", specs, only={"lr_window"},
                     runner=make_results.sweep_runner(calls))
    assert code == 0 and [c[4] for c in calls] == ["+experiment=findings/lr_window"]
    estimate = json.loads((tmp_path / "smoke" / smoke.COST_FILE).read_text())["experiments"]["lr_window"]
    assert estimate["jobs"] == 300 and estimate["steps_per_job"] == 1000
