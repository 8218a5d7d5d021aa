"""Induction: accuracy at the induction positions per mixer, and by key-query distance.

A mixer whose state forgets (decay, bounded capacity) loses the earlier A -> B pair as
the distance between the two occurrences of A grows.
"""
from __future__ import annotations

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from analysis.plots.common import (MissingData, figure, legend_outside, log2_axis, mixer_handles,
                                   mixer_order, new_figure, note, palette, table)


def _induction(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows["task"] == "induction"] if "task" in rows.columns else rows


def induction_rows(data: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per run with summary.accuracy, slices by distance); either may be empty."""
    runs = _induction(table(data, "runs"))
    if not {"model", "summary.accuracy"} <= set(runs.columns):
        runs = pd.DataFrame()
    else:
        runs = runs.dropna(subset=["summary.accuracy"])
    slices = _induction(table(data, "slices", primary=True))
    if {"model", "slice", "value", "accuracy"} <= set(slices.columns):
        slices = slices[slices["slice"] == "distance"].dropna(subset=["value", "accuracy"])
    else:
        slices = pd.DataFrame()
    if runs.empty and slices.empty:
        raise MissingData("no induction accuracy (summary.accuracy or slices by distance)")
    return runs, slices


@figure("induction")
def induction_figure(data) -> Figure:
    """Left: accuracy per mixer (bar: mean over runs). Right: accuracy against distance."""
    runs, slices = induction_rows(data)
    models = pd.concat([frame["model"] for frame in (runs, slices) if not frame.empty])
    order = mixer_order(models)
    colors = palette(order)
    fig, (left, right) = new_figure(1, 2, panel=(3.6, 3.2), legend=1.0)

    if runs.empty:
        note(left, "no run summaries (summary.accuracy)")
    else:
        sns.barplot(runs, x="model", y="summary.accuracy", hue="model", order=order,
                    hue_order=order, palette=colors, errorbar="se", legend=False, ax=left)
        left.tick_params(axis="x", labelrotation=30)
    left.set(ylim=(0, 1.05), xlabel="mixer", ylabel="induction accuracy (fraction)",
             title="Induction accuracy per mixer")

    if slices.empty:
        note(right, "no slices by distance")
    else:
        sns.lineplot(slices, x="value", y="accuracy", hue="model", hue_order=order, palette=colors,
                     marker="o", errorbar="se", ax=right)
        log2_axis(right, slices["value"])
    right.set(ylim=(0, 1.05), xlabel="distance between the two A tokens (tokens)",
              ylabel="induction accuracy (fraction)", title="by distance")
    legend_outside(fig, None, mixer_handles(colors), list(colors))
    return fig
