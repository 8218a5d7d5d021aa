"""Every figure renders from synthetic results, writes PNG and PDF, and skips (never crashes)
when its data is absent; `python -m analysis.figures` plots existing results or runs the
missing sweeps first."""
from __future__ import annotations

import colorsys
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import make_results
from analysis.synthetic.capacity import CAPACITY, CAPACITY_REFERENCE_N, CAPACITY_TEST_N, CAPACITY_TRAIN_N
from analysis.synthetic.hybrid import HYBRID_LOWER_BOUND, HYBRID_ONE, HYBRID_PURE
from analysis.synthetic.sharpness import SHARPNESS_MAX_STEPS
from matplotlib.figure import Figure

from analysis import figures, pipeline, stats
from analysis.loader import load_all
from analysis.plots.capacity import capacity_figure
from analysis.plots.common import palette, retrieval_heads
from analysis.plots.cost import cost_rows, cost_slopes, state_figure
from analysis.plots.mqar import best_over_lr, mqar_points
from analysis.plots.sharpness import sharpness_figure, sharpness_rows
from analysis.plots.snr import fit_slopes, snr_points

REPO = Path(__file__).resolve().parents[1]
NAMES = [spec.name for spec in figures.FIGURES]
# the figures a quick results root draws (the law figure's sweep is the findings profile's)
QUICK = [spec.name for spec in pipeline.profile_figures(figures.FIGURES, "quick")]


@pytest.fixture(scope="module")
def frames(tree) -> dict[str, pd.DataFrame]:
    """Each figure's long frame as analysis.figures loads it (its sweep and the ones it also reads)."""
    return {s.name: figures.load_figure_data(tree, s) for s in figures.FIGURES if s.experiment is not None}


@pytest.fixture(scope="module")
def drawn(frames) -> dict[str, Figure]:
    """Each figure drawn once for the module (the tests below read it, none redraws it)."""
    return {s.name: s.draw() if s.experiment is None else s.draw(frames[s.name]) for s in figures.FIGURES}


# Tables of fits, tests and rankings derived from the points; every other CSV is one row per
# point with its seeds.
DERIVED = {"snr_slopes", "capacity_families", "capacity_schlag", "capacity_ranking", "sharpness_ranking",
           "induction_ranking", "forgetting_gap", "frontier_ranking", "mqar_ranking", "capacity_stops",
           "capacity_law_baseline", "snr_law_baseline", "hybrid_summary", "anatomy_heads", "lr_window"}


@pytest.mark.parametrize("name", NAMES)
def test_figure_renders_with_labelled_axes_and_a_legend(name, drawn):
    fig = drawn[name]
    assert isinstance(fig, Figure)
    shown = [ax for ax in fig.axes if ax.get_visible() and (ax.lines or ax.collections or ax.patches)
             and ax.get_label() != "<colorbar>"]  # a colorbar carries its unit on its own label
    assert shown, "no data drawn"
    colorbars = [ax for ax in fig.axes if hasattr(ax, "_colorbar")]
    for ax in shown:  # units in brackets on every numeric axis (a mixer axis is categorical)
        if ax in colorbars:  # a heatmap's colour bar: its label carries the unit
            assert "(" in ax.get_ylabel() + ax.get_xlabel(), ax.get_ylabel()
            continue
        twin = len(ax.get_shared_x_axes().get_siblings(ax)) > 1 and not ax.get_xlabel()
        assert twin or ax.get_xlabel() == "mixer" or "(" in ax.get_xlabel(), ax.get_xlabel()
        assert "(" in ax.get_ylabel(), ax.get_ylabel()
    assert fig.legends or colorbars, "a figure legend (or a heatmap's colour bar)"


TRAINED = [s.name for s in figures.FIGURES if s.experiment not in (None, "cost", "snr") and s.name != "attention"]


@pytest.mark.parametrize("name", TRAINED + ["snr"])
def test_trained_figures_name_n_and_the_method_and_their_tables_carry_the_seeds(name, drawn):
    fig = drawn[name]
    assert "seeds per point" in fig.caption and "n = " in fig.caption
    assert "n = " in fig.get_suptitle() and "seeds per point" in fig.get_suptitle()
    points = {k: v for k, v in fig.tables.items() if k not in DERIVED and len(v)}
    assert points, "a table of the points"
    for table_name, frame in points.items():
        assert {"n", "mean", "interval_method", "low", "high"} <= set(frame.columns), table_name
        assert any(c.startswith("seed_") for c in frame.columns), table_name
        few = frame[pd.to_numeric(frame["n"]) < stats.MIN_SEEDS]
        assert few["low"].isna().all() and (few["interval_method"] == stats.NO_INTERVAL).all(), table_name
        mean = pd.to_numeric(frame["mean"], errors="coerce")  # "never" (steps not reached), inf (N50 not reached)
        many = frame[(pd.to_numeric(frame["n"]) >= stats.MIN_SEEDS) & np.isfinite(mean)]
        if len(many):
            named = (stats.METHOD, stats.METHOD_SEEDS, stats.FALLBACK, stats.FALLBACK_SEEDS)
            assert many["low"].notna().all() and many["interval_method"].str.startswith(named).all(), table_name


def test_labels_show_the_options_that_vary_within_a_sweep():
    from analysis.plots.labels import label_runs

    def run(sweep, job, model, **options):
        return {"run_dir": f"/r/{sweep}/{job}", "model": model, "config.model.d_model": 32 + job,
                **{f"config.model.{k}": v for k, v in options.items()}}

    rows = pd.DataFrame([run("a", 0, "dpfp", dpfp_nu=1), run("a", 1, "dpfp", dpfp_nu=2),
                         run("a", 2, "favor", favor_features=128), run("a", 3, "favor", favor_features=None),
                         run("a", 4, "deltanet", rule="delta"), run("a", 5, "deltanet", rule="additive"),
                         run("a", 6, "elu"), run("a", 7, "elu"),                          # width only
                         run("a", 8, "pkg.Mix", **{"options.window": 8}), run("a", 9, "pkg.Mix", **{"options.window": 16}),
                         run("b", 0, "dpfp", dpfp_nu=3)])                                  # alone in its sweep
    labels = dict(zip(rows["run_dir"], label_runs(rows)["label"]))
    assert [labels[f"/r/a/{j}"] for j in range(10)] == [
        "dpfp ν=1", "dpfp ν=2", "favor m=128", "favor m=default", "deltanet delta", "deltanet additive",
        "elu", "elu", "pkg.Mix window=8", "pkg.Mix window=16"]
    assert labels["/r/b/0"] == "dpfp"


def test_an_experiment_split_by_chosen_rate_is_labelled_as_one_sweep():
    """The capacity sweep runs each mixer at its chosen rate, in one folder per rate
    (lr_edge.chosen_dir, and extensions under lr_extended): FAVOR+ at m = 8 alone in its rate's
    folder is still "favor m=8" beside m = 16 and 64 at another rate, never a bare "favor"."""
    from analysis.plots.labels import label_runs

    rows = pd.DataFrame([{"run_dir": f"/r/capacity/{sub}/{j}", "model": "favor", "config.model.favor_features": m}
                         for j, (sub, m) in enumerate([("lr_0.01_d8", 8), ("lr_0.03_d8", 16), ("lr_0.03_d8", 64),
                                                       ("lr_extended/lr_0.1", 128)])]
                        + [{"run_dir": "/r/sharpness/0", "model": "favor", "config.model.favor_features": None}])
    assert list(label_runs(rows)["label"]) == ["favor m=8", "favor m=16", "favor m=64", "favor m=128", "favor"]


def test_variants_take_shades_of_their_mixers_colour_and_a_marker_each():
    from analysis.plots.common import label_styles

    rows = pd.DataFrame({"model": ["dpfp", "dpfp", "dpfp", "elu"], "label": ["dpfp ν=1", "dpfp ν=2", "dpfp ν=3", "elu"]})
    colors, markers = label_styles(rows)
    assert list(colors) == ["elu", "dpfp ν=1", "dpfp ν=2", "dpfp ν=3"]           # the mixers' reading order
    assert colors["elu"] == palette(["elu"])["elu"] and colors["dpfp ν=2"] == palette(["dpfp"])["dpfp"]
    assert len({colors[f"dpfp ν={v}"] for v in (1, 2, 3)}) == 3 and len({markers[f"dpfp ν={v}"] for v in (1, 2, 3)}) == 3
    hue = {lab: colorsys.rgb_to_hls(*colors[lab][:3])[0] for lab in colors if lab != "elu"}
    assert max(hue.values()) - min(hue.values()) < 0.02                             # one hue, three shades


def _visible(fig):
    return {ax.get_title(): ax for ax in fig.axes if ax.get_visible()}


def _lines(ax, color, style="-"):
    return [line for line in ax.lines if line.get_color() == color and line.get_linestyle() == style
            and len(line.get_xdata()) > 1]


def test_capacity_follows_schlags_protocol_and_extrapolates_from_the_reference_n(drawn):
    fig = drawn["capacity"]
    panels = _visible(fig)
    protocol, extrapolation = panels["one model per N (Schlag's protocol)"], panels["trained at N = 16, tested at every N"]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[:8] == ["softmax", "elu", "favor m=16", "favor m=64", "dpfp ν=1", "dpfp ν=2", "deltanet additive",
                          "deltanet delta"]                                       # the failed mamba run is left out
    from analysis.plots.common import label_styles

    colors, _ = label_styles(pd.DataFrame({"model": [CAPACITY[lab][0] for lab in labels[:8]],
                                           "label": labels[:8]}))
    # each mixer's curve sits a small step along x from the others' (common.DODGE): by a common factor
    for ax, n in ((protocol, CAPACITY_TRAIN_N), (extrapolation, CAPACITY_TEST_N)):
        shift = _lines(ax, colors["elu"])[0].get_xdata() / np.asarray(n, float)
        assert np.allclose(shift, shift[0]) and abs(np.log(shift[0])) < 0.2
    assert _lines(extrapolation, colors["elu"], "--"), "the out-of-sample prediction"
    proto = fig.tables["capacity_protocol"].set_index(["label", "num_pairs"])
    assert (proto["n"] == 5).all() and (proto["interval_method"] == stats.METHOD).all()
    mean = _lines(protocol, colors["elu"])[0].get_ydata()
    np.testing.assert_allclose(mean, proto.loc["elu", "mean"].to_numpy())
    assert ((proto["low"] <= proto["mean"]) & (proto["mean"] <= proto["high"])).all()


def test_capacity_n50_measured_and_predicted_out_of_sample(drawn):
    half = drawn["capacity"].tables["capacity_n50"].set_index("label")
    # the protocol's break point is the fixture's (f(N / cap) = 0.5 at N = cap), up to the seeds' jitter
    for label in ("elu", "favor m=16", "dpfp ν=1", "deltanet additive"):
        assert half.loc[label, "n50_per_n"] == pytest.approx(CAPACITY[label][2], rel=0.05), label
        # the fixture's out-of-sample law predicts half of what the runs hold below their training N
        assert half.loc[label, "ratio_predicted_to_extrapolation"] == pytest.approx(0.5, abs=0.05), label
    assert half.loc["softmax", "n50_per_n"] == np.inf and half.loc["softmax", "interval_method"].startswith("none")
    assert (half["reference_n"] == CAPACITY_REFERENCE_N).all() and (half["n"] == 5).all()
    assert half.loc["elu", "low"] < half.loc["elu", "mean"] < half.loc["elu", "high"]
    assert half.loc["favor m=64", "state_elements_per_layer"] == CAPACITY["favor m=64"][4]
    assert {"n50_extrapolation", "n50_predicted", "ratio_predicted_to_per_n", "params"} <= set(half.columns)


def test_capacity_break_points_beside_schlag_and_the_exponent_per_family(drawn):
    fig = drawn["capacity"]
    schlag = fig.tables["capacity_schlag"].set_index("label")
    assert schlag.loc["elu", "schlag_keys_scaled"] == "15-20"                   # 60-80 at d = 64, d_head 16
    assert schlag.loc["dpfp ν=2", "schlag_keys_scaled"] == "70" and schlag.loc["dpfp ν=1", "schlag_row"] == "DPFP ν=1"
    assert "earliest" in schlag.loc["favor m=64", "schlag_keys_at_d64"]
    assert schlag.loc["deltanet delta", "schlag_row"] == ""                      # not in Schlag's table
    fits = fig.tables["capacity_families"].set_index("family")
    assert fits.loc["linear", "points"] == 5 and 0.2 < fits.loc["linear", "exponent"] < 1.0
    assert np.isnan(fits.loc["delta", "exponent"])                              # both at one state size
    state = _visible(fig)["break point against state size"]
    assert state.get_xscale() == "log" and state.get_yscale() == "log"


def test_capacity_chooses_the_learning_rate_on_validation_and_flags_the_edge(frames):
    from analysis.plots.capacity import capacity_selected

    selected, per_lr = capacity_selected(frames["capacity"])
    assert set(selected["config.trainer.lr"]) == {3e-3}     # 1e-2 scores better on test, worse on val
    assert per_lr["chosen"].sum() == 8 * 3 and (per_lr["selected_on"] == "validation").all()
    assert per_lr.loc[per_lr["chosen"], "lr_at_edge"].all()  # two rates (or one): the chosen one is an edge
    assert (per_lr["n"] == 5).all()


def test_half_point():
    from analysis.plots.capacity import half_point

    assert half_point([4, 8, 16], [1.0, 0.75, 0.25]) == pytest.approx(8 * 2 ** 0.5)
    assert half_point([4, 8], [0.9, 0.8]) == np.inf and np.isnan(half_point([4, 8], [0.4, 0.1]))


def test_capacity_without_the_prediction_says_so(frames):
    data = frames["capacity"]
    bare = data[data["table"] != "settings"].drop(columns=[c for c in data.columns if "from_train" in c])
    texts = " ".join(t.get_text() for ax in capacity_figure(bare).axes for t in ax.texts)
    assert "no out-of-sample prediction" in texts


def test_snr_law_and_the_trained_law_out_of_sample(drawn, frames):
    from analysis.plots.snr import out_of_sample_points

    pts = snr_points(frames["snr"])
    assert set(pts["source"]) == {"untrained probe", "trained"}
    fits = fit_slopes(pts).set_index(["source", "label"])
    for model in ("linear", "elu", "favor"):
        assert fits.loc[("untrained probe", model), "slope"] == pytest.approx(1.0, abs=0.1)
    assert fits.loc[("trained", "favor m=64"), "prefactor"] == pytest.approx(0.6)
    # the slope read as SNR ~ N^exponent at a fixed d, beside the law's -1/2
    assert (fits["exponent_in_n"] == -fits["slope"] / 2).all() and (fits["law_exponent_in_n"] == -0.5).all()
    oos = out_of_sample_points(frames["snr"])
    assert len(oos) and not (oos["test_n"] == oos["train_n"]).any()           # never the training N
    assert (oos["config.trainer.lr"] == 3e-3).all()                           # the capacity figure's choice
    fig = drawn["snr"]
    table = fig.tables["snr_out_of_sample"]
    assert (table["n"] == 5).all() and {"predicted_mean", "measured_minus_predicted"} <= set(table.columns)
    right = _visible(fig)["trained law out of sample (other N than trained)"]
    assert "training N" in right.get_xlabel() and "training N on validation data" in fig.caption


def test_mqar_at_zoologys_settings_with_a_paired_width_trend(drawn, frames):
    best = best_over_lr(mqar_points(frames["mqar"]))
    assert len(best) == 3 * 2 * 3                             # mixers x widths x (seq_len, pairs)
    assert dict(best.groupby("label")["best_lr"].first()) == {"elu": 1e-3, "mamba": 1e-2, "softmax": 1e-2}
    fig = drawn["mqar"]
    titles = sorted(t for t in _visible(fig) if t.startswith("seq_len"))
    assert titles == ["seq_len 128, 8 pairs", "seq_len 256, 16 pairs", "seq_len 64, 4 pairs"]
    trend = fig.tables["mqar_width_trend"].set_index(["label", "pairs", "config.model.d_model"])
    lost = trend.loc[("mamba", 16, 64)]
    assert lost["loses_with_width"] and lost["p_value"] < 0.05 and lost["n_paired"] == 3 and lost["vs_width"] == 32
    assert trend.loc[("elu", 8, 64), "gains_with_width"] and not trend["loses_with_width"].drop(("mamba", 16, 64)).any()
    assert (trend["test"] == stats.PAIRED_TEST).all() and trend["low"].isna().all()  # three seeds: no interval
    per_lr = fig.tables["mqar_per_lr"]
    chosen = per_lr[per_lr["chosen"]].set_index("label")
    assert chosen.loc["elu", "lr_at_edge"].all() and not chosen.loc["mamba", "lr_at_edge"].any()
    assert per_lr.loc[per_lr["lr_extended"], "config.trainer.lr"].eq(3e-2).all() and per_lr["lr_extended"].any()
    heat = next(ax for title, ax in _visible(fig).items() if title.startswith("every learning rate"))
    dashed = [p for p in heat.patches if p.get_linestyle() == "--"]
    assert len(dashed) == 2 * 3 * 2                                 # elu and softmax, every width and setting
    # mamba's rates extended past the grid: every setting tried three, the chosen one outlined solid
    assert len([p for p in heat.patches if p.get_linestyle() == "-"]) == 2 * 3


def test_a_heatmap_outlines_nothing_where_one_rate_was_tried():
    from matplotlib.figure import Figure

    from analysis.plots.common import lr_heatmap

    table = pd.DataFrame({"label": ["softmax", "elu"], "config.trainer.lr": [1e-3, 1e-3], "val_score": [0.9, 0.5],
                          "chosen": [True, True], "lr_at_edge": [True, True], "selected_on": ["validation"] * 2})
    ax = Figure().subplots()
    lr_heatmap(ax, table, [], ["softmax", "elu"], title="every learning rate")
    assert not ax.patches and "one rate per setting: none chosen" in ax.get_title()
    # a rate chosen before the sweep (capacity's pilot) is said, still with no outline
    ax = Figure().subplots()
    lr_heatmap(ax, table, [], ["softmax", "elu"], title="every learning rate", chosen_before="the rate pilot")
    assert not ax.patches and "one rate per setting, chosen by the rate pilot" in ax.get_title()


def test_the_capacity_heatmap_says_the_pilot_chose_runs_in_per_rate_folders(tree, tmp_path):
    """Capacity runs written under a per-rate folder (lr_edge.chosen_dir) ran at the rate the
    pilot chose for them, and the heatmap says so rather than "none chosen"."""
    import json
    import shutil

    from conftest import draw_figure

    from analysis.lr_edge import chosen_dir

    root = tmp_path / "results"
    runs = {d: json.loads((d / "results.json").read_text()) for d in (tree / "capacity").iterdir()
            if (d / "results.json").is_file()}
    rates = [r["config"].get("trainer.lr") for r in runs.values()]
    rate = min(x for x in rates if x is not None)  # one rate, as a piloted sweep runs
    for d, r in runs.items():
        if r["config"].get("trainer.lr") == rate:
            shutil.copytree(d, chosen_dir(root / "capacity", rate, "8") / d.name)
    heat = next(ax for ax in draw_figure(root, "capacity").axes if "every learning rate" in ax.get_title())
    assert "chosen by the rate pilot" in heat.get_title()


def test_width_trend_is_a_paired_test_across_seeds():
    from analysis.plots.mqar import width_trend

    seeds = [0, 1, 2, 3]
    rows = pd.DataFrame({"label": "m", "seq_len": 64, "pairs": 8, "config.seed": seeds * 2,
                         "config.model.d_model": [32] * 4 + [64] * 4,
                         "accuracy": [0.50, 0.70, 0.60, 0.80, 0.48, 0.69, 0.58, 0.79]})  # 0.015 lower, every seed
    trend = width_trend(rows).set_index("config.model.d_model")
    assert trend.loc[64, "loses_with_width"] and trend.loc[64, "p_value"] < 0.05
    noisy = rows.assign(accuracy=[0.5, 0.7, 0.6, 0.8, 0.6, 0.55, 0.7, 0.72])
    assert not width_trend(noisy)["loses_with_width"].any()


def test_induction_bars_take_the_validation_choice_and_claim_no_interval(drawn, frames):
    fig = drawn["induction"]
    bars = _visible(fig)["Induction accuracy per mixer"].patches
    runs = frames["induction"][frames["induction"]["table"] == "runs"]
    chosen = runs[runs["config.trainer.lr"] == 3e-3].groupby("model")["summary.accuracy"].mean()
    assert [b.get_height() for b in bars] == pytest.approx([chosen[m] for m in ("softmax", "elu", "mamba", "deltanet")])
    assert fig.tables["induction_per_lr"]["chosen"].sum() == 4
    assert "no interval (n < 5)" in fig.caption
    assert (fig.tables["induction_ranking"]["verdict"] == "no interval (n < 5)").all()


def test_sharpness_bars_follow_the_retrieval_head_with_each_seed(drawn, frames):
    rows = sharpness_rows(frames["sharpness"])
    focus = retrieval_heads(rows)
    assert set(zip(focus["layer"], focus["head"])) == {(0, 0)} and len(rows) == 4 * len(focus)
    fig = drawn["sharpness"]
    ax = fig.axes[1]
    heights = [bar.get_height() for bar in ax.patches]   # softmax, linear, elu, favor, deltanet
    expected = focus.groupby(["model", "config.seed"])["target_weight"].mean().groupby("model").mean()
    assert heights == pytest.approx([expected[m] for m in ("softmax", "linear", "elu", "favor", "deltanet")])
    dots = [c for c in ax.collections if len(c.get_offsets()) == 5]
    assert len(dots) == 5                                  # each bar's five seeds
    table = fig.tables["sharpness"].set_index(["metric", "label"])
    # cut to each measure's range, and named so
    assert (table.loc["target_weight", "interval_method"] == f"{stats.METHOD_SEEDS}, within [0, 1]").all()
    assert table["low"].notna().all()
    assert (table.loc["monotonicity", "interval_method"] == f"{stats.FALLBACK_SEEDS}, within [-1, 1]").all()
    ranking = fig.tables["sharpness_ranking"]
    softmax = ranking[(ranking["metric"] == "target_weight") & (ranking["a"] == "softmax")]
    assert len(softmax) == 4 and softmax["separated"].all()
    assert "bars: retrieval head" in fig.get_suptitle() and stats.METHOD_SEEDS in fig.caption


def test_sharpness_falls_back_to_run_summaries(frames):
    runs_only = frames["sharpness"][frames["sharpness"]["table"] == "runs"]
    fig = sharpness_figure(runs_only)
    assert isinstance(fig, Figure) and len(fig.axes) == 3  # entropy, weight on the answer, every learning rate
    assert fig.axes[0].get_ylabel() == "attention entropy H (nats)"


def test_learning_curves_and_the_steps_to_09(drawn):
    fig = drawn["learning"]
    # more mixers than one panel carries: a row of panels per family, each task a column
    assert set(_visible(fig)) >= {f"{task}\n{family} family" for task in ("task recall", "task interference, trained at N = 16")
                                  for family in ("softmax", "linear", "delta")}
    steps = fig.tables["learning_steps"].set_index(["panel", "label"])
    softmax = steps.loc[("task recall", "softmax")]
    assert softmax["n"] == 5 and isinstance(softmax["mean"], float) and softmax["seed_0"] == 100
    assert steps.loc[("task recall", "linear"), "mean"] == "never for 5 of 5 seeds"
    assert (steps.loc[("task recall", "linear"), [f"seed_{s}" for s in range(5)]] == "never").all()
    # seeds 0-2 stopped on their plateau: fewer steps than max_steps, and said so
    assert steps.loc[("task recall", "softmax"), "steps_trained_0"] < SHARPNESS_MAX_STEPS
    assert "plateau x3" in steps.loc[("task recall", "softmax"), "stop_reasons"]
    assert "stopped: plateau" in [t.get_text() for t in fig.legends[0].get_texts()]


def test_frontier_on_state_elements_with_bytes_on_top(drawn):
    fig = drawn["frontier"]
    mean_ax = _visible(fig)["mean over the test settings"]
    assert "elements" in mean_ax.get_xlabel() and mean_ax.child_axes
    assert "bytes" in mean_ax.child_axes[0].get_xlabel()
    table = fig.tables["frontier"]
    assert {"params", "state_elements_per_layer", "state_bytes_per_layer"} <= set(table.columns)
    assert set(table["label"]) == {"softmax", "swa", "elu", "taylor", "deltanet delta", "deltanet additive"}
    assert "mixture (64, 4) x1, (128, 16) x1" in fig.caption
    largest = fig.tables["frontier_largest"]
    assert (largest["test_setting"] == "seq_len=512,num_pairs=64").all()


def test_forgetting_gap_is_tested_paired_by_seed(drawn):
    gap = drawn["forgetting"].tables["forgetting_gap"].set_index("label")
    assert gap.loc["elu", "gap"] == pytest.approx(-0.45) and gap.loc["deltanet additive", "gap"] == pytest.approx(-0.40)
    assert (gap["n_paired"] == 2).all() and (gap["test"] == stats.PAIRED_TEST).all()


def test_length_reaches_16k_with_the_theory(drawn):
    fig = drawn["length"]
    table = fig.tables["length"]
    assert table["seq_len"].max() == 16384 and set(table["label"]) == {"softmax", "elu", "retnet", "mamba", "deltanet"}
    ax = fig.axes[0]
    assert [line for line in ax.lines if line.get_linestyle() == "--"], "predicted accuracy"


def test_the_length_law_is_drawn_only_for_models_without_a_kv_cache():
    """The crosstalk law describes one fixed-size state: a model that keeps keys (softmax, swa's
    window, a hybrid with an attention layer) gets no predicted line, whatever it is called."""
    from analysis.plots.length import FILLER, theory_lines

    run = {FILLER: "zero", "summary.d_key": 64, "summary.d_head": 64, "config.task.vocab_size": 256,
           "config.task.num_pairs": 4}
    points = pd.DataFrame([{**run, "run_dir": "a", "label": "elu", "model": "elu", "summary.attention_kv_cache_bytes": 0},
                           {**run, "run_dir": "b", "label": "swa", "model": "swa",
                            "summary.attention_kv_cache_bytes": 32768},
                           {**run, "run_dir": "c", "label": "gated_deltanet+softmax", "model": "gated_deltanet+softmax",
                            "summary.attention_kv_cache_bytes": 8192}])
    lines, missing = theory_lines(points, np.array([64, 256, 1024]))
    assert set(lines) == {("zero", "elu")} and missing is None


def test_the_attention_figure_takes_the_best_seed_and_breaks_ties_to_the_lowest(tmp_path):
    """Seeds often tie near an accuracy of 1: the one drawn is the lowest seed among the best,
    whatever order the runs were read in; a run without weights is never drawn."""
    from analysis.plots.attention import trained_runs

    rows = []
    for seed, acc, weights in [(3, 0.99, True), (1, 0.99, True), (4, 0.98, True), (0, 0.995, False)]:
        run_dir = tmp_path / f"softmax-{seed}"
        run_dir.mkdir()
        if weights:
            (run_dir / "model.pt").write_bytes(b"")
        rows.append({"model": "softmax", "run_dir": str(run_dir), "summary.accuracy": acc, "config.seed": seed})
    for order in (rows, rows[::-1]):
        best = trained_runs(pd.DataFrame(order), models=["softmax"])
        assert best["config.seed"].tolist() == [1]


def test_state_figure_marks_the_gpt2_crossover():
    fig = state_figure()
    ax = fig.axes[0]
    assert any("crossover N ≈ 32" in t.get_text() for t in ax.texts)
    kv = next(line for line in ax.lines if "KV cache" in line.get_label())
    n, elements = kv.get_xdata(), kv.get_ydata()
    np.testing.assert_allclose(elements, 2 * 64 * n)
    state = next(line for line in ax.lines if "d·d + d" in line.get_label())
    assert state.get_ydata()[0] == 64 * 64 + 64


def test_cost_slopes_follow_the_form(frames, tree):
    rows = cost_rows(load_all(tree / "cost"))
    slopes = cost_slopes(rows).set_index(["pass", "family", "form"])["slope"]
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

    monkeypatch.setattr(pipeline.subprocess, "run", no_sweeps)
    out = tmp_path / "figs"
    assert figures.main(["--results", str(tree), "--out", str(out)]) == 0
    printed = capsys.readouterr()
    for name in QUICK:
        png, pdf = (out / f"{name}.png").read_bytes(), (out / f"{name}.pdf").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000, name
        assert pdf[:5] == b"%PDF-" and len(pdf) > 5_000, name
        assert f"{name}: {out / name}.png, {out / name}.pdf" in printed.out
    assert f"wrote {len(QUICK)} of {len(QUICK)} figures to {out}" in printed.out
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
    monkeypatch.setattr(pipeline.subprocess, "run", fake_run)
    monkeypatch.setattr(pipeline, "save_figure", drawn)
    # quick: every figure whose sweep the profile has (the law figure's is the findings profile's);
    # paper: a subset, to check the experiment names at less cost.
    chosen = [s.name for s in figures.FIGURES if s.experiment is None or pipeline.in_profile("quick", s.experiment)] \
        if profile == "quick" else ["capacity", "snr", "state_vs_kv", "cost"]
    # the fixture's capacity sweep holds every job of the quick grid, not of the paper's: there it
    # is an unfinished sweep, and is run again
    unfinished = [] if pipeline.sweep_complete(root, "capacity", profile) else ["capacity"]
    assert unfinished == ([] if profile == "quick" else ["capacity"])
    assert figures.main(["--profile", profile, "--out", "figs", "--only", *chosen]) == 1  # cost not drawn
    prefix = "" if profile == "quick" else "paper/"
    missing = [e for e in ("snr", "sharpness", "mqar", "induction", "cost", "length", "needle", "frontier",
                           "forgetting", "reassignment", "hybrid", "anatomy", "mechanism", "lr_window") if e in chosen]
    # each missing or unfinished sweep run once, in the order the figures are declared
    assert sorted(c[4] for c in calls) == sorted(f"+experiment={prefix}{e}" for e in missing + unfinished)
    assert all(c[:4] == [sys.executable, "-m", "harness", "-m"] for c in calls)
    snr = next(c for c in calls if c[4] == f"+experiment={prefix}snr")
    assert snr[5] == f"hydra.sweep.dir={(root / 'snr').resolve().as_posix()}"
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

    monkeypatch.setattr(pipeline.subprocess, "run", no_sweeps)
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
    missed = [s.name for s in pipeline.profile_figures(figures.FIGURES, "quick")
              if s.experiment not in (None, "capacity", "snr")]
    assert len(missed) >= 10 and "learning" in missed  # learning's own sweep (sharpness) is missing
    assert last == (f"python -m analysis.figures: {len(missed)} figure(s) not drawn: {', '.join(missed)} "
                    "(see the warnings above)")


def test_smoke_discovers_experiments_from_the_files():
    from analysis import smoke
    from harness.config.compose import CONF_DIR

    files = sorted(p.stem for p in (CONF_DIR / "experiment" / "paper").glob("*.yaml"))
    assert smoke.experiments("paper") == files
    params = smoke.sweep_params("paper", "mqar")
    assert params["model.d_model"] == ["64", "128", "256", "512"]
    # mixers x widths x seq_len x pairs x learning rates x seeds
    assert smoke.job_count(params, "all") == len(params["model"]) * 4 * 3 * 3 * 4 * 5
    assert smoke.grid_overrides(params, "last") == ["model.d_model=512", "task.seq_len=256",
                                                    "task.num_pairs=16", "trainer.lr=1e-2", "seed=4"]


def test_smoke_runs_each_experiment_through_the_launcher_and_prices_it(tree, tmp_path, monkeypatch, capsys):
    """The smoke's commands and cost arithmetic, on fixture results (the real sweeps: test_paper_smoke)."""
    import json

    from analysis import smoke

    calls = []
    root = tmp_path / "smoke"
    specs = [s for s in figures.FIGURES if s.name in ("capacity", "snr")]
    code = smoke.run("paper", root, tmp_path / "figs", specs, only={"capacity", "snr"},
                     runner=make_results.sweep_runner(calls))
    assert code == 0
    assert [c[4] for c in calls] == ["+experiment=paper/capacity", "+experiment=paper/snr"]
    assert all("trainer.max_steps=1" in c and "trainer.device=cpu" in c for c in calls)
    estimate = json.loads((root / smoke.COST_FILE).read_text())
    capacity = estimate["experiments"]["capacity"]
    assert capacity["jobs"] == 17 * 7 * 3 * 5 and capacity["steps_per_job"] == 20000
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


def test_a_learning_rate_table_cuts_its_accuracy_intervals_to_zero_one():
    # five seeds near 1.0 with one outlier: an uncut studentized interval runs past 1
    from analysis.plots.common import select_on_validation
    rows = pd.DataFrame({"label": ["softmax"] * 5, "config.trainer.lr": [3e-3] * 5, "seed": range(5),
                         "summary.accuracy": [1.0, 1.0, 0.99, 1.0, 0.6], "summary.val_accuracy": [1.0] * 5})
    _, table = select_on_validation(rows, ["label"], test="summary.accuracy", val="summary.val_accuracy")
    row = table.iloc[0]
    assert row["n"] == 5 and 0.0 <= row["low"] <= row["mean"] <= row["high"] <= 1.0
    assert row["interval_method"].endswith("within [0, 1]")


def test_the_hybrid_figure_reads_recall_at_the_training_mixtures_largest_n():
    from analysis.plots.hybrid import recall_setting

    runs = pd.DataFrame({"summary.accuracy": [0.7, 0.6], "summary.accuracy/num_pairs=32": [0.9, 0.8],
                         "summary.accuracy/num_pairs=96": [0.5, 0.4], "summary.accuracy/num_pairs=128": [0.2, None],
                         "summary.accuracy/seq_len=512,num_pairs=256": [0.1, 0.1],
                         "config.task.mixture": [((128, 8, 2), (128, 32, 1))] * 2})
    assert recall_setting(runs) == ("summary.accuracy/num_pairs=32", 32, "the training mixture's largest N")
    # trained at one N (no mixture) and tested past it: the largest N every run was tested at
    old = runs.drop(columns="config.task.mixture").assign(**{"config.task.num_pairs": 16})
    assert recall_setting(old) == ("summary.accuracy/num_pairs=96", 96, "the largest N every run was tested at")
    one = runs[["summary.accuracy", "summary.accuracy/num_pairs=32"]]
    assert recall_setting(one)[:2] == ("summary.accuracy", None)


def test_the_hybrid_tables_carry_lower_bounds_the_retrieval_layer_and_the_summary(drawn):
    tables = drawn["hybrid"].tables
    points = tables["hybrid"].set_index(["recurrent", "pattern"])
    recurrent, pattern, _ = HYBRID_LOWER_BOUND
    assert points.loc[(recurrent, pattern), "runs_at_max_steps"] == 1 and points.loc[(recurrent, pattern), "lower_bound"]
    assert points["runs_at_max_steps"].sum() == 1
    assert (points["n"] == 5).all()
    # the interchange maps (gated_deltanet's runs only): the first attention layer took retrieval
    gdn = points.loc["gated_deltanet"]
    assert [gdn.loc[f"1@{at}", "retrieval_layer"] for at in range(4)] == [0, 1, 2, 3]
    assert gdn.loc["2@1,3", "retrieval_layer_runs"] == "1,1,1,1,1" and points.loc[("elu", "1@2"), "retrieval_layer"] != 0
    summary = tables["hybrid_summary"].set_index(["recurrent", "quantity"])
    one = summary.loc[("gated_deltanet", "recall(1@any) - recall(none)")]
    expected = np.mean(HYBRID_ONE) - HYBRID_PURE["gated_deltanet"]
    assert one["value"] == pytest.approx(expected, abs=0.05) and one["low"] < one["value"] < one["high"]
    assert one["interval_method"] == stats.DIFFERENCE
    rho = summary.loc[("elu", "spearman(recall, attention share)")]
    assert 0.5 < rho["low"] <= rho["value"] <= rho["high"] <= 1.0 and rho["interval_method"].startswith(stats.SPEARMAN)
    assert rho["n_none_or_seeds"] == 5 and rho["n_with_or_runs"] == 35


def test_the_anatomy_tables_name_the_heads_built_to_gather_and_aggregate(drawn):
    tables = drawn["anatomy"].tables
    points = tables["anatomy"].set_index(["label", "number"])
    for label in ("softmax*2 (no conv)", "gated_deltanet*2 (no conv)", "gated_deltanet+softmax (no conv)"):
        assert points.loc[(label, "A resample"), "n"] == 5 and points.loc[(label, "G path"), "meets"] == 1.0
        assert points.loc[(label, "A resample"), "runs_with_ga"] == 5
    # with the convolution the fixture's softmax stack aggregates in layer 0 and has no gather head
    assert "G path" not in points.loc["softmax*2"].index and points.loc[("softmax*2", "A patched"), "runs_with_ga"] == 0
    assert points.loc[("gated_deltanet*2 (no conv)", "A weight"), "runs_at_max_steps"] == 1
    roles = tables["anatomy_roles"].set_index(["label", "layer", "role"])
    assert roles.loc[("softmax*2 (no conv)", 0, "G"), "mean"] == 1 and roles.loc[("softmax*2 (no conv)", 1, "A"), "mean"] == 1
    assert roles.loc[("softmax*2 (no conv)", 0, "A"), "mean"] == 0
    # the run without rows was reopened from its model.pt and ablated
    assert "gated_deltanet+softmax" in set(tables["anatomy"]["label"])


def test_an_interval_a_rounding_error_inside_its_mean_draws():
    """A mean of exactly 1 whose interval, cut to [0, 1], ends at 1 - 1.1e-16 (as five seeds all
    at 1.0 give): the error bars start at the mean, and matplotlib draws them."""
    import matplotlib.pyplot as plt

    from analysis.plots.common import yerr

    below_above = yerr([1.0, 0.5], [0.99, 0.4], [1.0 - 1.1e-16, 0.6])
    assert (below_above >= 0).all() and below_above[1, 0] == 0.0
    assert below_above[:, 1] == pytest.approx([0.1, 0.1])
    fig, ax = plt.subplots()
    ax.errorbar([1, 2], [1.0, 0.5], yerr=below_above)
    plt.close(fig)
