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


def _visible(fig):
    return {ax.get_title(): ax for ax in fig.axes if ax.get_visible()}


def test_capacity_draws_both_axes_and_the_trained_prediction(frames):
    fig = capacity_figure(frames["capacity"])
    panels = _visible(fig)
    width, law = panels["capacity at equal width: d_model 32"], panels["per key dimension (all widths)"]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[:4] == ["softmax", "elu", "favor", "retnet"]   # the failed mamba run is left out
    assert "predicted from trained statistics" in labels and "random keys, state of dim d_key" in labels
    colors = palette(labels[:4])

    def lines(ax, model, style):
        return [line.get_xdata() for line in ax.lines if line.get_color() == colors[model]
                and line.get_linestyle() == style and len(line.get_xdata())]

    n = np.array([4, 8, 16, 32, 64, 128])
    np.testing.assert_allclose(lines(width, "elu", "-")[0], n)          # N at equal width
    np.testing.assert_allclose(lines(width, "favor", "--")[0], n)       # its trained prediction
    np.testing.assert_allclose(lines(law, "elu", "-")[0], n / 16)       # N / d_key
    np.testing.assert_allclose(lines(law, "favor", "-")[0], n / 44)
    assert any(line.get_linestyle() == ":" and line.get_color() == "0.45" for line in law.lines)


def test_capacity_chooses_the_learning_rate_on_validation_and_keeps_every_one(frames):
    from analysis.plots.capacity import capacity_selected

    selected, per_lr = capacity_selected(frames["capacity"])
    assert set(selected["config.trainer.lr"]) == {3e-3}     # 1e-2 scores better on test, worse on val
    # per (mixer, width): the validation accuracy over every N and seed
    assert len(per_lr) == 4 * 2 and per_lr["chosen"].sum() == 4 and (per_lr["runs"] == 2 * 6).all()
    assert (per_lr["selected_on"] == "validation").all()
    fig = capacity_figure(frames["capacity"])
    assert set(fig.tables) == {"capacity_per_lr", "capacity_n50"}
    half = fig.tables["capacity_n50"].set_index("model")
    # the fixture's trained statistics predict half the measured capacity
    for model in ("elu", "favor", "retnet"):
        assert half.loc[model, "ratio"] == pytest.approx(0.5, rel=0.05), model
    assert half.loc["softmax", "n50_measured"] == np.inf


def test_half_point():
    from analysis.plots.capacity import half_point

    assert half_point([4, 8, 16], [1.0, 0.75, 0.25]) == pytest.approx(8 * 2 ** 0.5)
    assert half_point([4, 8], [0.9, 0.8]) == np.inf and np.isnan(half_point([4, 8], [0.4, 0.1]))


def test_capacity_without_the_trained_statistics_says_so(frames):
    no_heads = frames["capacity"][frames["capacity"]["table"] != "heads"]
    texts = " ".join(t.get_text() for ax in capacity_figure(no_heads).axes for t in ax.texts)
    assert "no trained-statistics prediction" in texts


def test_snr_trained_runs_beside_the_probe_in_both_panels(frames):
    pts = snr_points(frames["snr"])
    assert set(pts["source"]) == {"untrained probe", "trained"}  # summary not counted twice
    assert set(pts["panel"]) == {"nominal", "own"}
    fits = fit_slopes(pts).set_index(["panel", "source", "model"])
    for model in ("linear", "elu", "favor"):
        assert fits.loc[("nominal", "untrained probe", model), "slope"] == pytest.approx(1.0, abs=0.1)
    trained = fits.loc[("nominal", "trained", "elu")]
    assert trained["slope"] == pytest.approx(1.0) and trained["prefactor"] == pytest.approx(0.7)
    assert fits.loc[("own", "trained", "elu"), "prefactor"] == pytest.approx(0.7 / 0.8)
    fig = figures.snr_figure(frames["snr"])
    filled = [c for ax in fig.axes for c in ax.collections if c.get_facecolor().size and
              c.get_facecolor()[0][3] > 0]
    hollow = [c for ax in fig.axes for c in ax.collections if not c.get_facecolor().size or
              c.get_facecolor()[0][3] == 0]
    assert filled and hollow


def test_mqar_takes_the_learning_rate_chosen_on_validation(frames):
    best = best_over_lr(mqar_points(frames["mqar"]))
    assert len(best) == 3 * 3 * 3                             # mixers x widths x (seq_len, pairs)
    assert (best["best_lr"] == 3e-3).all()                    # the fixture's lr 1e-3 is 10% worse
    fig = figures.mqar_figure(frames["mqar"])
    titles = sorted(t for t in _visible(fig) if t.startswith("seq_len"))
    assert titles == ["seq_len 128, 16 pairs", "seq_len 64, 4 pairs", "seq_len 64, 8 pairs"]
    trend = fig.tables["mqar_width_trend"]
    assert not trend["loses_with_width"].any()                # every fixture mixer gains with width


def test_width_trend_flags_a_loss_beyond_the_interval():
    from analysis.plots.mqar import width_trend

    rows = pd.DataFrame({"model": "m", "seq_len": 64, "pairs": 8,
                         "config.model.d_model": [32, 32, 32, 64, 64, 64],
                         "accuracy": [0.50, 0.55, 0.52, 0.10, 0.12, 0.08]})
    trend = width_trend(rows).set_index("config.model.d_model")
    assert not trend.loc[32, "loses_with_width"] and trend.loc[64, "loses_with_width"]
    assert trend.loc[32, "low"] <= trend.loc[32, "mean"] <= trend.loc[32, "high"]
    noisy = rows.assign(accuracy=[0.5, 0.1, 0.9, 0.45, 0.2, 0.7])  # within each other's interval
    assert not width_trend(noisy)["loses_with_width"].any()


def test_interval_is_a_bootstrap_of_the_mean():
    from analysis.plots.common import interval

    mean, lo, hi = interval([0.1, 0.2, 0.3, 0.4])
    assert mean == pytest.approx(0.25) and 0.1 <= lo < mean < hi <= 0.4
    assert interval([0.5, 0.5]) == (0.5, 0.5, 0.5) and np.isnan(interval([0.5])[1])


def test_induction_bars_take_the_validation_choice(frames):
    fig = figures.induction_figure(frames["induction"])
    bars = _visible(fig)["Induction accuracy per mixer"].patches
    runs = frames["induction"][frames["induction"]["table"] == "runs"]
    chosen = runs[runs["config.trainer.lr"] == 3e-3].groupby("model")["summary.accuracy"].mean()
    assert [b.get_height() for b in bars] == pytest.approx([chosen[m] for m in ("softmax", "elu", "mamba")])
    assert fig.tables["induction_per_lr"]["chosen"].sum() == 3


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
    assert last == ("python -m analysis.figures: 9 figure(s) not drawn: sharpness, attention, mqar, induction, "
                    "cost, length, needle, frontier, forgetting (see the warnings above)")


def test_smoke_discovers_experiments_from_the_files():
    from analysis import smoke
    from harness.config.compose import CONF_DIR

    files = sorted(p.stem for p in (CONF_DIR / "experiment" / "paper").glob("*.yaml"))
    assert smoke.experiments("paper") == files
    params = smoke.sweep_params("paper", "mqar")
    assert params["model.d_model"] == ["64", "128", "256", "512"]
    assert smoke.job_count(params, "all") == 7 * 4 * 3 * 3 * 4 * 5  # ... x learning rates x seeds
    assert smoke.grid_overrides(params, "last") == ["model.d_model=512", "task.seq_len=512",
                                                    "task.num_pairs=32", "trainer.lr=1e-2", "seed=4"]


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
    assert capacity["jobs"] == 9 * 3 * 3 * 5 and capacity["steps_per_job"] == 20000
    out = capsys.readouterr().out
    assert "expected cost of the full paper profile" in out and "capacity" in out


def test_sweep_dir_override_is_quoted_when_needed():
    plain = figures.sweep_command("quick", "snr", Path("/tmp/results/quick/snr"))
    assert plain[-1] == "hydra.sweep.dir=/tmp/results/quick/snr"
    spaced = figures.sweep_command("paper", "snr", Path("/tmp/my results/snr"))
    assert spaced[-2:] == ["+experiment=paper/snr", "hydra.sweep.dir='/tmp/my results/snr'"]


def test_a_point_no_validation_batch_covers_is_chosen_on_test_and_says_so():
    from analysis.plots.common import LR, select_on_validation

    rows = pd.DataFrame({"model": ["elu"] * 4, "value": [16, 16, 192, 192], LR: [1e-3, 1e-2] * 2,
                         "accuracy": [0.9, 0.8, 0.2, 0.3], "val_accuracy": [0.7, 0.9, np.nan, np.nan]})
    picked, table = select_on_validation(rows, ["model", "value"])
    assert dict(zip(picked["value"], picked[LR])) == {16: 1e-2, 192: 1e-2}  # val at 16; test at 192
    flagged = table.set_index("value")["selected_on"]
    assert set(flagged.loc[16]) == {"validation"} and set(flagged.loc[192]) == {"test (no validation split)"}
