"""Sharpness: how concentrated each mixer's effective attention weights are.

Softmax can put almost all weight on one key; a bounded positive feature map smears it
(Hedgehog's ordering: softmax sharpest, elu+1 and FAVOR+ smeared, Taylor between).
Monotonicity is Hedgehog's: each mixer's weights ranked against softmax's score q.k / sqrt(d) of
its own q and k before any feature map (harness.measure.trained.sharpness); softmax and the
identity map keep that order by construction (they declare `monotone_in_score`), so their
monotonicity is flagged (`by_construction` in sharpness.csv, a hatched bar) and no ranking is
read from it. Read from the heads table (one row per layer, head and slice), else from run
summaries. Each run contributes one value per measurement, its retrieval head's mean over the
slices; the bars are the mean over seeds, each seed a dot, the interval only from five seeds
(analysis.stats). Runs are those of the learning rate chosen per mixer on the validation split
(summary.val_accuracy); the last panel keeps every learning rate's result. Two mixers are
ranked (`sharpness_ranking.csv`) only where their intervals separate.
"""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from analysis import stats
from analysis.plots import FigureSpec
from analysis.plots.common import (LR, MissingData, caption, draw_bars, draw_estimates, figure, label_order,
                                   label_styles, labelled, legend_outside, log2_axis, lr_heatmap, mixer_handles,
                                   new_figure, ranking_stops, retrieval_heads, select_on_validation, table,
                                   with_stops)

# What this module's figures need (analysis.plots.figures finds it; nothing else lists them).
FIGURES = (
    FigureSpec("sharpness", "sharpness", "sharpness_figure", notebook="nb_sharpness",
               tables=("sharpness_per_lr", "sharpness", "sharpness_ranking"),
               synthetic="analysis.synthetic.sharpness.sharpness_runs"),
)

# (column, axis label), the first column present wins for each panel.
ENTROPY = (("norm_entropy", "entropy H / log(prefix)  (1 = uniform)"),
           ("entropy", "attention entropy H (nats)"))
TARGET = (("target_weight", "weight on answer span (fraction)"),)
MONOTONE = (("monotonicity", "Hedgehog's monotonicity: Spearman of a_ij\non softmax's q.k/sqrt(d) (rank corr.)"),)
# the range each measure can take: an interval is cut there (analysis.stats.interval)
BOUNDS = {"norm_entropy": (0.0, 1.0), "target_weight": (0.0, 1.0), "monotonicity": (-1.0, 1.0)}
SLICE_LABELS = {"num_pairs": "N (stored pairs)", "distance": "key-query distance (tokens)"}


def sharpness_rows(data: pd.DataFrame) -> pd.DataFrame:
    """Per-head sharpness rows, or one row per run from summary.entropy / summary.target_weight."""
    heads = table(data, "heads", primary=True)
    if "model" in heads.columns and any(c in heads.columns for c, _ in ENTROPY + TARGET):
        return heads
    runs = table(data, "runs")
    summary = {f"summary.{c}": c for c, _ in ENTROPY + TARGET}
    if "model" in runs.columns and set(summary) & set(runs.columns):
        return runs.rename(columns=summary)
    raise MissingData("no sharpness measurements (heads table or summary.entropy / target_weight)")


def _metric(rows: pd.DataFrame, choices) -> tuple[str, str] | None:
    for column, label in choices:
        if column in rows.columns and rows[column].notna().any():
            return column, label
    return None


def monotone_by_construction(heads: pd.DataFrame) -> set:
    """The labels whose every measured head declares `monotone_in_score` (the mixer's own
    attribute, written beside each heads row): weights an increasing function of softmax's score
    by their map (softmax, the undivided identity map), so a monotonicity of 1 is their
    definition, not what they learned. Read from the declaration and never from the value, which
    float32 rounding of near ties takes below 1 (the identity map's seeds read 0.9998)."""
    if not {"label", "monotone_in_score"} <= set(heads.columns):
        return set()
    declared = heads["monotone_in_score"].map(lambda v: v is True or v == 1)  # NaN: not declared
    return set(declared.groupby(heads["label"]).all().loc[lambda s: s].index)


@figure("sharpness")
def sharpness_figure(data) -> Figure:
    """Entropy, weight on the correct key and monotonicity per mixer (each seed, mean, interval),
    and the weight on the correct key against the slice variable (N or distance) when the heads
    cover several values."""
    rows = labelled(sharpness_rows(data))
    runs = labelled(table(data, "runs"))
    per_lr = pd.DataFrame()
    if {"run_dir", "model", "summary.accuracy"} <= set(runs.columns) and "run_dir" in rows.columns:
        chosen, per_lr = select_on_validation(runs, ["label"], test="summary.accuracy",
                                              val="summary.val_accuracy")
        rows = rows[rows["run_dir"].isin(set(chosen["run_dir"]))]
    metrics = [m for m in (_metric(rows, ENTROPY), _metric(rows, TARGET), _metric(rows, MONOTONE)) if m]
    if not metrics:
        raise MissingData("sharpness rows hold neither entropy nor target_weight")
    order = label_order(rows)
    colors, markers = label_styles(rows)
    focus = retrieval_heads(rows)
    by_value = ("value" in focus.columns and focus["value"].nunique() > 1
                and _metric(focus, TARGET) is not None)
    with_lr = not per_lr.empty and per_lr[LR].notna().any()  # runs that name their learning rate
    fig, axes = new_figure(1, len(metrics) + by_value + with_lr, panel=(3.2, 3.2),
                           legend=1.4 if by_value else 0.0)

    summaries = []
    constructed = monotone_by_construction(focus)
    for ax, (column, label) in zip(axes, metrics):
        summary = with_stops(stats.summarize(focus, ["label"], column, bounds=BOUNDS.get(column)), focus, ["label"])
        summaries.append(summary.assign(metric=column))
        draw_bars(ax, summary, order, colors)
        if column == "monotonicity":  # a 1 by the map's definition: hatched, told apart at a glance
            for bar in ax.patches:
                if order[round(bar.get_x() + bar.get_width() / 2)] in constructed:
                    bar.set_hatch("///")
        ax.set(xlabel="mixer", ylabel=label)
        ax.tick_params(axis="x", labelrotation=90)
        if column in ("norm_entropy", "target_weight"):
            ax.set_ylim(0, 1.05)
    which = "retrieval head" if len(focus) < len(rows) else "all heads"
    per_metric = pd.concat(summaries, ignore_index=True)
    hatched = "hatched: monotone by construction (the map's, not learned), not ranked" if constructed & set(order) else ""
    caption(fig, f"Attention sharpness per mixer (bars: {which}, mean over seeds; dots: each seed)", per_metric,
            extra=hatched, legend=1.4 if by_value else 0.0)
    if with_lr:
        lr_heatmap(axes[len(metrics) + by_value], per_lr, [], order, title="every learning rate")
    per_metric = per_metric.assign(by_construction=(per_metric["metric"] == "monotonicity")
                                   & per_metric["label"].isin(constructed))
    ranked = [s[~s["label"].isin(per_metric.loc[per_metric["by_construction"] & (per_metric["metric"] == m), "label"])]
              for s in summaries for m in [s["metric"].iat[0]] if len(s)]
    ranking = pd.concat([ranking_stops(stats.ranking(s), s).assign(metric=s["metric"].iat[0])
                         for s in ranked if len(s) > 1], ignore_index=True) if any(len(s) > 1 for s in ranked) \
        else pd.DataFrame()
    metric_first = ["metric"] + [c for c in per_metric.columns if c != "metric"]
    fig.tables = {"sharpness_per_lr": per_lr, "sharpness": per_metric[metric_first], "sharpness_ranking": ranking}

    if by_value:
        ax = axes[len(metrics)]
        slice_name = focus["slice"].mode().iat[0] if "slice" in focus.columns else None
        part = focus[focus["slice"] == slice_name] if slice_name else focus
        summary = stats.summarize(part, ["label", "value"], "target_weight", bounds=BOUNDS["target_weight"])
        draw_estimates(ax, summary, "value", colors, markers, log_x=True)
        log2_axis(ax, part["value"])
        ax.set(ylim=(0, 1.05), xlabel=SLICE_LABELS.get(slice_name, str(slice_name)),
               ylabel="weight on answer span (fraction)", title=which)
        legend_outside(fig, None, mixer_handles(colors, markers), list(colors))
    return fig
