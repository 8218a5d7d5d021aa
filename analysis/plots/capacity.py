"""Capacity: recall accuracy against N on the interference task, at equal width and per key
dimension, with the accuracy each mixer's trained statistics predict.

Two x-axes, because they answer two questions. N at equal model width (one panel per
d_model): what a model of a given size recalls. N / d_key (d_key = the state's key
dimension: d_head for elu, m for FAVOR+, 1 + d + d^2 for taylor): what a dimension of state
buys, the crosstalk law's own axis. Each curve is the test accuracy of one trained model
family, mean and 95% bootstrap interval over seeds (seaborn), at the learning rate chosen per
(mixer, width) on the validation split, its validation accuracy averaged over the tested N
(each N is an evaluation of the same models, trained at one N: choosing per N would stitch a
curve out of different models). Dashed, in each mixer's colour: the accuracy predicted from its own
trained statistics (harness.measure.trained_theory: measured d_kernel, N_eff, codebook) for
the same runs; grey dotted on the N / d_key panel: random keys in a state of dimension d_key
(the untrained law). The last panel keeps every learning rate's result.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from analysis.plots.common import (CI, CI_SEED, WIDTH, figure, legend_outside, log2_axis, lr_heatmap,
                                   mixer_handles, mixer_order, new_figure, note, palette, require,
                                   retrieval_heads, select_on_validation, table)
from analysis.plots.reference import accuracy_curve

POINT = ["model", WIDTH]  # one trained model family: the learning rate is chosen per point
PREDICTED = "acc_predicted_trained"


def capacity_points(data: pd.DataFrame) -> pd.DataFrame:
    """Interference-task slices by number of pairs, with ``n_over_d`` = N / summary.d_key."""
    rows = table(data, "slices", primary=True)
    if "slice" in rows.columns:
        rows = rows[rows["slice"] == "num_pairs"]
    if "task" in rows.columns:
        rows = rows[rows["task"] == "interference"]
    rows = require(rows, ["model", "value", "accuracy", "summary.d_key"],
                   "interference-task accuracy by num_pairs with summary.d_key")
    if WIDTH not in rows.columns:
        rows = rows.assign(**{WIDTH: np.nan})
    return rows.assign(n_over_d=rows["value"] / rows["summary.d_key"])


def capacity_selected(data: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(slice rows of the learning rate chosen on validation per point, per-lr table)."""
    return select_on_validation(capacity_points(data), POINT)


def predicted_points(data: pd.DataFrame, selected: pd.DataFrame) -> pd.DataFrame:
    """The retrieval head's accuracy predicted from trained statistics, for the selected runs
    and their N; empty when the runs carry no trained-statistics columns."""
    heads = retrieval_heads(table(data, "heads"))
    if heads.empty or PREDICTED not in heads.columns:
        return pd.DataFrame(columns=["model", WIDTH, "value", PREDICTED, "n_over_d"])
    keep = selected[["run_dir", "value", "summary.d_key"]].drop_duplicates()
    pts = heads.merge(keep, on=["run_dir", "value"], suffixes=("", "_sel"))
    if WIDTH not in pts.columns:
        pts = pts.assign(**{WIDTH: np.nan})
    pts = pts.dropna(subset=[PREDICTED])
    d_key = pts["summary.d_key_sel"] if "summary.d_key_sel" in pts.columns else pts["summary.d_key"]
    return pts.assign(n_over_d=pts["value"] / d_key)


def half_point(n, accuracy) -> float:
    """N at which accuracy (mean per N) first falls to 0.5, interpolated in log N; inf if it
    stays above 0.5 over the measured N, NaN if it starts below."""
    curve = pd.Series(np.asarray(accuracy, float), index=np.asarray(n, float)).groupby(level=0).mean().sort_index()
    if curve.empty or curve.iloc[0] < 0.5:
        return math.nan
    below = np.nonzero(curve.to_numpy() < 0.5)[0]
    if below.size == 0:
        return math.inf
    i = below[0]
    (n0, a0), (n1, a1) = (curve.index[i - 1], curve.iloc[i - 1]), (curve.index[i], curve.iloc[i])
    frac = (a0 - 0.5) / (a0 - a1)
    return float(math.exp(math.log(n0) + frac * (math.log(n1) - math.log(n0))))


def half_capacity_table(selected: pd.DataFrame, predicted: pd.DataFrame) -> pd.DataFrame:
    """Per mixer and width: N at 50% accuracy measured, predicted from the trained statistics,
    and their ratio (predicted / measured)."""
    rows = []
    for (model, width), grp in selected.groupby(["model", WIDTH], dropna=False):
        pred = predicted[(predicted["model"] == model) & (predicted[WIDTH] == width)] \
            if not predicted.empty else predicted
        measured = half_point(grp["value"], grp["accuracy"])
        expected = half_point(pred["value"], pred[PREDICTED]) if len(pred) else math.nan
        ratio = expected / measured if np.isfinite(measured) and np.isfinite(expected) else math.nan
        rows.append({"model": model, WIDTH: width, "d_key": float(grp["summary.d_key"].median()),
                     "n50_measured": measured, "n50_predicted": expected, "ratio": ratio})
    return pd.DataFrame(rows)


def _random_key_curve(ax, pts: pd.DataFrame) -> str | None:
    """Top-1 recall of random keys in a state of dimension d_key (the untrained law), at the
    median d_key, on the N / d_key axis; the reason when it cannot be drawn."""
    d = float(pts["summary.d_key"].median())
    vocab = pts["config.task.vocab_size"] if "config.task.vocab_size" in pts.columns else pd.Series(dtype=float)
    per_head = pts["summary.d_head"] if "summary.d_head" in pts.columns else pd.Series(dtype=float)
    if vocab.dropna().empty or per_head.dropna().empty:
        return "random-key law not drawn: needs config.task.vocab_size and summary.d_head"
    c = int(vocab.dropna().iat[0]) - int(vocab.dropna().iat[0]) // 2  # the value half of the vocabulary
    n = np.geomspace(max(2.0, pts["value"].min() / 2), pts["value"].max() * 4, 40)
    acc = accuracy_curve(d, n, candidates=c, value_dim=int(per_head.dropna().median()))
    ax.plot(n / d, acc, color="0.45", ls=":", lw=1.2)
    return None


@figure("capacity")
def capacity_figure(data) -> Figure:
    """Accuracy against N per width, against N / d_key, and every learning rate's result."""
    selected, per_lr = capacity_selected(data)
    predicted = predicted_points(data, selected)
    order = mixer_order(selected["model"])
    colors = palette(order)
    widths = sorted(selected[WIDTH].dropna().unique()) or [np.nan]
    # one row (a panel per width, then the law's axis and the learning rates) up to two widths;
    # more widths get a row of their own above the other two panels
    ncols = len(widths) + 2 if len(widths) <= 2 else max(len(widths), 2)
    nrows = 1 if len(widths) <= 2 else 2
    fig, axes = new_figure(nrows, ncols, panel=(3.3, 3.0), legend=1.9)
    for ax, width in zip(axes, widths):
        part = selected if np.isnan(width) else selected[selected[WIDTH] == width]
        sns.lineplot(part, x="value", y="accuracy", hue="model", hue_order=order, palette=colors,
                     marker="o", errorbar=CI, seed=CI_SEED, legend=False, ax=ax)
        if not predicted.empty:
            pred = predicted if np.isnan(width) else predicted[predicted[WIDTH] == width]
            sns.lineplot(pred, x="value", y=PREDICTED, hue="model", hue_order=order, palette=colors,
                         ls="--", lw=1.0, errorbar=None, legend=False, ax=ax)
        log2_axis(ax, part["value"])
        ax.set(ylim=(-0.02, 1.02), xlabel="N  (stored pairs)", ylabel="recall accuracy (fraction)",
               title="capacity at equal width" if np.isnan(width)
               else f"capacity at equal width: d_model {width:g}")
    first_free = len(widths) if nrows == 1 else ncols
    for ax in axes[len(widths):first_free]:
        ax.set_visible(False)

    law, heat = axes[first_free], axes[first_free + 1]
    styles = None if len(widths) < 2 else WIDTH
    sns.lineplot(selected, x="n_over_d", y="accuracy", hue="model", hue_order=order, palette=colors,
                 style=styles, marker="o", errorbar=CI, seed=CI_SEED, legend=False, ax=law)
    missing = _random_key_curve(law, selected)
    law.axvline(1.0, color="0.6", lw=0.8, ls=":")
    law.set_xscale("log", base=2)
    law.set(ylim=(-0.02, 1.02), xlabel="N / d_key  (pairs per key dimension)",
            ylabel="recall accuracy (fraction)", title="per key dimension (all widths)")
    lr_heatmap(heat, per_lr, [WIDTH], order, title="every learning rate")
    for ax in axes[first_free + 2:]:
        ax.set_visible(False)

    notes = [missing] if missing else []
    if predicted.empty:
        notes.append("no trained-statistics prediction in these results (acc_predicted_trained)")
    if notes:
        note(axes[0], "\n".join(notes))
    extra = {"predicted from trained statistics": Line2D([], [], color="0.3", ls="--"),
             "random keys, state of dim d_key": Line2D([], [], color="0.45", ls=":")}
    if styles:
        for width, dashes in zip(widths, ("", (4, 1.5), (1, 1), (3, 1, 1, 1))):
            line = {"dashes": dashes} if dashes else {"ls": "-"}
            extra[f"d_model {width:g} (N / d_key panel)"] = Line2D([], [], color="0.3", marker="o", **line)
    legend_outside(fig, None, mixer_handles(colors) + list(extra.values()), list(colors) + list(extra))
    fig.tables = {"capacity_per_lr": per_lr, "capacity_n50": half_capacity_table(selected, predicted)}
    return fig
