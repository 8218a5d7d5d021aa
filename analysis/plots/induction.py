"""Induction: accuracy at the induction positions per mixer, and by key-query distance.

A mixer whose state forgets (decay, bounded capacity) loses the earlier A -> B pair as the
distance between the two occurrences of A grows. Each mixer is shown at the learning rate
chosen on the validation split (summary.val_accuracy), test accuracy with its 95% bootstrap
interval over seeds; the last panel keeps every learning rate's result.
"""
from __future__ import annotations

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from analysis.plots.common import (CI, CI_SEED, LR, MissingData, figure, legend_outside, log2_axis, lr_heatmap,
                                   mixer_handles, mixer_order, new_figure, note, palette,
                                   select_on_validation, table)


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


def induction_selected(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs at the learning rate chosen per mixer on summary.val_accuracy, per-lr table)."""
    return select_on_validation(runs, ["model"], test="summary.accuracy", val="summary.val_accuracy")


@figure("induction")
def induction_figure(data) -> Figure:
    """Accuracy per mixer (bar: mean, 95% bootstrap interval), against distance, and every lr."""
    runs, slices = induction_rows(data)
    models = pd.concat([frame["model"] for frame in (runs, slices) if not frame.empty])
    order = mixer_order(models)
    colors = palette(order)
    fig, (left, right, heat) = new_figure(1, 3, panel=(3.6, 3.2), legend=1.0)

    per_lr = pd.DataFrame()
    if runs.empty:
        note(left, "no run summaries (summary.accuracy)")
    else:
        runs, per_lr = induction_selected(runs)
        sns.barplot(runs, x="model", y="summary.accuracy", hue="model", order=order, hue_order=order,
                    palette=colors, errorbar=CI, seed=CI_SEED, legend=False, ax=left)
        left.axhline(0.9, color="0.5", lw=0.8, ls=":")
        left.tick_params(axis="x", labelrotation=30)
    left.set(ylim=(0, 1.05), xlabel="mixer", ylabel="induction accuracy (fraction)",
             title="Induction accuracy per mixer")

    if slices.empty:
        note(right, "no slices by distance")
    else:
        if not runs.empty and "run_dir" in slices.columns and "run_dir" in runs.columns:
            slices = slices[slices["run_dir"].isin(set(runs["run_dir"]))]
        sns.lineplot(slices, x="value", y="accuracy", hue="model", hue_order=order, palette=colors,
                     marker="o", errorbar=CI, seed=CI_SEED, ax=right)
        log2_axis(right, slices["value"])
    right.set(ylim=(0, 1.05), xlabel="distance between the two A tokens (tokens)",
              ylabel="induction accuracy (fraction)", title="by distance")
    if per_lr.empty or per_lr[LR].isna().all():
        heat.set_visible(False)
    else:
        lr_heatmap(heat, per_lr, [], order, title="every learning rate")
    legend_outside(fig, None, mixer_handles(colors), list(colors))
    fig.tables = {"induction_per_lr": per_lr}
    return fig
