"""SNR: measured against predicted, log-log, the untrained probe (hollow) beside trained runs
(filled), with the slope fitted per mixer and source.

Left, the law with the state's nominal key dimension: sqrt(d/N) for the probe's random keys,
sqrt(d_key / N_eff) for a trained run's retrieval head. Right, the law with the kernel's own
statistics: the probe's kernel dimension (theory.kernel_effective_dim, `snr_kernel`) and the
trained model's measured d_kernel (harness.measure.trained_theory, `snr_predicted_trained`).
The law holds where the points lie on the diagonal. Trained points come from the capacity
sweep's runs at the learning rate chosen on validation (harness trained heads rows, one per
run and N), or from run summaries where a run has no heads table.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from analysis.plots.common import (MissingData, WIDTH, figure, legend_outside, loglog_slope, mixer_order,
                                   new_figure, palette, retrieval_heads, select_on_validation, table)

SOURCES = {"untrained probe": "o", "trained": "o"}
FILLED = {"untrained probe": False, "trained": True}
PANELS = {"nominal": "predicted SNR, nominal key dimension (ratio)",
          "own": "predicted SNR from the mixer's own kernel statistics (ratio)"}
_COLUMNS = ["model", "source", "panel", "snr_predicted", "snr_measured"]


def _selected_runs(data: pd.DataFrame) -> set | None:
    """run_dirs of the trained runs at the learning rate chosen on validation per (mixer,
    width), as the capacity figure chooses (each N is an evaluation of the same models); None
    when the runs carry no slices to choose on."""
    slices = table(data, "slices")
    if slices.empty or not {"run_dir", "model", "value", "accuracy"} <= set(slices.columns):
        return None
    if WIDTH not in slices.columns:
        slices = slices.assign(**{WIDTH: np.nan})
    picked, _ = select_on_validation(slices, ["model", WIDTH])
    return set(picked["run_dir"])


def snr_points(data: pd.DataFrame) -> pd.DataFrame:
    """(model, source, panel, snr_predicted, snr_measured) rows, both SNRs positive and finite."""
    parts = []
    probe = table(data, "probe", primary=True)
    if {"model", "snr_measured", "snr_predicted"} <= set(probe.columns):
        parts.append(probe.assign(source="untrained probe", panel="nominal"))
        if "snr_kernel" in probe.columns:
            parts.append(probe.drop(columns="snr_predicted").rename(columns={"snr_kernel": "snr_predicted"})
                         .assign(source="untrained probe", panel="own"))
    heads = retrieval_heads(table(data, "heads"))
    chosen = _selected_runs(data)
    if chosen is not None and "run_dir" in heads.columns:
        heads = heads[heads["run_dir"].isin(chosen)]
    if {"model", "snr_measured", "snr_predicted"} <= set(heads.columns):
        parts.append(heads.assign(source="trained", panel="nominal"))
        if "snr_predicted_trained" in heads.columns:
            parts.append(heads.drop(columns="snr_predicted")
                         .rename(columns={"snr_predicted_trained": "snr_predicted"})
                         .assign(source="trained", panel="own"))
    runs = table(data, "runs")
    if {"summary.snr_measured", "summary.snr_predicted"} <= set(runs.columns):
        # A run already shown head by head is not counted again through its summary.
        shown = set(heads["run_dir"]) if "run_dir" in heads.columns else set()
        runs = runs[~runs["run_dir"].isin(shown) & (runs.get("mode", "train") == "train")]
        renamed = runs.rename(columns={"summary.snr_measured": "snr_measured"})
        parts.append(renamed.rename(columns={"summary.snr_predicted": "snr_predicted"})
                     .assign(source="trained", panel="nominal"))
        if "summary.snr_predicted_trained" in runs.columns:
            parts.append(renamed.drop(columns="summary.snr_predicted")
                         .rename(columns={"summary.snr_predicted_trained": "snr_predicted"})
                         .assign(source="trained", panel="own"))
    pts = pd.concat([p[_COLUMNS] for p in parts if set(_COLUMNS) <= set(p.columns)],
                    ignore_index=True) if parts else pd.DataFrame()
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
    """Fitted log-log slope and offset of measured on predicted SNR per (panel, source, model)."""
    rows = []
    if "panel" not in points.columns:
        points = points.assign(panel="nominal")
    for (panel, source, model), grp in points.groupby(["panel", "source", "model"], sort=False):
        slope = loglog_slope(grp["snr_predicted"], grp["snr_measured"])
        offset = float(np.mean(np.log(grp["snr_measured"]) - slope * np.log(grp["snr_predicted"]))) \
            if np.isfinite(slope) else float("nan")
        rows.append({"panel": panel, "source": source, "model": model, "slope": slope,
                     "prefactor": float(np.exp(offset)), "points": len(grp)})
    return pd.DataFrame(rows)


@figure("snr")
def snr_figure(data) -> Figure:
    """Measured against predicted SNR per mixer: nominal law (left), own statistics (right)."""
    pts = snr_points(data)
    order = mixer_order(pts["model"])
    colors = palette(order)
    panels = [p for p in PANELS if p in set(pts["panel"])]
    fig, axes = new_figure(1, len(panels), panel=(4.0, 3.8), legend=2.6, sharey=True)
    fits = fit_slopes(pts)
    for ax, panel in zip(axes, panels):
        part = pts[pts["panel"] == panel]
        for source, filled in FILLED.items():
            grp = part[part["source"] == source]
            if grp.empty:
                continue
            for model, rows in grp.groupby("model"):
                face = colors[model] if filled else "none"
                ax.scatter(rows["snr_predicted"], rows["snr_measured"], s=22 if filled else 26,
                           facecolors=face, edgecolors=colors[model], linewidths=1.0,
                           alpha=0.85 if filled else 0.7)
        lo = float(min(part["snr_predicted"].min(), part["snr_measured"].min()))
        hi = float(max(part["snr_predicted"].max(), part["snr_measured"].max()))
        ax.plot([lo, hi], [lo, hi], color="k", ls="--", lw=1.0)
        for fit in fits[fits["panel"] == panel].itertuples():
            if not np.isfinite(fit.slope):
                continue
            grp = part[(part["source"] == fit.source) & (part["model"] == fit.model)]
            x = np.geomspace(grp["snr_predicted"].min(), grp["snr_predicted"].max(), 20)
            ax.plot(x, fit.prefactor * x ** fit.slope, color=colors[fit.model], lw=1.0,
                    ls=":" if fit.source == "untrained probe" else "-")
        ax.set(xscale="log", yscale="log", xlabel=PANELS[panel],
               ylabel="measured SNR (signal / rms crosstalk)",
               title="nominal law sqrt(d/N)" if panel == "nominal" else "law with measured d_kernel")
    handles = [Line2D([], [], ls="", marker="o", color=colors[m]) for m in order]
    labels = list(order)
    handles += [Line2D([], [], ls="", marker="o", markerfacecolor="none", markeredgecolor="0.3"),
                Line2D([], [], ls="", marker="o", color="0.3"),
                Line2D([], [], color="k", ls="--")]
    labels += ["untrained probe (hollow; fit dotted)", "trained runs (filled; fit solid)",
               "measured = predicted"]
    legend_outside(fig, None, handles, labels)
    fig.suptitle("SNR: measured against predicted")
    slopes = fits.assign(slope=fits["slope"].round(3), prefactor=fits["prefactor"].round(3))
    fig.tables = {"snr_slopes": slopes}
    return fig
