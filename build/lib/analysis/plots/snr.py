"""SNR: measured against predicted, log-log, with the slope fitted per mixer and source.

The law SNR = sqrt(d/N) holds when the points lie on the diagonal: slope 1, no offset.
Points come from the untrained probe (random keys, the law's own setting) and, where the
sweep has them, from trained runs (their retrieval head, else the run summary).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from analysis.plots.common import (MissingData, figure, legend_outside, loglog_slope, mixer_order,
                                   new_figure, palette, retrieval_heads, table)

SOURCES = {"untrained probe": "o", "trained, per head": "^", "trained, run summary": "s"}
_COLUMNS = ["model", "source", "snr_predicted", "snr_measured"]


def snr_points(data: pd.DataFrame) -> pd.DataFrame:
    """(model, source, snr_predicted, snr_measured) rows with both SNRs positive and finite."""
    parts = []
    probe = table(data, "probe", primary=True)
    if {"model", "snr_measured", "snr_predicted"} <= set(probe.columns):
        parts.append(probe.assign(source="untrained probe"))
    heads = retrieval_heads(table(data, "heads"))
    if {"model", "snr_measured", "snr_predicted"} <= set(heads.columns):
        parts.append(heads.assign(source="trained, per head"))
    runs = table(data, "runs")
    if {"summary.snr_measured", "summary.snr_predicted"} <= set(runs.columns):
        # A run already shown head by head is not counted again through its summary.
        shown = set(heads["run_dir"]) if "run_dir" in heads.columns else set()
        runs = runs[~runs["run_dir"].isin(shown)]
        parts.append(runs.rename(columns={"summary.snr_measured": "snr_measured",
                                          "summary.snr_predicted": "snr_predicted"})
                     .assign(source="trained, run summary"))
    pts = pd.concat([p[_COLUMNS] for p in parts], ignore_index=True) if parts else pd.DataFrame()
    if pts.empty:
        raise MissingData("no measured and predicted SNR (probe table, heads or summary)")
    for col in ("snr_predicted", "snr_measured"):
        pts[col] = pd.to_numeric(pts[col], errors="coerce")
    keep = np.isfinite(pts["snr_predicted"]) & np.isfinite(pts["snr_measured"]) \
        & (pts["snr_predicted"] > 0) & (pts["snr_measured"] > 0)
    if not keep.any():
        raise MissingData("no positive, finite SNR values to draw on log axes")
    return pts[keep].reset_index(drop=True)


def fit_slopes(points: pd.DataFrame) -> pd.DataFrame:
    """Fitted log-log slope and offset of measured on predicted SNR per (source, model)."""
    rows = []
    for (source, model), grp in points.groupby(["source", "model"], sort=False):
        slope = loglog_slope(grp["snr_predicted"], grp["snr_measured"])
        offset = float(np.mean(np.log(grp["snr_measured"]) - slope * np.log(grp["snr_predicted"]))) \
            if np.isfinite(slope) else float("nan")
        rows.append({"source": source, "model": model, "slope": slope,
                     "prefactor": float(np.exp(offset)), "points": len(grp)})
    return pd.DataFrame(rows)


@figure("snr")
def snr_figure(data) -> Figure:
    """Measured against predicted SNR per mixer, the diagonal and each fitted line."""
    pts = snr_points(data)
    order = mixer_order(pts["model"])
    colors = palette(order)
    fig, (ax,) = new_figure(panel=(4.4, 4.0), legend=2.8)
    sns.scatterplot(pts, x="snr_predicted", y="snr_measured", hue="model", hue_order=order,
                    palette=colors, style="source", markers=SOURCES, alpha=0.75, legend=False, ax=ax)

    lo = float(min(pts["snr_predicted"].min(), pts["snr_measured"].min()))
    hi = float(max(pts["snr_predicted"].max(), pts["snr_measured"].max()))
    ax.plot([lo, hi], [lo, hi], color="k", ls="--", lw=1.0, label="measured = predicted (slope 1)")
    for fit in fit_slopes(pts).itertuples():
        if not np.isfinite(fit.slope):
            continue
        grp = pts[(pts["source"] == fit.source) & (pts["model"] == fit.model)]
        x = np.geomspace(grp["snr_predicted"].min(), grp["snr_predicted"].max(), 20)
        ax.plot(x, fit.prefactor * x ** fit.slope, color=colors[fit.model], lw=1.2,
                ls="-" if fit.source == "untrained probe" else ":",
                label=f"{fit.model}, {fit.source}: slope {fit.slope:.2f}")
    ax.set(xscale="log", yscale="log", xlabel="predicted SNR sqrt(d/N) (ratio)",
           ylabel="measured SNR (signal / rms crosstalk)",
           title="SNR: measured against predicted")
    present = [s for s in SOURCES if s in set(pts["source"])]
    markers = [Line2D([], [], ls="", marker=SOURCES[s], color="0.3") for s in present]
    legend_outside(fig, ax, markers, present)
    return fig
