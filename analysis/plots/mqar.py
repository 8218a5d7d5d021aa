"""MQAR: recall accuracy against model width per (sequence length, pairs), with intervals.

The layout of Zoology's Figure 2. Each point is the test accuracy at the learning rate chosen
per point (mixer, width, seq_len, pairs) on the validation split, mean and 95% bootstrap
interval over seeds (seaborn); the last panel keeps every learning rate's result.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from analysis.plots.common import (CI, CI_SEED, LR, WIDTH, figure, interval, legend_outside, log2_axis,
                                   lr_heatmap, mixer_handles, mixer_order, new_figure, palette, require,
                                   select_on_validation, table)

POINT = ["model", WIDTH, "seq_len", "pairs"]


def mqar_points(data: pd.DataFrame) -> pd.DataFrame:
    """Recall accuracy per run and (seq_len, pairs): from slices by num_pairs (the test
    settings), else from the run summary with the run's task.seq_len and task.num_pairs."""
    slices = table(data, "slices", primary=True)
    if {"slice", "value", "seq_len", "accuracy"} <= set(slices.columns):
        pts = slices[slices["slice"] == "num_pairs"].rename(columns={"value": "pairs"})
    else:
        pts = table(data, "runs").rename(columns={
            "config.task.seq_len": "seq_len", "config.task.num_pairs": "pairs",
            "summary.accuracy": "accuracy", "summary.val_accuracy": "val_accuracy"})
    if "task" in pts.columns:
        pts = pts[pts["task"] == "recall"]
    if LR not in pts.columns:
        pts = pts.assign(**{LR: float("nan")})
    return require(pts, ["model", WIDTH, "seq_len", "pairs", "accuracy"],
                   "recall accuracy with config model.d_model and (seq_len, num_pairs)")


def best_over_lr(points: pd.DataFrame) -> pd.DataFrame:
    """Per point, the mean over seeds at the learning rate chosen on validation (`best_lr`)."""
    picked, _ = select_on_validation(points, POINT)
    best = picked.groupby(POINT + [LR], dropna=False)["accuracy"].mean().reset_index()
    return best.rename(columns={LR: "best_lr"})


def width_trend(picked: pd.DataFrame) -> pd.DataFrame:
    """Per mixer and (seq_len, pairs): each width's mean and 95% bootstrap interval over seeds
    (scipy.stats.bootstrap), and whether the mean at a wider model falls below the interval
    of a narrower one (`loses_with_width`: a training pathology, not capacity)."""
    rows = []
    for (model, seq_len, pairs), grp in picked.groupby(["model", "seq_len", "pairs"]):
        stats_by_width = [(w, *interval(g["accuracy"])) for w, g in sorted(grp.groupby(WIDTH))]
        for i, (w, mean, lo, hi) in enumerate(stats_by_width):
            narrower = stats_by_width[:i]
            floor = max((l if np.isfinite(l) else m for _, m, l, _ in narrower), default=-np.inf)
            rows.append({"model": model, "seq_len": seq_len, "pairs": pairs, WIDTH: w, "mean": mean,
                         "low": lo, "high": hi, "loses_with_width": bool(hi < floor) if np.isfinite(hi)
                         else bool(mean < floor)})
    return pd.DataFrame(rows)


@figure("mqar")
def mqar_figure(data) -> Figure:
    """One panel per (seq_len, pairs): accuracy against d_model per mixer; then every lr."""
    points = mqar_points(data)
    picked, per_lr = select_on_validation(points, POINT)
    order = mixer_order(picked["model"])
    colors = palette(order)
    panels = sorted(picked.groupby(["seq_len", "pairs"]).groups)
    ncols = min(4, len(panels) + 1)
    nrows = math.ceil((len(panels) + 1) / ncols)
    fig, axes = new_figure(nrows, ncols, panel=(3.2, 2.8), legend=1.0)
    for ax, (seq_len, pairs) in zip(axes, panels):
        part = picked[(picked["seq_len"] == seq_len) & (picked["pairs"] == pairs)]
        sns.lineplot(part, x=WIDTH, y="accuracy", hue="model", hue_order=order, palette=colors,
                     marker="o", errorbar=CI, seed=CI_SEED, err_style="bars", legend=False, ax=ax)
        log2_axis(ax, picked[WIDTH])
        ax.set(ylim=(-0.02, 1.02), title=f"seq_len {seq_len:g}, {pairs:g} pairs",
               xlabel="model width d_model (units)", ylabel="recall accuracy (fraction)")
    heat = axes[len(panels)]
    lr_heatmap(heat, per_lr, [WIDTH, "seq_len"], order, title="every learning rate")
    for ax in axes[len(panels) + 1:]:
        ax.set_visible(False)
    legend_outside(fig, None, mixer_handles(colors), list(colors))
    fig.suptitle("MQAR: accuracy against width (lr chosen on validation; 95% bootstrap interval over seeds)")
    fig.tables = {"mqar_per_lr": per_lr, "mqar_width_trend": width_trend(picked)}
    return fig
