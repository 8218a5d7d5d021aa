"""Sharpness: how concentrated each mixer's effective attention weights are.

Softmax can put almost all weight on one key; a bounded positive feature map smears it.
Read from the heads table (one row per layer, head and slice), else from run summaries;
the bars follow each run's retrieval head, the dots show every head.
"""
from __future__ import annotations

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from analysis.plots.common import (MissingData, figure, legend_outside, log2_axis, mixer_order,
                                   new_figure, palette, retrieval_heads, table)

# (column, axis label), the first column present wins for each panel.
ENTROPY = (("norm_entropy", "entropy H / log(prefix)  (1 = uniform)"),
           ("entropy", "attention entropy H (nats)"))
TARGET = (("target_weight", "weight on answer span (fraction)"),)
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


@figure("sharpness")
def sharpness_figure(data) -> Figure:
    """Entropy and weight on the correct key per mixer, and the weight on the correct key
    against the slice variable (N or distance) when the heads cover several values."""
    rows = sharpness_rows(data)
    metrics = [m for m in (_metric(rows, ENTROPY), _metric(rows, TARGET)) if m]
    if not metrics:
        raise MissingData("sharpness rows hold neither entropy nor target_weight")
    order = mixer_order(rows["model"])
    colors = palette(order)
    focus = retrieval_heads(rows)
    by_value = ("value" in focus.columns and focus["value"].nunique() > 1
                and _metric(focus, TARGET) is not None)
    fig, axes = new_figure(1, len(metrics) + by_value, panel=(3.2, 3.2), legend=1.0 if by_value else 0.0)

    for ax, (column, label) in zip(axes, metrics):
        sns.barplot(focus, x="model", y=column, hue="model", order=order, hue_order=order,
                    palette=colors, errorbar="sd", alpha=0.6, legend=False, ax=ax)
        sns.stripplot(rows, x="model", y=column, hue="model", order=order, hue_order=order,
                      palette=colors, size=3, jitter=0.15, legend=False, ax=ax)
        ax.set(xlabel="mixer", ylabel=label)
        ax.tick_params(axis="x", labelrotation=30)
        if column in ("norm_entropy", "target_weight"):
            ax.set_ylim(0, 1.05)
    which = "retrieval head" if len(focus) < len(rows) else "all heads"
    fig.suptitle(f"Attention sharpness per mixer\n(bars: {which}, mean and s.d.; dots: every head)")

    if by_value:
        ax = axes[-1]
        slice_name = focus["slice"].mode().iat[0] if "slice" in focus.columns else None
        part = focus[focus["slice"] == slice_name] if slice_name else focus
        sns.lineplot(part, x="value", y="target_weight", hue="model", hue_order=order,
                     palette=colors, marker="o", errorbar="se", ax=ax)
        log2_axis(ax, part["value"])
        ax.set(ylim=(0, 1.05), xlabel=SLICE_LABELS.get(slice_name, str(slice_name)),
               ylabel="weight on answer span (fraction)", title=which)
        legend_outside(fig, ax)
    return fig
