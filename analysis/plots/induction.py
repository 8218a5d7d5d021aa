"""Induction: accuracy at the induction positions per mixer, and by key-query distance.

A mixer whose state forgets (decay, bounded capacity) loses the earlier A -> B pair as the
distance between the two occurrences of A grows. Each mixer is shown at the learning rate
chosen on the validation split (summary.val_accuracy): each seed's test accuracy a dot, the
mean a bar, an interval only from five seeds (analysis.stats); two mixers are ranked
(`induction_ranking.csv`) only where their intervals separate. The last panel keeps every
learning rate's result.
"""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from analysis import stats
from analysis.plots import FigureSpec
from analysis.plots.common import (LR, MissingData, caption, draw_bars, draw_estimates, figure, label_order,
                                   label_styles, labelled, legend_outside, log2_axis, lr_heatmap, mixer_handles,
                                   new_figure, note, ranking_stops, select_on_validation, table, with_stops)

# What this module's figures need (analysis.plots.figures finds it; nothing else lists them).
FIGURES = (
    FigureSpec("induction", "induction", "induction_figure", notebook="nb_induction",
               tables=("induction_per_lr", "induction", "induction_by_distance", "induction_ranking"),
               synthetic="analysis.synthetic.induction.induction_runs"),
)


def _induction(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows["task"] == "induction"] if "task" in rows.columns else rows


def induction_rows(data: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per run with summary.accuracy, slices by distance), labelled; either may be empty."""
    runs = _induction(table(data, "runs"))
    if not {"model", "summary.accuracy"} <= set(runs.columns):
        runs = pd.DataFrame()
    else:
        runs = labelled(runs.dropna(subset=["summary.accuracy"]))
    slices = _induction(table(data, "slices", primary=True))
    if {"model", "slice", "value", "accuracy"} <= set(slices.columns):
        slices = labelled(slices[slices["slice"] == "distance"].dropna(subset=["value", "accuracy"]))
    else:
        slices = pd.DataFrame()
    if runs.empty and slices.empty:
        raise MissingData("no induction accuracy (summary.accuracy or slices by distance)")
    return runs, slices


def induction_selected(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs at the learning rate chosen per mixer on summary.val_accuracy, per-lr table)."""
    return select_on_validation(runs, ["label"], test="summary.accuracy", val="summary.val_accuracy")


@figure("induction")
def induction_figure(data) -> Figure:
    """Accuracy per mixer (seeds, mean, interval), against distance, and every lr."""
    runs, slices = induction_rows(data)
    both = pd.concat([frame[["model", "label"]] for frame in (runs, slices) if not frame.empty])
    order = label_order(both)
    colors, markers = label_styles(both)
    fig, (left, right, heat) = new_figure(1, 3, panel=(3.6, 3.2), legend=1.4)

    per_lr, per_mixer, by_distance = pd.DataFrame(), pd.DataFrame(), pd.DataFrame()
    if runs.empty:
        note(left, "no run summaries (summary.accuracy)")
    else:
        runs, per_lr = induction_selected(runs)
        per_mixer = with_stops(stats.summarize(runs, ["label"], "summary.accuracy"), runs, ["label"])
        draw_bars(left, per_mixer, order, colors)
        left.axhline(0.9, color="0.5", lw=0.8, ls=":")
        left.tick_params(axis="x", labelrotation=90)
    left.set(ylim=(0, 1.05), xlabel="mixer", ylabel="induction accuracy (fraction)",
             title="Induction accuracy per mixer")

    if slices.empty:
        note(right, "no slices by distance")
    else:
        if not runs.empty and "run_dir" in slices.columns and "run_dir" in runs.columns:
            slices = slices[slices["run_dir"].isin(set(runs["run_dir"]))]
        count = "count" if "count" in slices.columns and slices["count"].notna().all() else None
        by_distance = with_stops(stats.summarize(slices, ["label", "value"], "accuracy", count=count), slices,
                                 ["label", "value"])
        draw_estimates(right, by_distance, "value", colors, markers, log_x=True)
        log2_axis(right, slices["value"])
    right.set(ylim=(0, 1.05), xlabel="distance between the two A tokens (tokens)",
              ylabel="induction accuracy (fraction)", title="by distance")
    if per_lr.empty or per_lr[LR].isna().all():
        heat.set_visible(False)
    else:
        lr_heatmap(heat, per_lr, [], order, title="every learning rate")
    legend_outside(fig, None, mixer_handles(colors, markers), list(colors))
    caption(fig, "Induction heads: accuracy at the second A", per_mixer, by_distance, legend=1.4)
    fig.tables = {"induction_per_lr": per_lr, "induction": per_mixer,
                  "induction_by_distance": by_distance.rename(columns={"value": "distance"}),
                  "induction_ranking": ranking_stops(stats.ranking(per_mixer), per_mixer) if len(per_mixer) > 1
                  else pd.DataFrame()}
    return fig
