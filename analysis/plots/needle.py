"""Needle in a haystack: accuracy over needle depth x context length, one heatmap per mixer (figure 9).

Rows are the depth of the needles (percent of the context; 0 = its start, 100 = just before
the queries), columns the evaluation length; a cell is the mean over seeds (n in each panel's
title; every cell's n, seeds and interval in `needle.csv`). A state that fades loses deep
needles at long lengths first (the lower left corner stays, the upper right goes); a state
that saturates with the haystack's pairs loses every depth together as the length grows. The
last panel draws each seed: accuracy against length, pooled over depths.
"""
from __future__ import annotations

import math

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from analysis import stats
from analysis.plots import FigureSpec
from analysis.plots.common import (caption, draw_estimates, figure, label_order, label_styles, labelled, log2_axis,
                                   mixer_handles, new_figure, require, table, with_stops)

# What this module's figures need (analysis.plots.figures finds it; nothing else lists them).
FIGURES = (
    FigureSpec("needle", "needle", "needle_figure", notebook="nb_needle", tables=("needle", "needle_by_length"),
               synthetic="analysis.synthetic.needle.needle_runs"),
)


def needle_rows(data: pd.DataFrame) -> pd.DataFrame:
    """Needle accuracy slices by depth, labelled, with ``depth`` (percent)."""
    rows = table(data, "slices", primary=True)
    if "task" in rows.columns:
        rows = rows[rows["task"] == "needle"]
    if "slice" in rows.columns:
        rows = rows[rows["slice"] == "depth"]
    rows = require(rows, ["model", "value", "seq_len", "accuracy"], "needle accuracy by depth and length")
    return labelled(rows.rename(columns={"value": "depth"}))


def _count(rows: pd.DataFrame) -> str | None:
    return "count" if "count" in rows.columns and rows["count"].notna().all() else None


def needle_points(data: pd.DataFrame) -> pd.DataFrame:
    """Per mixer (label), depth and length: n, mean, interval and seeds (analysis.stats)."""
    rows = needle_rows(data)
    return stats.summarize(rows, ["label", "depth", "seq_len"], "accuracy", count=_count(rows))


@figure("needle")
def needle_figure(data) -> Figure:
    """One heatmap per mixer: depth (rows, 0 at the top) x length (columns), colour = mean
    accuracy; then each seed's accuracy against length, pooled over depths."""
    rows = needle_rows(data)
    pts = with_stops(stats.summarize(rows, ["label", "depth", "seq_len"], "accuracy", count=_count(rows)), rows,
                     ["label", "depth", "seq_len"])
    order = label_order(rows)
    colors, markers = label_styles(rows)
    ncols = min(4, len(order) + 1)
    nrows = math.ceil((len(order) + 1) / ncols)
    fig, axes = new_figure(nrows, ncols, panel=(3.0, 2.6), legend=1.6)  # the colour bar is the heatmaps' legend
    for ax, label in zip(axes, order):
        part = pts[pts["label"] == label]
        grid = part.pivot_table(index="depth", columns="seq_len", values="mean")
        sns.heatmap(grid, vmin=0, vmax=1, cmap="viridis", annot=grid.shape[1] <= 6, fmt=".2f",
                    annot_kws={"fontsize": 6}, cbar=False, ax=ax)
        ns = sorted(set(part["n"].astype(int)))
        ax.set(title=f"{label} (n = {'-'.join(map(str, (ns[0], ns[-1]))) if len(ns) > 1 else ns[0]})",
               xlabel="length T (tokens)", ylabel="needle depth (% of context)")
        ax.set_xticklabels([f"{float(t.get_text()):g}" for t in ax.get_xticklabels()], rotation=0)
        ax.set_yticklabels([f"{float(t.get_text()):g}" for t in ax.get_yticklabels()], rotation=0)
    seeds_ax = axes[len(order)]
    pooled = with_stops(stats.summarize(rows, ["label", "seq_len"], "accuracy", count=_count(rows)), rows,
                        ["label", "seq_len"])
    draw_estimates(seeds_ax, pooled, "seq_len", colors, markers, log_x=True)
    log2_axis(seeds_ax, rows["seq_len"])
    seeds_ax.set(ylim=(-0.02, 1.05), xlabel="length T (tokens)", ylabel="accuracy, all depths (fraction)",
                 title="each seed, pooled over depths")
    for ax in axes[len(order) + 1:]:
        ax.set_visible(False)
    fig.colorbar(axes[0].collections[0], ax=axes[:len(order)], label="mean accuracy (fraction)", shrink=0.8)
    fig.legend(mixer_handles(colors, markers), list(colors), loc="outside right upper", fontsize="small", frameon=False)
    caption(fig, "Needle in a haystack: accuracy by depth and length", pts, pooled, legend=1.6)
    fig.tables = {"needle": pts, "needle_by_length": pooled}
    return fig
