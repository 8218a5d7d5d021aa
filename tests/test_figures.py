"""Every figure renders from synthetic results, writes PNG and PDF, and skips (never crashes)
when its data is absent; `python -m analysis.figures` plots existing results or runs the
missing sweeps first."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import make_results
from matplotlib.figure import Figure

from analysis import figures
from analysis.loader import load_all
from analysis.plots.capacity import capacity_figure
from analysis.plots.common import palette, retrieval_heads
from analysis.plots.cost import cost_rows, cost_slopes, state_figure
from analysis.plots.mqar import best_over_lr, mqar_points
from analysis.plots.sharpness import sharpness_figure, sharpness_rows
from analysis.plots.snr import fit_slopes, snr_points

REPO = Path(__file__).resolve().parents[1]
NAMES = [spec.name for spec in figures.FIGURES]


@pytest.fixture(scope="module")
def frames(tree) -> dict[str, pd.DataFrame]:
    return {e: load_all(tree / e) for e in make_results.EXPERIMENTS}


def _draw(spec, frames):
    return spec.draw() if spec.experiment is None else spec.draw(frames[spec.experiment])


@pytest.mark.parametrize("name", NAMES)
def test_figure_renders_with_labelled_axes_and_a_legend(name, frames):
    spec = next(s for s in figures.FIGURES if s.name == name)
    fig = _draw(spec, frames)
    assert isinstance(fig, Figure)
    drawn = [ax for ax in fig.axes if ax.get_visible() and (ax.lines or ax.collections or ax.patches)
             and ax.get_label() != "<colorbar>"]  # a colorbar carries its unit on its own label
    assert drawn, "no data drawn"
    colorbars = [ax for ax in fig.axes if hasattr(ax, "_colorbar")]
    for ax in drawn:  # units in brackets on every numeric axis (a mixer axis is categorical)
        if ax in colorbars:  # a heatmap's colour bar: its label carries the unit
            assert "(" in ax.get_ylabel() + ax.get_xlabel(), ax.get_ylabel()
            continue
        twin = len(ax.get_shared_x_axes().get_siblings(ax)) > 1 and not ax.get_xlabel()
        assert twin or ax.get_xlabel() == "mixer" or "(" in ax.get_xlabel(), ax.get_xlabel()
        assert "(" in ax.get_ylabel(), ax.get_ylabel()
    assert fig.legends or colorbars, "a figure legend (or a heatmap's colour bar)"


def test_capacity_plots_each_mixer_against_n_over_d_with_theory(frames):
    fig = capacity_figure(frames["capacity"])
    ax = fig.axes[0]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[:4] == ["softmax", "elu", "favor", "retnet"]   # the failed mamba run is left out
    assert "theory: sqrt(d/N), right axis" in labels
    colors = palette(labels[:4])
    measured = {model: [line.get_xdata() for line in ax.lines if line.get_color() == colors[model]
                        and line.get_linestyle() == "-" and len(line.get_xdata())]
                for model in colors}
    n = np.array([4, 8, 16, 32, 64, 128])
    np.testing.assert_allclose(measured["elu"][0], n / 16)
    np.testing.assert_allclose(measured["favor"][0], n / 44)
    dashed = [line for line in ax.lines if line.get_linestyle() == "--"]
    assert {line.get_color() for line in dashed} == {colors["elu"], colors["favor"], colors["retnet"]}
    # SNR on the right axis: the law itself, sqrt(d/N) (up to N - 1 for N >> 1).
    twin = fig.axes[1]
    x, snr = twin.lines[0].get_xdata(), twin.lines[0].get_ydata()
    np.testing.assert_allclose(snr[-1], 1 / np.sqrt(x[-1]), rtol=0.01)


def test_snr_slopes_are_fitted_per_mixer_and_source(frames):
    pts = snr_points(frames["snr"])
    assert set(pts["source"]) == {"untrained probe", "trained, per head"}  # summary not counted twice
    fits = fit_slopes(pts).set_index(["source", "model"])
    for model in ("linear", "elu", "favor"):
        assert fits.loc[("untrained probe", model), "slope"] == pytest.approx(1.0, abs=0.1)
    trained = fits.loc[("trained, per head", "elu")]
    assert trained["slope"] == pytest.approx(1.0) and trained["prefactor"] == pytest.approx(0.7)


def test_mqar_takes_the_best_learning_rate(frames):
    best = best_over_lr(mqar_points(frames["mqar"]))
    assert len(best) == 3 * 3 * 3                             # mixers x widths x (seq_len, pairs)
    assert (best["best_lr"] == 3e-3).all()                    # the fixture's lr 1e-3 is 10% worse
    fig = figures.mqar_figure(frames["mqar"])
    titles = sorted(ax.get_title() for ax in fig.axes if ax.get_visible())
    assert titles == ["seq_len 128, 16 pairs", "seq_len 64, 4 pairs", "seq_len 64, 8 pairs"]


def test_sharpness_bars_follow_the_retrieval_head(frames):
    rows = sharpness_rows(frames["sharpness"])
    focus = retrieval_heads(rows)
    assert set(zip(focus["layer"], focus["head"])) == {(0, 0)} and len(rows) == 4 * len(focus)
    fig = sharpness_figure(frames["sharpness"])
    heights = [bar.get_height() for bar in fig.axes[1].patches]   # softmax, linear, elu, favor
    expected = focus.groupby("model")["target_weight"].mean()
    assert heights == pytest.approx([expected[m] for m in ("softmax", "linear", "elu", "favor")])
    assert "bars: retrieval head" in fig.get_suptitle()


def test_sharpness_falls_back_to_run_summaries(frames):
    runs_only = frames["sharpness"][frames["sharpness"]["table"] == "runs"]
    fig = sharpness_figure(runs_only)
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    assert fig.axes[0].get_ylabel() == "attention entropy H (nats)"


def test_state_figure_marks_the_gpt2_crossover():
    fig = state_figure()
    ax = fig.axes[0]
    assert any("crossover N ≈ 32" in t.get_text() for t in ax.texts)
    kv = next(line for line in ax.lines if "KV cache" in line.get_label())
    n, elements = kv.get_xdata(), kv.get_ydata()
    np.testing.assert_allclose(elements, 2 * 64 * n)
    state = next(line for line in ax.lines if "d·d + d" in line.get_label())
    assert state.get_ydata()[0] == 64 * 64 + 64


def test_cost_slopes_follow_the_form(frames):
    slopes = cost_slopes(cost_rows(frames["cost"])).set_index(["pass", "family", "form"])["slope"]
    assert slopes[("fwd", "softmax", "parallel")] == pytest.approx(2.0, abs=0.1)
    assert slopes[("fwdbwd", "linear", "chunk")] == pytest.approx(1.0, abs=0.1)


@pytest.mark.parametrize("name", [n for n in NAMES if n != "state_vs_kv"])
def test_missing_data_skips_with_a_warning(name, tmp_path, capsys):
    spec = next(s for s in figures.FIGURES if s.name == name)
    only_other_table = pd.DataFrame({"table": ["runs"], "run_dir": ["x"], "status": ["ok"], "model": ["elu"]})
    for data in (None, pd.DataFrame(), only_other_table, str(tmp_path)):
        assert spec.draw(data) is None
        assert f"warning: figure {name} skipped" in capsys.readouterr().err


def test_figure_accepts_a_results_path(tree):
    assert isinstance(capacity_figure(tree / "capacity"), Figure)


def test_results_mode_writes_every_figure_and_runs_nothing(tree, tmp_path, monkeypatch, capsys):
    def no_sweeps(cmd, **kwargs):
        raise AssertionError(f"--results ran {cmd}")

    monkeypatch.setattr(figures.subprocess, "run", no_sweeps)
    out = tmp_path / "figs"
    assert figures.main(["--results", str(tree), "--out", str(out)]) == 0
    printed = capsys.readouterr()
    for name in NAMES:
        png, pdf = (out / f"{name}.png").read_bytes(), (out / f"{name}.pdf").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000, name
        assert pdf[:5] == b"%PDF-" and len(pdf) > 5_000, name
        assert f"{name}: {out / name}.png, {out / name}.pdf" in printed.out
    assert f"wrote {len(NAMES)} of {len(NAMES)} figures to {out}" in printed.out
    assert "leaves out failed run" in printed.err           # the fixture's failed mamba run


def test_module_entry_point():
    done = subprocess.run([sys.executable, "-m", "analysis.figures", "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--results" in done.stdout and "--profile" in done.stdout


@pytest.mark.parametrize("profile", ["quick", "paper"])
def test_missing_sweeps_are_run_then_plotted(profile, tmp_path, monkeypatch, capsys):
    root = tmp_path / "results" / profile
    make_results.write_results_tree(root, ["capacity"])
    calls = []

    def fake_run(cmd, check):
        calls.append(cmd)
        experiment = cmd[4].split("=", 1)[1].split("/")[-1]
        sweep_dir = Path(cmd[5].split("=", 1)[1])
        if experiment == "cost":                               # the cost sweep fails, writes nothing
            return subprocess.CompletedProcess(cmd, 1)
        make_results.write_results_tree(sweep_dir.parent, [experiment])
        return subprocess.CompletedProcess(cmd, 0)

    def drawn(fig, out_dir, name):  # saving is checked above; here only what gets drawn
        assert isinstance(fig, Figure)
        out_dir.mkdir(exist_ok=True)
        paths = [out_dir / f"{name}.{fmt}" for fmt in ("png", "pdf")]
        for path in paths:
            path.touch()
        return paths

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(figures.subprocess, "run", fake_run)
    monkeypatch.setattr(figures, "save_figure", drawn)
    # quick: every figure; paper: a subset, to check the experiment names at less cost.
    chosen = NAMES if profile == "quick" else ["capacity", "snr", "state_vs_kv", "cost"]
    assert figures.main(["--profile", profile, "--out", "figs", "--only", *chosen]) == 1  # cost not drawn
    prefix = "" if profile == "quick" else "paper/"
    missing = [e for e in ("snr", "sharpness", "mqar", "induction", "cost", "length", "needle", "frontier",
                           "forgetting") if e in chosen]
    assert [c[4] for c in calls] == [f"+experiment={prefix}{e}" for e in missing]  # capacity exists
    assert all(c[:4] == [sys.executable, "-m", "harness", "-m"] for c in calls)
    assert calls[0][5] == f"hydra.sweep.dir={(root / 'snr').resolve().as_posix()}"
    written = sorted(p.name for p in (tmp_path / "figs").iterdir())
    assert written == sorted(f"{n}.{f}" for n in chosen if n != "cost" for f in ("png", "pdf"))
    err = capsys.readouterr().err
    assert "sweep cost exited with status 1" in err and "figure cost skipped" in err
    assert err.strip().splitlines()[-1].endswith("1 figure(s) not drawn: cost (see the warnings above)")


def _one_line_error(argv, capsys) -> str:
    try:
        code = figures.main(argv)
    except SystemExit as stop:  # argparse's own errors
        code = stop.code
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1, (code, err)
    assert err[0].startswith("python -m analysis.figures: error: ")
    return err[0]


def test_bad_arguments_are_one_line_before_any_work(tree, tmp_path, capsys, monkeypatch):
    def no_sweeps(cmd, **kwargs):
        raise AssertionError(f"ran {cmd}")

    monkeypatch.setattr(figures.subprocess, "run", no_sweeps)
    line = _one_line_error(["--results", str(tmp_path / "nonexistent"), "--out", str(tmp_path / "o")], capsys)
    assert "nonexistent: no such file or directory" in line
    (tmp_path / "empty").mkdir()
    assert "no results.json under" in _one_line_error(["--results", str(tmp_path / "empty")], capsys)
    assert "invalid choice: 'nope'" in _one_line_error(["--only", "nope"], capsys)
    assert "invalid choice: 'huge'" in _one_line_error(["--profile", "huge"], capsys)
    blocked = tmp_path / "file"
    blocked.write_text("")
    line = _one_line_error(["--results", str(tree), "--out", str(blocked / "figs")], capsys)
    assert f"--out {blocked / 'figs'}: cannot write there" in line
    assert not (tmp_path / "o").exists()


def test_figures_not_drawn_exit_1_and_are_named(tree, tmp_path, capsys):
    partial = tmp_path / "partial"
    make_results.write_results_tree(partial, ["capacity", "snr"])
    code = figures.main(["--results", str(partial), "--out", str(tmp_path / "figs")])
    assert code == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == ("python -m analysis.figures: 4 figure(s) not drawn: sharpness, mqar, induction, cost "
                    "(see the warnings above)")


def test_smoke_discovers_experiments_from_the_files():
    from analysis import smoke
    from harness.config.compose import CONF_DIR

    files = sorted(p.stem for p in (CONF_DIR / "experiment" / "paper").glob("*.yaml"))
    assert smoke.experiments("paper") == files
    params = smoke.sweep_params("paper", "mqar")
    assert params["model.d_model"] == ["64", "128", "256", "512"]
    assert smoke.job_count(params, "all") == 7 * 4 * 3 * 3 * 4
    assert smoke.grid_overrides(params, "last") == ["model.d_model=512", "task.seq_len=512",
                                                    "task.num_pairs=64", "trainer.lr=1e-2"]


def test_smoke_runs_each_experiment_through_the_launcher_and_prices_it(tree, tmp_path, monkeypatch, capsys):
    """The smoke's commands and cost arithmetic, on fixture results (the real sweeps: test_paper_smoke)."""
    import json

    from analysis import smoke

    calls = []

    def fake_run(cmd, check):
        calls.append(cmd)
        experiment = cmd[4].split("=", 1)[1].split("/")[-1]
        make_results.write_results_tree(Path(cmd[5].split("=", 1)[1]).parent, [experiment])
        return subprocess.CompletedProcess(cmd, 0)

    root = tmp_path / "smoke"
    specs = [s for s in figures.FIGURES if s.name in ("capacity", "snr")]
    code = smoke.run("paper", root, tmp_path / "figs", specs, only={"capacity", "snr"}, runner=fake_run)
    assert code == 0
    assert [c[4] for c in calls] == ["+experiment=paper/capacity", "+experiment=paper/snr"]
    assert all("trainer.max_steps=1" in c and "trainer.device=cpu" in c for c in calls)
    estimate = json.loads((root / smoke.COST_FILE).read_text())
    capacity = estimate["experiments"]["capacity"]
    assert capacity["jobs"] == 63 and capacity["steps_per_job"] == 20000
    out = capsys.readouterr().out
    assert "expected cost of the full paper profile" in out and "capacity" in out


def test_sweep_dir_override_is_quoted_when_needed():
    plain = figures.sweep_command("quick", "snr", Path("/tmp/results/quick/snr"))
    assert plain[-1] == "hydra.sweep.dir=/tmp/results/quick/snr"
    spaced = figures.sweep_command("paper", "snr", Path("/tmp/my results/snr"))
    assert spaced[-2:] == ["+experiment=paper/snr", "hydra.sweep.dir='/tmp/my results/snr'"]
