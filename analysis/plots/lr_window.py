"""Learning-rate windows: MQAR accuracy against the learning rate, one and two layers, for a mixer
of each family (Okpekpe & Orvieto 2025, "Revisiting associative recall in modern recurrent
models": recurrent mixers learn recall only inside a narrow window of rates, attention across a
broad one; one attention layer does not solve MQAR where one well-tuned Mamba layer does).

One panel per depth: each mixer's test accuracy at every rate (each seed a dot, the mean a line,
an interval only from five seeds), and its window, the rates where its mean reaches 0.9 of its
best (analysis.windows), as a bar at that level. ``lr_window.csv``: per mixer and depth the
window's edges, its width in decades with a percentile bootstrap interval over seeds, whether it
is open at an end of the rates tried, and the runs that ended at max_steps (their accuracy is a
lower bound). ``lr_window_points.csv``: every (mixer, depth, rate) point with its seeds.
"""
from __future__ import annotations

import math

import pandas as pd
from matplotlib.figure import Figure

from analysis import stats, windows
from analysis.plots import FigureSpec
from analysis.plots.common import (MissingData, caption, draw_estimates, figure, label_styles, mark_lower_bounds,
                                   mixer_handles, new_figure, plain_log_axes, require)

# What this module's figures need (analysis.plots.figures finds it; nothing else lists them).
FIGURES = (
    FigureSpec("lr_window", "lr_window", "lr_window_figure", notebook="nb_lr_window",
               tables=("lr_window", "lr_window_points"),
               synthetic="analysis.synthetic.lr_window.lr_window_runs"),
)

ACCURACY = "summary.accuracy"
DEPTH = "n_layers"


def window_points(data) -> pd.DataFrame:
    """One row per run: label, model, depth (``n_layers``), rate, seed, test accuracy, lower_bound."""
    runs = windows.window_runs(data)
    if "task" in runs.columns:
        runs = runs[runs["task"] == "recall"]
    runs = require(runs, ["model", windows.LR, ACCURACY], "MQAR runs with a learning rate and an accuracy")
    depth = runs[windows.LAYERS] if windows.LAYERS in runs.columns else 1
    return runs.assign(**{DEPTH: depth})


def points_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per mixer, depth and rate: n, mean, interval, seeds, runs_at_max_steps and lower_bound."""
    by = ["label", DEPTH, windows.LR]
    return mark_lower_bounds(stats.summarize(runs, by, ACCURACY, bounds=(0.0, 1.0)), runs, by)


@figure("lr_window")
def lr_window_figure(data) -> Figure:
    runs = window_points(data)
    points = points_table(runs)
    table = windows.windows_table(runs, ACCURACY)
    if table.empty:
        raise MissingData("no learning-rate grid")
    colors, markers = label_styles(runs)
    depths = sorted(int(d) for d in runs[DEPTH].dropna().unique())
    fig, axes = new_figure(1, len(depths), panel=(5.2, 3.6), legend=2.2)
    for ax, depth in zip(axes, depths):
        here = points[points[DEPTH] == depth]
        draw_estimates(ax, here, windows.LR, {k: v for k, v in colors.items() if (here["label"] == k).any()},
                       markers, log_x=True)
        for _, row in here[here["lower_bound"].astype(bool)].iterrows():  # a run ended at max_steps
            ax.scatter([row[windows.LR]], [row["mean"]], s=60, facecolors="none", edgecolors=colors[row["label"]],
                       zorder=4)
        own = table[table[windows.LAYERS] == depth] if windows.LAYERS in table.columns else table
        for _, row in own.iterrows():
            if math.isfinite(row["window_low"]):
                ax.hlines(row["threshold"], row["window_low"], row["window_high"], color=colors[row["label"]],
                          lw=5, alpha=0.35, zorder=1)
        ax.set_xscale("log")
        plain_log_axes(ax, "x")
        ax.set(ylim=(-0.02, 1.05), xlabel="learning rate (Adam, flat after warm-up)",
               ylabel="MQAR test accuracy (fraction of queries)",
               title=f"{depth} layer{'s' if depth > 1 else ''}")
    fig.legend(mixer_handles(colors, markers), list(colors), loc="outside right upper", fontsize="small",
               frameon=False)
    caption(fig, "Learning-rate windows on MQAR: accuracy against the rate, per mixer and depth", points, legend=2.2,
            extra=f"bars: each mixer's window, the rates where its mean reaches {windows.WINDOW_SHARE:g} of its "
                  "best (log rate interpolated), at that level; widths in decades, from five seeds with a "
                  "percentile bootstrap interval, in lr_window.csv; ring: a run that ended at max_steps")
    fig.tables = {"lr_window": table.rename(columns={windows.LAYERS: DEPTH}),
                  "lr_window_points": points.rename(columns={windows.LR: "lr"})}
    return fig
