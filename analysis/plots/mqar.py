"""MQAR: recall accuracy against model width per (sequence length, pairs), Zoology's Figure 2.

Each run is trained and tested at one (seq_len, pairs) (Zoology's (64, 4), (128, 8), (256, 16)
in the experiment file, mixer-only blocks, a vocabulary of 8,192). Each point is the test
accuracy at the learning rate chosen per point (mixer, width, seq_len, pairs) on the validation
split where the grid has several (the caption says when it has one, set and not chosen): each
seed drawn, the mean, an interval only from five seeds (analysis.stats). The last panel keeps
every learning rate's result, the chosen rate marked where it sits at the edge of the rates tried;
a rate the sweep added past its grid's edge is `lr_extended` in the table.
Whether accuracy falls with width is a paired t-test across seeds (`mqar_width_trend.csv`).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analysis import stats
from analysis.plots import FigureSpec
from analysis.plots.common import (LR, WIDTH, caption, draw_estimates, figure, label_order, label_styles, labelled,
                                   legend_outside, log2_axis, lr_heatmap, mixer_handles, new_figure, require,
                                   ranking_stops, select_on_validation, table, with_stops)

# What this module's figures need (analysis.plots.figures finds it; nothing else lists them).
FIGURES = (
    FigureSpec("mqar", "mqar", "mqar_figure", notebook="nb_mqar",
               tables=("mqar_per_lr", "mqar_width_trend", "mqar_ranking"),
               synthetic="analysis.synthetic.mqar.mqar_runs"),
)

POINT = ["label", WIDTH, "seq_len", "pairs"]
ALPHA = 0.05  # the paired test's level for calling a trend


def mqar_points(data: pd.DataFrame) -> pd.DataFrame:
    """Recall accuracy per run and (seq_len, pairs), labelled: from slices by num_pairs (the
    test settings), else from the run summary with the run's task.seq_len and task.num_pairs."""
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
    pts = require(pts, ["model", WIDTH, "seq_len", "pairs", "accuracy"],
                  "recall accuracy with config model.d_model and (seq_len, num_pairs)")
    return labelled(pts)


def _count(points: pd.DataFrame) -> str | None:
    return "count" if "count" in points.columns and points["count"].notna().all() else None


def best_over_lr(points: pd.DataFrame) -> pd.DataFrame:
    """Per point, the mean over seeds at the learning rate chosen on validation (`best_lr`)."""
    picked, _ = select_on_validation(points, POINT, count=_count(points))
    best = picked.groupby(POINT + [LR], dropna=False)["accuracy"].mean().reset_index()
    return best.rename(columns={LR: "best_lr"})


def width_trend(picked: pd.DataFrame) -> pd.DataFrame:
    """Per mixer, (seq_len, pairs) and width: the point's n, mean, interval and seeds, and a
    paired t-test across seeds against the next narrower width (`vs_width`, `diff` = wider -
    narrower, `p_value`). `loses_with_width` / `gains_with_width`: the difference is significant
    at ALPHA (a loss with width is a training pathology, not capacity)."""
    by = ["label", "seq_len", "pairs", WIDTH]
    summary = with_stops(stats.summarize(picked, by, "accuracy", count=_count(picked)), picked, by)
    per_seed = stats.per_seed(picked, ["label", "seq_len", "pairs", WIDTH], "accuracy", count=_count(picked))
    rows = []
    for _, point in summary.iterrows():
        same = (per_seed["label"] == point["label"]) & (per_seed["seq_len"] == point["seq_len"]) \
            & (per_seed["pairs"] == point["pairs"])
        narrower = sorted(w for w in per_seed.loc[same, WIDTH].unique() if w < point[WIDTH])
        test = {"vs_width": math.nan, "n_paired": 0, "diff": math.nan, "statistic": math.nan,
                "p_value": math.nan, "test": stats.PAIRED_TEST}
        if narrower:
            by_seed = per_seed[same].set_index(stats.SEED)
            a = by_seed.loc[by_seed[WIDTH] == narrower[-1], "accuracy"]
            b = by_seed.loc[by_seed[WIDTH] == point[WIDTH], "accuracy"]
            test = {"vs_width": narrower[-1], **stats.paired_test(a, b)}
        significant = np.isfinite(test["p_value"]) and test["p_value"] < ALPHA
        rows.append({**point.to_dict(), **test, "loses_with_width": bool(significant and test["diff"] < 0),
                     "gains_with_width": bool(significant and test["diff"] > 0)})
    out = pd.DataFrame(rows)
    seeds = [c for c in out.columns if str(c).startswith("seed_")]
    return out[[c for c in out.columns if c not in seeds] + seeds] if len(out) else out


@figure("mqar")
def mqar_figure(data) -> Figure:
    """One panel per (seq_len, pairs): accuracy against d_model per mixer; then every lr."""
    points = mqar_points(data)
    picked, per_lr = select_on_validation(points, POINT, count=_count(points))
    order = label_order(picked)
    colors, markers = label_styles(picked)
    panels = sorted(picked.groupby(["seq_len", "pairs"]).groups)
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols) + 1  # the learning rates take the last row, whole
    fig, axes = new_figure(nrows, ncols, panel=(3.4, 2.9), legend=1.4)
    summaries = []
    for ax, (seq_len, pairs) in zip(axes, panels):
        part = picked[(picked["seq_len"] == seq_len) & (picked["pairs"] == pairs)]
        summary = with_stops(stats.summarize(part, ["label", WIDTH], "accuracy", count=_count(part)), part,
                             ["label", WIDTH])
        summaries.append(summary)
        draw_estimates(ax, summary, WIDTH, colors, markers, log_x=True)
        log2_axis(ax, picked[WIDTH])
        ax.set(ylim=(-0.02, 1.02), title=f"seq_len {seq_len:g}, {pairs:g} pairs",
               xlabel="model width d_model (units)", ylabel="recall accuracy (fraction)")
    grid = axes[0].get_subplotspec().get_gridspec()
    for ax in axes[len(panels):]:
        ax.remove()
    heat = fig.add_subplot(grid[-1, :])
    lr_heatmap(heat, per_lr, [WIDTH, "seq_len"], order, title="every learning rate")
    legend_outside(fig, None, mixer_handles(colors, markers), list(colors))
    trend = width_trend(picked)
    how = ("learning rate chosen per point on validation" if points[LR].nunique() > 1  # mqar_points sets LR
           else "one learning rate, set: none was chosen")
    caption(fig, f"MQAR: accuracy against width ({how})", *summaries,
            extra="a trend with width is called by a paired t-test across seeds (mqar_width_trend.csv)", legend=1.4)
    points_table = pd.concat([t.assign(seq_len=sl, pairs=pr) for t, (sl, pr) in zip(summaries, panels)],
                             ignore_index=True)
    fig.tables = {"mqar_per_lr": per_lr, "mqar_width_trend": trend,
                  "mqar_ranking": ranking_stops(stats.ranking(points_table, within=["seq_len", "pairs", WIDTH]),
                                                points_table, ["seq_len", "pairs", WIDTH])}
    return fig
