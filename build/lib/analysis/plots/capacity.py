"""Capacity: recall accuracy against N/d on the interference task, theory drawn over it.

N pairs superposed in a d-dimensional linear state give SNR = sqrt(d/N); the predicted
accuracy turns that SNR into top-1 recall, which survives well past N = d.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from analysis.plots.common import (figure, legend_outside, mixer_order, new_figure, note, palette,
                                   require, table)
from analysis.plots.reference import accuracy_curve, snr_curve


def capacity_points(data: pd.DataFrame) -> pd.DataFrame:
    """Interference-task slices by number of pairs, with ``n_over_d`` = N / summary.d_key."""
    rows = table(data, "slices", primary=True)
    if "slice" in rows.columns:
        rows = rows[rows["slice"] == "num_pairs"]
    if "task" in rows.columns:
        rows = rows[rows["task"] == "interference"]
    rows = require(rows, ["model", "value", "accuracy", "summary.d_key"],
                   "interference-task accuracy by num_pairs with summary.d_key")
    return rows.assign(n_over_d=rows["value"] / rows["summary.d_key"])


def _with_readout(pts: pd.DataFrame) -> pd.DataFrame:
    """Add what the accuracy model needs besides d and N: the number of candidate values
    (summary.candidates, else the value half of the vocabulary, as the interference task
    draws values from [V//2, V)) and the value dimension (summary.d_head)."""
    def column(name):
        return pts[name] if name in pts.columns else pd.Series(np.nan, index=pts.index)

    vocab = column("config.task.vocab_size")
    candidates = column("summary.candidates").fillna(vocab - vocab // 2)
    per_head = column("config.model.d_model") // column("config.model.n_heads")
    value_dim = column("summary.d_head").fillna(per_head)
    return pts.assign(candidates=candidates.astype(float), value_dim=value_dim.astype(float))


@figure("capacity")
def capacity_figure(data) -> Figure:
    """Recall accuracy against N/d per mixer (mean and s.e. over seeds), predicted accuracy
    dashed in each mixer's colour, and sqrt(d/N) on the right axis."""
    pts = capacity_points(data)
    order = mixer_order(pts["model"])
    colors = palette(order)
    fig, (ax,) = new_figure(panel=(5.0, 3.6), legend=2.0)
    sns.lineplot(pts, x="n_over_d", y="accuracy", hue="model", hue_order=order, palette=colors,
                 marker="o", errorbar="se", ax=ax)

    accuracy_missing = None
    for (model, d, c, d_v), grp in _with_readout(pts).groupby(
            ["model", "summary.d_key", "candidates", "value_dim"], dropna=False):
        if model == "softmax":  # no fixed-size state: the crosstalk law does not apply
            continue
        if not (np.isfinite(c) and np.isfinite(d_v)):
            accuracy_missing = ("predicted accuracy not drawn: needs config.task.vocab_size "
                                "(or summary.candidates) and summary.d_head")
            break
        n = np.geomspace(max(grp["value"].min() / 2, 2), grp["value"].max() * 2, 40)
        acc = accuracy_curve(d, n, candidates=int(c), value_dim=int(d_v))
        ax.plot(n / d, acc, ls="--", lw=1.0, color=colors[model])
    ax.axvline(1.0, color="0.5", lw=0.8, ls=":")
    ax.set_xscale("log", base=2)
    ax.set(ylim=(-0.02, 1.02), xlabel="N / d  (stored pairs per key dimension)",
           ylabel="recall accuracy (fraction of queries)",
           title="Capacity: recall against N/d (interference task)")

    # The SNR law is (nearly) a function of N/d alone: draw it once, at the median d.
    # Theory spans twice the data's range each way, so that even one N gets its context.
    d_ref = float(pts["summary.d_key"].median())
    x = np.geomspace(pts["n_over_d"].min() / 2, pts["n_over_d"].max() * 2, 60)
    x = x[x * d_ref >= 2]
    snr = snr_curve(d_ref, x * d_ref)
    twin = ax.twinx()
    twin.plot(x, snr, color="k", ls="-.", lw=1.0)
    twin.set_yscale("log")
    twin.grid(False)
    twin.set_ylabel("predicted SNR = sqrt(d/N) (ratio)")

    if accuracy_missing:
        note(ax, accuracy_missing)
    extra = {"theory: sqrt(d/N), right axis": Line2D([], [], color="k", ls="-.")}
    if accuracy_missing is None:
        extra["theory: accuracy, state of dim d"] = Line2D([], [], color="0.3", ls="--")
    legend_outside(fig, ax, extra.values(), extra.keys())
    return fig
