"""SNR: the crosstalk law on the untrained probe, and the trained law out of sample.

Left, log-log: measured SNR against sqrt(d/N), the untrained probe's random keys (hollow) and
the trained runs' retrieval heads at the state's nominal key dimension, sqrt(d_key / N_eff)
(filled), with the slope fitted per mixer and source; the law holds on the diagonal.

Right: what the trained law predicts before it sees a setting. Each run's kernel statistics
(d_kernel, the value codebook, the decay's N_eff per written pair) are measured once at its
training setting, on validation data (harness.measure.trained_theory's predictive mode), and
predict the top-1 accuracy at every other tested N through harness.measure.theory
(``acc_predicted_from_train`` of each settings row): x is that prediction, y the test
accuracy measured at the same setting. Only settings other than the training one are drawn:
at the training setting the statistics have seen the answer. Trained runs come from the
capacity sweep, at the learning rate chosen on validation there (analysis.plots.capacity).
snr_out_of_sample.csv puts beside each prediction the two naive extrapolations from the same
training point (nominal: the random-key law at d_key; anchored: the training read-out carried
with the random-key slope) and every source's error in accuracy and in log-odds;
snr_law_baseline.csv says per mixer whether the law beats them (softmax apart).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from analysis import stats
from analysis.plots import FigureSpec
from analysis.plots.capacity import SOURCES, capacity_selected, law_baseline_table, law_errors, out_of_sample_rows
from analysis.plots.common import (MissingData, WIDTH, caption, figure, label_order, label_styles, labelled,
                                   legend_outside, loglog_slope, new_figure, note, palette, retrieval_heads,
                                   setting_values, table, yerr)

# What this module's figures need (analysis.plots.figures finds it; nothing else lists them).
FIGURES = (
    # the untrained probe (hollow) beside the trained runs of the capacity sweep (filled)
    FigureSpec("snr", "snr", "snr_figure", also=("capacity",), notebook="nb_snr",
               tables=("snr_slopes", "snr_out_of_sample", "snr_law_baseline"),
               synthetic="analysis.synthetic.snr.snr_runs"),
)

FILLED = {"untrained probe": False, "trained": True}
_COLUMNS = ["model", "label", "source", "snr_predicted", "snr_measured"]
FROM_TRAIN = "acc_predicted_from_train"


def _selected_runs(data: pd.DataFrame) -> set | None:
    """run_dirs of the trained runs at the learning rate chosen on validation (as the capacity
    figure chooses); None when the runs carry no slices to choose on."""
    try:
        selected, _ = capacity_selected(data)
    except MissingData:
        return None
    return set(selected["run_dir"])


def snr_points(data: pd.DataFrame) -> pd.DataFrame:
    """(model, label, source, snr_predicted, snr_measured) rows of the nominal law, both SNRs
    positive and finite: the probe's rows (label = the probed mixer), the trained retrieval
    heads' (label = the run's, analysis.plots.labels), else run summaries."""
    parts = []
    probe = table(data, "probe", primary=True)
    if {"model", "snr_measured", "snr_predicted"} <= set(probe.columns):
        parts.append(probe.assign(source="untrained probe", label=probe["model"]))
    heads = retrieval_heads(table(data, "heads"))
    chosen = _selected_runs(data)
    if chosen is not None and "run_dir" in heads.columns:
        heads = heads[heads["run_dir"].isin(chosen)]
    if {"model", "snr_measured", "snr_predicted"} <= set(heads.columns):
        parts.append(labelled(heads).assign(source="trained"))
    runs = table(data, "runs")
    if {"summary.snr_measured", "summary.snr_predicted"} <= set(runs.columns):
        # A run already shown head by head is not counted again through its summary.
        shown = set(heads["run_dir"]) if "run_dir" in heads.columns else set()
        runs = runs[~runs["run_dir"].isin(shown) & (runs.get("mode", "train") == "train")]
        parts.append(labelled(runs).rename(columns={"summary.snr_measured": "snr_measured",
                                                    "summary.snr_predicted": "snr_predicted"}).assign(source="trained"))
    pts = pd.concat([p[_COLUMNS] for p in parts if set(_COLUMNS) <= set(p.columns)],
                    ignore_index=True) if parts else pd.DataFrame()
    if pts.empty:
        raise MissingData("no measured and predicted SNR (probe table, heads or summary)")
    for col in ("snr_predicted", "snr_measured"):
        pts[col] = pd.to_numeric(pts[col], errors="coerce")
    keep = np.isfinite(pts["snr_predicted"]) & np.isfinite(pts["snr_measured"]) \
        & (pts["snr_predicted"] > 0) & (pts["snr_measured"] > 0)
    if not keep.any():
        raise MissingData("no positive, finite SNR values to draw on log axes")
    return pts[keep].reset_index(drop=True)


def out_of_sample_points(data: pd.DataFrame) -> pd.DataFrame:
    """Settings rows of the chosen trained runs other than their training setting, with the
    measured accuracy, the law's prediction and its baselines (capacity.out_of_sample_rows)."""
    return out_of_sample_rows(data, _selected_runs(data))


def out_of_sample_table(points: pd.DataFrame) -> pd.DataFrame:
    """Per mixer, training N and test N: the prediction's mean over seeds and the measured
    accuracy's n, mean, interval and seeds (analysis.stats), measured - predicted, the
    baselines' means (nominal_mean, anchored_mean) and every source's mean |error| in accuracy
    and in log-odds (capacity.law_errors)."""
    keys = ["label", WIDTH, "train_n", "test_n", "name"]
    measured = stats.summarize(points, keys, "accuracy", count="count" if "count" in points.columns else None)
    errors = law_errors(points)
    means = {"predicted_mean": FROM_TRAIN, **{f"{k}_mean": v for k, v in SOURCES.items() if k != "law"}}
    means.update({c: c for c in errors.columns if c.startswith("err_")})
    present = {k: v for k, v in means.items() if v in errors.columns}
    predicted = errors.groupby(keys, dropna=False)[list(present.values())].mean()
    predicted.columns = list(present)
    out = measured.merge(predicted.reset_index(), on=keys, how="left")
    return out.assign(measured_minus_predicted=out["mean"] - out["predicted_mean"])


# The law's exponent: SNR = sqrt(d / N), so at a fixed key dimension SNR goes as N^(-1/2), and
# the measured SNR against the predicted one has a log-log slope of 1.
LAW_EXPONENT_IN_N = -0.5


def fit_slopes(points: pd.DataFrame) -> pd.DataFrame:
    """Fitted log-log slope and offset of measured on predicted SNR per (source, label), and the
    slope read as the exponent of N it implies at a fixed key dimension (exponent_in_n = -slope / 2)
    beside the law's (law_exponent_in_n, -1/2): a slope of 1.5 is SNR ~ N^(-3/4)."""
    rows = []
    if "label" not in points.columns:
        points = points.assign(label=points["model"])
    for (source, label), grp in points.groupby(["source", "label"], sort=False):
        slope = loglog_slope(grp["snr_predicted"], grp["snr_measured"])
        offset = float(np.mean(np.log(grp["snr_measured"]) - slope * np.log(grp["snr_predicted"]))) \
            if np.isfinite(slope) else float("nan")
        rows.append({"source": source, "label": label, "model": grp["model"].iat[0], "slope": slope,
                     "prefactor": float(np.exp(offset)), "points": len(grp),
                     "exponent_in_n": -slope / 2 if np.isfinite(slope) else float("nan"),
                     "law_exponent_in_n": LAW_EXPONENT_IN_N})
    return pd.DataFrame(rows)


def law_styles(points: pd.DataFrame) -> tuple[dict, dict]:
    """(colour, marker) per label of the law panel: probed mixers by name, trained runs by label."""
    probe = points[points["source"] == "untrained probe"]
    colors = palette(probe["model"]) if len(probe) else {}
    markers = dict.fromkeys(colors, "o")
    trained = points[points["source"] == "trained"]
    if len(trained):
        more, marks = label_styles(trained)
        colors.update(more)
        markers.update(marks)
    return colors, markers


def _draw_law(ax, pts: pd.DataFrame, fits: pd.DataFrame, colors: dict, markers: dict) -> None:
    for source, filled in FILLED.items():
        for label, rows in pts[pts["source"] == source].groupby("label"):
            ax.scatter(rows["snr_predicted"], rows["snr_measured"], s=22 if filled else 26, marker=markers[label],
                       facecolors=colors[label] if filled else "none", edgecolors=colors[label], linewidths=1.0,
                       alpha=0.85 if filled else 0.7)
    lo = float(min(pts["snr_predicted"].min(), pts["snr_measured"].min()))
    hi = float(max(pts["snr_predicted"].max(), pts["snr_measured"].max()))
    ax.plot([lo, hi], [lo, hi], color="k", ls="--", lw=1.0)
    for fit in fits.itertuples():
        if not np.isfinite(fit.slope):
            continue
        grp = pts[(pts["source"] == fit.source) & (pts["label"] == fit.label)]
        x = np.geomspace(grp["snr_predicted"].min(), grp["snr_predicted"].max(), 20)
        ax.plot(x, fit.prefactor * x ** fit.slope, color=colors[fit.label], lw=1.0,
                ls=":" if fit.source == "untrained probe" else "-")
    ax.set(xscale="log", yscale="log", xlabel="predicted SNR sqrt(d/N), nominal key dimension (ratio)",
           ylabel="measured SNR (signal / rms crosstalk)", title="the law: untrained probe and trained heads")


def _draw_out_of_sample(ax, points: pd.DataFrame, summary: pd.DataFrame) -> tuple[dict, dict]:
    colors, markers = label_styles(points)
    for lab in label_order(points):
        runs = points[points["label"] == lab]
        ax.scatter(runs[FROM_TRAIN], runs["accuracy"], s=6, color=colors[lab], alpha=0.35, linewidths=0)
        pts = summary[summary["label"] == lab]
        # outlines in each mixer's own marker: mixers that pile up at one point (all near 1) stay apart
        ax.scatter(pts["predicted_mean"], pts["mean"], s=28, facecolors="none", edgecolors=colors[lab],
                   linewidths=1.2, marker=markers[lab], zorder=3)
        have = pts[np.isfinite(pts["low"].astype(float))]
        if len(have):
            ax.errorbar(have["predicted_mean"], have["mean"], yerr=yerr(have["mean"], have["low"], have["high"]),
                        fmt="none", ecolor=colors[lab], elinewidth=0.9, capsize=2)
    ax.plot([0, 1], [0, 1], color="k", ls="--", lw=1.0)
    ax.set(xlim=(-0.02, 1.02), ylim=(-0.02, 1.02),
           xlabel="accuracy predicted from the training N (fraction)",
           ylabel="measured test accuracy (fraction)", title="trained law out of sample (other N than trained)")
    return colors, markers


@figure("snr")
def snr_figure(data) -> Figure:
    """Left: measured against predicted SNR (probe and trained heads, nominal law). Right:
    measured accuracy against the out-of-sample prediction at the settings not trained on."""
    pts = snr_points(data)
    colors, markers = law_styles(pts)
    oos = out_of_sample_points(data)
    fig, (law, right) = new_figure(1, 2, panel=(4.2, 3.9), legend=2.6)
    fits = fit_slopes(pts)
    _draw_law(law, pts, fits, colors, markers)
    summary = out_of_sample_table(oos) if len(oos) else pd.DataFrame()
    handles = [Line2D([], [], ls="", marker=markers[lab], color=colors[lab]) for lab in colors]
    labels = list(colors)
    if len(oos):
        label_colors, markers = _draw_out_of_sample(right, oos, summary)
        new = [lab for lab in label_colors if lab not in labels]
        handles += [Line2D([], [], ls="", marker=markers[lab], color=label_colors[lab]) for lab in new]
        labels += new
    else:
        right.set(xlabel="predicted accuracy (fraction)", ylabel="measured test accuracy (fraction)")
        note(right, f"no out-of-sample prediction in these results ({FROM_TRAIN} in the settings rows "
                    "of trained runs)")
        right.plot([0, 1], [0, 1], color="k", ls="--", lw=1.0)
    handles += [Line2D([], [], ls="", marker="o", markerfacecolor="none", markeredgecolor="0.3"),
                Line2D([], [], ls="", marker="o", color="0.3"), Line2D([], [], color="k", ls="--")]
    labels += ["untrained probe (hollow; fit dotted)", "trained runs (filled; fit solid)", "measured = predicted"]
    legend_outside(fig, None, handles, labels)
    caption(fig, "SNR: the law on the probe, and the trained law out of sample", summary,
            extra="Left: x = sqrt(d/N) with the state's nominal key dimension (probe: random keys; trained: "
                  "sqrt(d_key / N_eff) of the retrieval head), y = signal over rms crosstalk of the read-out. "
                  "Right: x = top-1 accuracy predicted through harness.measure.theory from the kernel statistics "
                  "measured once at the run's training N on validation data, y = test accuracy at that other N; "
                  "small dots: each run, markers: mean over seeds")
    slopes = fits.assign(slope=fits["slope"].round(3), prefactor=fits["prefactor"].round(3),
                         exponent_in_n=fits["exponent_in_n"].round(3))
    fig.tables = {"snr_slopes": slopes, "snr_out_of_sample": summary,
                  "snr_law_baseline": law_baseline_table(oos) if len(oos) else pd.DataFrame()}
    return fig
