"""MQAR: recall accuracy against model width per (sequence length, pairs), best learning rate.

As in Zoology's sweeps, each point is the best accuracy over the learning rates tried
(mean over seeds first, then the maximum over config trainer.lr).
"""
from __future__ import annotations

import math

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from analysis.plots.common import (figure, legend_outside, log2_axis, mixer_handles, mixer_order,
                                   new_figure, palette, require, table)

WIDTH, LR = "config.model.d_model", "config.trainer.lr"


def mqar_points(data: pd.DataFrame) -> pd.DataFrame:
    """Recall accuracy per run and (seq_len, pairs): from slices by num_pairs (the test
    settings), else from the run summary with the run's task.seq_len and task.num_pairs."""
    slices = table(data, "slices", primary=True)
    if {"slice", "value", "seq_len", "accuracy"} <= set(slices.columns):
        pts = slices[slices["slice"] == "num_pairs"].rename(columns={"value": "pairs"})
    else:
        pts = table(data, "runs").rename(columns={
            "config.task.seq_len": "seq_len", "config.task.num_pairs": "pairs",
            "summary.accuracy": "accuracy"})
    if "task" in pts.columns:
        pts = pts[pts["task"] == "recall"]
    if LR not in pts.columns:
        pts = pts.assign(**{LR: float("nan")})
    return require(pts, ["model", WIDTH, "seq_len", "pairs", "accuracy"],
                   "recall accuracy with config model.d_model and (seq_len, num_pairs)")


def best_over_lr(points: pd.DataFrame) -> pd.DataFrame:
    """Mean over seeds per learning rate, then the best learning rate per point."""
    keys = ["model", WIDTH, "seq_len", "pairs"]
    mean = points.groupby(keys + [LR], dropna=False)["accuracy"].mean().reset_index()
    best = mean.loc[mean.groupby(keys)["accuracy"].idxmax()]
    return best.rename(columns={LR: "best_lr"}).reset_index(drop=True)


@figure("mqar")
def mqar_figure(data) -> Figure:
    """One panel per (seq_len, pairs): accuracy against d_model per mixer."""
    best = best_over_lr(mqar_points(data))
    order = mixer_order(best["model"])
    colors = palette(order)
    panels = sorted(best.groupby(["seq_len", "pairs"]).groups)
    ncols = min(4, len(panels))
    fig, axes = new_figure(math.ceil(len(panels) / ncols), ncols, panel=(3.2, 2.8), legend=1.0,
                           sharex=True, sharey=True)
    for ax, (seq_len, pairs) in zip(axes, panels):
        part = best[(best["seq_len"] == seq_len) & (best["pairs"] == pairs)]
        sns.lineplot(part, x=WIDTH, y="accuracy", hue="model", hue_order=order, palette=colors,
                     marker="o", ax=ax)
        log2_axis(ax, best[WIDTH])
        ax.set(ylim=(-0.02, 1.02), title=f"seq_len {seq_len:g}, {pairs:g} pairs",
               xlabel="model width d_model (units)", ylabel="recall accuracy (fraction)")
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    legend_outside(fig, None, mixer_handles(colors), list(colors))
    fig.suptitle("MQAR: accuracy against width, best learning rate")
    return fig
