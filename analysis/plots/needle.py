"""Needle in a haystack: accuracy over needle depth x context length, one heatmap per mixer (figure 9).

Rows are the depth of the needles (percent of the context; 0 = its start, 100 = just before
the queries), columns the evaluation length. A state that fades loses deep needles at long
lengths first (the lower left corner stays, the upper right goes); a state that saturates
with the haystack's pairs loses every depth together as the length grows.
"""
from __future__ import annotations

import math

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from analysis.plots.common import figure, mixer_order, new_figure, require, table


def needle_points(data: pd.DataFrame) -> pd.DataFrame:
    """Needle accuracy per mixer, depth (percent) and length, mean over runs."""
    rows = table(data, "slices", primary=True)
    if "task" in rows.columns:
        rows = rows[rows["task"] == "needle"]
    if "slice" in rows.columns:
        rows = rows[rows["slice"] == "depth"]
    rows = require(rows, ["model", "value", "seq_len", "accuracy"], "needle accuracy by depth and length")
    return rows.groupby(["model", "value", "seq_len"], as_index=False)["accuracy"].mean().rename(
        columns={"value": "depth"})


@figure("needle")
def needle_figure(data) -> Figure:
    """One heatmap per mixer: depth (rows, 0 at the top) x length (columns), colour = accuracy."""
    pts = needle_points(data)
    order = mixer_order(pts["model"])
    ncols = min(4, len(order))
    nrows = math.ceil(len(order) / ncols)
    fig, axes = new_figure(nrows, ncols, panel=(3.0, 2.6), legend=0.6)  # the colour bar is the legend
    for ax, model in zip(axes, order):
        grid = pts[pts["model"] == model].pivot_table(index="depth", columns="seq_len", values="accuracy")
        sns.heatmap(grid, vmin=0, vmax=1, cmap="viridis", annot=grid.shape[1] <= 6, fmt=".2f",
                    annot_kws={"fontsize": 6}, cbar=False, ax=ax)
        ax.set(title=model, xlabel="length T (tokens)", ylabel="needle depth (% of context)")
        ax.set_xticklabels([f"{float(t.get_text()):g}" for t in ax.get_xticklabels()], rotation=0)
        ax.set_yticklabels([f"{float(t.get_text()):g}" for t in ax.get_yticklabels()], rotation=0)
    for ax in axes[len(order):]:
        ax.set_visible(False)
    fig.colorbar(axes[0].collections[0], ax=axes[:len(order)], label="accuracy (fraction)", shrink=0.8)
    fig.suptitle("Needle in a haystack: accuracy by depth and length")
    return fig
