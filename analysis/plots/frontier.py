"""The recall-versus-state-size frontier (figure 10; the figure of Based and Zoology).

MQAR accuracy against the bytes of state one layer keeps to decode the next token: the
recurrent state of the linear families (d_key x d_head per head, plus the normaliser), the KV
cache at the evaluation length for softmax (and a sliding window's cache for swa). Each point
is one setting (width, and the q/k width where the sweep varies it) at the learning rate chosen
on the validation split, the mean over its seeds; a mixer's points are joined in order of
state size, so its frontier reads left to right. The mixers are whatever the sweep's YAML list
names: a new mixer needs no change here.
"""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from analysis.plots.common import (LR, figure, legend_outside, mixer_handles, mixer_order, new_figure, note,
                                   palette, require, select_on_validation, table)

WIDTH, QK, LAYERS = "config.model.d_model", "config.model.qk_dim", "config.model.n_layers"
BYTES_PER_ELEMENT = 4  # float32, as summary.state_bytes counts


def frontier_points(data: pd.DataFrame) -> pd.DataFrame:
    """One row per run: summary.accuracy, state bytes per layer, and a label of its setting."""
    runs = table(data, "runs", primary=True)
    if "task" in runs.columns:
        runs = runs[runs["task"] == "recall"]
    if "summary.state_elements_per_layer" in runs.columns:
        per_layer = runs["summary.state_elements_per_layer"] * BYTES_PER_ELEMENT
    elif {"summary.state_bytes", LAYERS} <= set(runs.columns):
        per_layer = runs["summary.state_bytes"] / runs[LAYERS]
    else:
        per_layer = pd.Series(float("nan"), index=runs.index)
    runs = runs.assign(state_bytes_per_layer=per_layer)
    runs = require(runs, ["model", "summary.accuracy", "state_bytes_per_layer"],
                   "recall accuracy with the state size per layer (summary.state_elements_per_layer)")
    runs = runs.assign(setting=[_label(run) for _, run in runs.iterrows()])
    if LR in runs.columns and runs[LR].nunique() > 1:  # the learning rate chosen per point
        runs, _ = select_on_validation(runs, ["model", "setting"], test="summary.accuracy",
                                       val="summary.val_accuracy")
    return runs


def _label(run: pd.Series) -> str:
    parts = []
    if pd.notna(run.get(WIDTH)):
        parts.append(f"d{int(run[WIDTH])}")
    if pd.notna(run.get(QK)):
        parts.append(f"qk{int(run[QK])}")
    return " ".join(parts)


def _bytes(value: float, _pos=None) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:g} {unit}"
        value /= 1024
    return f"{value:g}"


@figure("frontier")
def frontier_figure(data) -> Figure:
    """Accuracy against state bytes per layer (log x), a line per mixer, points labelled."""
    pts = frontier_points(data)
    order = mixer_order(pts["model"])
    colors = palette(order)
    fig, (ax,) = new_figure(panel=(6.0, 4.0), legend=1.6)
    grouped = pts.groupby(["model", "state_bytes_per_layer", "setting"], as_index=False)["summary.accuracy"].mean()
    for model in order:
        part = grouped[grouped["model"] == model].sort_values("state_bytes_per_layer")
        style = ":" if model in ("softmax", "swa") else "-"  # a cache, not a fixed-size state
        ax.plot(part["state_bytes_per_layer"], part["summary.accuracy"], marker="o", ls=style,
                color=colors[model], label=model)
        for _, p in part.iterrows():
            ax.annotate(p["setting"], (p["state_bytes_per_layer"], p["summary.accuracy"]), fontsize=5,
                        color=colors[model], xytext=(2, 2), textcoords="offset points")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(_bytes))
    ax.set(ylim=(-0.02, 1.05), xlabel="state per layer (bytes, float32; softmax: KV cache at the length)",
           ylabel="MQAR recall accuracy (fraction)", title="Recall against state size")
    note(ax, "dotted: a KV cache (grows with the sequence); solid: a fixed-size recurrent state", "lower right")
    legend_outside(fig, None, mixer_handles(colors), list(colors))
    return fig
