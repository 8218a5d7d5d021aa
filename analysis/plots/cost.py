"""Cost: memory of the recurrent state against the KV cache, and measured time of each form.

The state figure needs no runs: it is the accounting of harness.ops (or its formulas) in
GPT-2 geometry, d = 64 per head. The time figure reads the cost table of the cost sweep.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from analysis.plots import FigureSpec
from analysis.plots.common import (figure, legend_outside, log2_axis, loglog_slope, new_figure,
                                   palette, require, table)
from analysis.plots.reference import STATE_CURVE_MIXERS, favor_features, state_sizes

# What this module's figures need (analysis.plots.figures finds it; nothing else lists them).
FIGURES = (
    FigureSpec("state_vs_kv", None, "state_figure", notebook="nb_cost"),
    FigureSpec("cost", "cost", "cost_figure", notebook="nb_cost",
               synthetic="analysis.synthetic.cost.cost_runs"),
)

PASS_LABELS = {"fwd": "forward", "fwdbwd": "forward + backward"}


@figure("state_vs_kv")
def state_figure(d_head: int = 64, *, n_max: int = 100_000) -> Figure:
    """Elements per head against sequence length: KV cache 2*N*d (and the N x N weights of
    the parallel form) grow, the linear state d*d + d (and FAVOR+'s m*d + m) does not; the
    crossover of the KV cache with the linear state is marked."""
    n = np.unique(np.round(np.geomspace(1, n_max, 200)))
    sizes = state_sizes(d_head, d_head, n)
    m = favor_features(d_head)
    favor = state_sizes(m, d_head, n)
    fig, (ax,) = new_figure(panel=(5.0, 3.6), legend=3.0)
    mixers = STATE_CURVE_MIXERS
    by_mixer = palette(mixers.values())
    colors = {curve: by_mixer[mixer] for curve, mixer in mixers.items()}
    cache, state = mixers["kv_cache"], mixers["linear_state"]
    ax.plot(n, sizes["kv_cache"], color=colors["kv_cache"], label=f"{cache}: KV cache 2·N·d")
    ax.plot(n, sizes["attention_matrix"], color=colors["kv_cache"], ls=":",
            label=f"{cache}: materialised weights N² (parallel form)")
    ax.axhline(sizes["linear_state"], color=colors["linear_state"],
               label=f"linear / {state}: state d·d + d = {sizes['linear_state']:,.0f}")
    ax.axhline(favor["linear_state"], color=colors["favor_state"], ls="--",
               label=f"FAVOR+ (m = {m}): state m·d + m = {favor['linear_state']:,.0f}")
    cross = sizes["crossover"]
    ax.axvline(cross, color="0.4", ls=":", lw=1.0)
    ax.annotate(f"crossover N ≈ {cross:.0f}", (cross, sizes["linear_state"]),
                xytext=(8, -24), textcoords="offset points", fontsize="small", color="0.25")
    ax.set(xscale="log", yscale="log", xlabel="sequence length N (tokens)",
           ylabel="memory per head (elements)",
           title=f"State against KV cache, d = {d_head} per head"
                 + (" (GPT-2 geometry)" if d_head == 64 else ""))
    legend_outside(fig, ax)
    return fig


def cost_rows(data: pd.DataFrame) -> pd.DataFrame:
    """Rows of the cost table with a positive time."""
    rows = require(table(data, "cost", primary=True), ["family", "form", "seq_len", "pass", "time_s"],
                   "cost table rows (family, form, seq_len, pass, time_s)")
    return rows[rows["time_s"] > 0]


def cost_slopes(rows: pd.DataFrame) -> pd.DataFrame:
    """Fitted exponent of time against sequence length per (pass, family, form)."""
    return (rows.groupby(["pass", "family", "form"])
            .apply(lambda g: loglog_slope(g["seq_len"], g["time_s"]), include_groups=False)
            .rename("slope").reset_index())


FORM_STYLES = {"parallel": ("o", ""), "chunk": ("s", (1, 1)), "recurrent": ("X", (4, 1.5))}


def _nest_markers(ax, colors: dict) -> None:
    """Each family's markers a size smaller than the one drawn before it: where two families'
    times coincide, the later sits inside the earlier instead of over it."""
    for line in ax.lines:
        if line.get_marker() in (None, "None", ""):
            continue
        for k, color in enumerate(colors.values()):
            if np.allclose(to_rgb(line.get_color()), color[:3]):
                line.set_markersize(7.0 - 1.5 * min(k, 3))


@figure("cost")
def cost_figure(data) -> Figure:
    """Time against sequence length per family and form, one panel per pass, log-log,
    with n and n^2 reference slopes anchored at the shortest sequence."""
    rows = cost_rows(data)
    passes = [p for p in PASS_LABELS if p in set(rows["pass"])] + \
        sorted(set(rows["pass"]) - set(PASS_LABELS))
    families = sorted(rows["family"].unique())
    colors = palette(families)
    # One form, one line style in every panel (seaborn would map styles per panel, in the
    # order the forms appear there, and the shared legend would then mislabel a panel).
    forms = [f for f in FORM_STYLES if f in set(rows["form"])] + sorted(set(rows["form"]) - set(FORM_STYLES))
    markers = {f: FORM_STYLES.get(f, ("o", ""))[0] for f in forms}
    dashes = {f: FORM_STYLES.get(f, ("o", ""))[1] for f in forms}
    fig, axes = new_figure(1, len(passes), panel=(3.6, 3.2), legend=1.4, sharey=True)
    for ax, pass_ in zip(axes, passes):
        part = rows[rows["pass"] == pass_]
        sns.lineplot(part, x="seq_len", y="time_s", hue="family", hue_order=list(colors),
                     palette=colors, style="form", style_order=forms, markers=markers, dashes=dashes,
                     errorbar=None, ax=ax)
        _nest_markers(ax, colors)
        x0 = float(part["seq_len"].min())
        y0 = float(part.loc[part["seq_len"] == x0, "time_s"].median())
        x = np.geomspace(x0, float(part["seq_len"].max()), 20)
        ax.plot(x, y0 * (x / x0), color="0.5", lw=0.9, ls=(0, (4, 2)))
        ax.plot(x, y0 * (x / x0) ** 2, color="0.5", lw=0.9, ls=(0, (1, 1.5)))
        ax.set(yscale="log", xlabel="sequence length n (tokens)",
               ylabel="time per call (s)", title=PASS_LABELS.get(pass_, pass_))
        log2_axis(ax, part["seq_len"])
    refs = [Line2D([], [], color="0.5", ls=(0, (4, 2))), Line2D([], [], color="0.5", ls=(0, (1, 1.5)))]
    legend_outside(fig, axes[0], refs, ["∝ n (reference)", "∝ n² (reference)"])
    fig.suptitle("Measured cost of each form")
    return fig
