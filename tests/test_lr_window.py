"""Learning-rate windows (analysis.windows, analysis.plots.lr_window): each mixer's window read off
its mean accuracy against the rate, its width with a bootstrap interval over seeds, and every
ranked figure's rates held against it (analysis.pipeline), on synthetic results."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from conftest import draw_figure, make_results
from analysis.synthetic.lr_window import WINDOW_CURVES, WINDOW_RATES

from analysis import pipeline, windows
from analysis.plots import figures

FIGURES = figures()

RATES = [1e-3, 1e-2, 1e-1]


def test_a_window_is_read_off_the_mean_curve_in_log_rate():
    w = windows.window(RATES, [0.2, 1.0, 0.2])
    assert w["best_lr"] == 1e-2 and w["threshold"] == pytest.approx(0.9)
    # 0.9 is reached 7/8 of the way from 0.2 to 1.0 on either side, in log10(rate)
    assert math.log10(w["window_low"]) == pytest.approx(-3 + 7 / 8) and math.log10(w["window_high"]) == pytest.approx(-1 - 7 / 8)
    assert w["width_decades"] == pytest.approx(2 / 8) and not (w["low_open"] or w["high_open"])
    flat = windows.window(RATES, [0.95, 1.0, 0.97])
    assert flat["width_decades"] == pytest.approx(2.0) and flat["low_open"] and flat["high_open"]
    assert flat["rates_in_window"] == 3
    never = windows.window(RATES, [0.01, 0.05, 0.02])
    assert math.isnan(never["width_decades"]) and never["best_mean"] == 0.05  # learned at no rate
    # a second stretch above the threshold, apart from the best rate's, is not its window
    two = windows.window([1e-3, 1e-2, 1e-1, 1.0], [1.0, 0.1, 0.95, 0.1])
    assert two["window_high"] < 1e-2 and two["low_open"]


def test_the_width_interval_resamples_whole_seeds():
    curves = np.array([[0.2, 1.0, 0.2], [0.2, 1.0, 0.2], [0.9, 1.0, 0.2], [0.2, 1.0, 0.2], [0.2, 1.0, 0.9]])
    low, high = windows.width_interval(curves, RATES)
    width = windows.window(RATES, curves.mean(axis=0))["width_decades"]
    assert low <= width <= high and low >= 0.25 - 1e-9 and high > width  # a seed that also learns elsewhere widens it


@pytest.fixture(scope="module")
def drawn(tree):
    return draw_figure(tree, "lr_window")


def test_each_mixer_and_depth_has_its_window_and_interval(drawn):
    table = drawn.tables["lr_window"].set_index(["model", "n_layers"])
    broad = table.loc[("softmax", 2)]
    assert broad["width_decades"] == pytest.approx(2.0) and broad["low_open"] and broad["high_open"]
    narrow = table.loc[("mamba", 2)]
    assert narrow["width_decades"] < 0.5 and narrow["best_lr"] == pytest.approx(3.16e-3)
    assert narrow["width_low"] <= narrow["width_decades"] <= narrow["width_high"]
    assert narrow["interval_method"] == windows.WIDTH_METHOD and narrow["n_seeds"] == 5
    none = table.loc[("softmax", 1)]
    assert math.isnan(none["width_decades"]) and none["best_mean"] < windows.LEARNED
    assert table.loc[("mamba", 1), "runs_at_max_steps"] == 5 and table.loc[("mamba", 1), "lower_bound"]
    points = drawn.tables["lr_window_points"]
    assert len(points) == len(WINDOW_CURVES) * len(WINDOW_RATES)
    assert (points["n"] == 5).all() and {"runs_at_max_steps", "lower_bound", "lr"} <= set(points.columns)
    assert "0.9 of its best" in drawn.caption and "max_steps" in drawn.caption


def test_a_rate_is_inside_outside_or_unmeasured():
    measured = pd.DataFrame({"label": ["mamba", "softmax"], "model": ["mamba", "softmax"],
                             "config.model.n_layers": [2, 2], "best_mean": [0.98, 0.05],
                             "window_low": [2e-3, np.nan], "window_high": [5e-3, np.nan],
                             "low_open": [False, False], "high_open": [False, False]})
    runs = pd.DataFrame({"label": ["mamba", "mamba", "softmax", "elu", "mamba"],
                         "model": ["mamba", "mamba", "softmax", "elu", "mamba"],
                         "config.model.n_layers": [2, 2, 2, 2, 1],
                         "config.trainer.lr": [3e-3, 1e-2, 3e-3, 3e-3, 3e-3]})
    check = windows.rate_check(runs, measured).set_index(["label", "n_layers", "lr"])
    assert check.loc[("mamba", 2, 3e-3), "in_window"] is True
    assert check.loc[("mamba", 2, 1e-2), "in_window"] is False and check.loc[("mamba", 2, 1e-2), "note"] == "above its window"
    assert check.loc[("softmax", 2, 3e-3), "in_window"] is None and "learned at no rate" in check.loc[("softmax", 2, 3e-3), "note"]
    assert check.loc[("elu", 2, 3e-3), "in_window"] is None  # no window measured for elu
    assert check.loc[("mamba", 1, 3e-3), "in_window"] is None  # nor for mamba at one layer
    sentence = windows.check_sentence(check.reset_index())
    assert "outside for mamba (0.01)" in sentence and "no window measured for elu, softmax" in sentence


def test_a_ranked_figure_says_whether_each_mixers_rate_lies_in_its_window(tree, tmp_path):
    specs = [s for s in FIGURES if s.name in ("sharpness", "mqar")]
    written, missed = pipeline.render(specs, tree, tmp_path)
    assert not missed
    check = pd.read_csv(tmp_path / "sharpness_lr_window.csv").set_index("label")
    # the fixture's sharpness runs: two layers at 3e-3, inside softmax's window (open, 1e-3 to 1e-1
    # at two layers); the other mixers have none
    assert bool(check.loc["softmax", "in_window"]) and check.loc["softmax", "window_low"] == pytest.approx(1e-3)
    assert check.loc["elu", "note"] == "no window measured for this mixer and setting"
    spec = specs[[s.name for s in specs].index("sharpness")]
    data = pipeline.load_figure_data(tree, spec)
    fig = spec.draw(data)
    pipeline.check_rates(fig, "sharpness", data, pipeline.MeasuredWindows(tree))
    assert "learning-rate window (lr_window, measured on recall, 8 pairs, d_model 64): inside for softmax" \
        in fig.caption
    assert "no window measured for deltanet" in fig.get_suptitle().replace("\n", " ")
    assert not (tmp_path / "mqar_lr_window.csv").exists()  # one seed: an illustration ranks nothing
    bare = tmp_path / "bare"
    make_results.write_results_tree(bare, ["sharpness"])  # no lr_window sweep beside it
    pipeline.render(specs[1:], bare, tmp_path / "out")
    unmeasured = pd.read_csv(tmp_path / "out" / "sharpness_lr_window.csv")
    assert unmeasured["in_window"].isna().all()
