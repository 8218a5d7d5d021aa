"""Where each mixer binds a key to its value: interchange interventions by position (Arora et al. 2025).

Each trained run of the mechanism sweep measured itself at the end of training
(trainer.intervene=true, harness.measure.intervene): the queried pair's key (or value) corrupted,
the clean hidden state restored at one (layer, component, position role) at a time, and the
share of the answer that came back; its results.json holds the rows (``intervene``) and the
mechanism the rule of harness.measure.mechanism names (``mechanism``), so this figure redraws
from results.json alone. Per mixer, with and without the short convolution, a heat map of the
mean restored share over (layer x component) rows and role columns, for key corruption and for
value corruption; each panel's title counts the seeds by the label the rule gave them.
"""
from __future__ import annotations

from collections import Counter

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from analysis import stats
from harness.measure.mechanism import NOT_LEARNED
from analysis.plots import FigureSpec
from analysis.plots.common import (SEED, WIDTH, caption, figure, label_order, labelled, mark_lower_bounds, new_figure,
                                   require, table, with_stop_flags)

# What this module's figures need (analysis.plots.figures finds it; nothing else lists them).
FIGURES = (
    FigureSpec("mechanism", "mechanism", "mechanism_figure", notebook="nb_mechanism", tables=("mechanism",),
               synthetic="analysis.synthetic.mechanism.mechanism_runs"),
)

CONV = "config.model.short_conv"
POINT = ["label", "short_conv", "corrupt", "layer", "component", "role"]
ROLES = ("key", "value", "between", "query", "other_pair")  # harness.measure.intervene.ROLES, left to right
COMPONENTS = ("block_in", "core_in", "mixer_out", "block_out")  # in the order a token passes them
SHARE_RANGE = (-0.2, 1.2)  # the colour scale: a share overshoots 1 or dips below 0 a little


def mechanism_rows(data: pd.DataFrame) -> pd.DataFrame:
    """The intervene rows of every finished run, labelled by mixer (the short convolution is a
    column of its own, ``short_conv``, not part of the label), with each run's ``mechanism`` and
    ``lower_bound`` (it ended at max_steps)."""
    rows = table(data, "intervene", primary=True)
    rows = require(rows, ["model", "corrupt", "layer", "component", "role", "restored_share"],
                   "interchange-intervention rows (trainer.intervene=true)")
    rows = labelled(rows, exclude=(WIDTH, CONV))
    conv = rows[CONV] if CONV in rows.columns else pd.Series(True, index=rows.index)
    rows = rows.assign(short_conv=conv.fillna(True).astype(bool),
                       mechanism=rows["mechanism"] if "mechanism" in rows.columns else "unlabelled")
    return with_stop_flags(rows)


def run_labels(rows: pd.DataFrame) -> pd.DataFrame:
    """Per mixer and short_conv: the label each seed's run got (``labels``: "seed: label; ..."),
    the count of seeds with each label (``label_counts``) and the most common (``majority``)."""
    runs = rows.drop_duplicates("run_dir") if "run_dir" in rows.columns else rows
    seeds = runs[SEED] if SEED in runs.columns else pd.Series(range(len(runs)), index=runs.index)
    out = []
    for (label, conv), grp in runs.assign(_seed=seeds).groupby(["label", "short_conv"]):
        grp = grp.sort_values("_seed")
        counts = Counter(grp["mechanism"].astype(str))
        out.append({"label": label, "short_conv": conv,
                    "labels": "; ".join(f"{int(s)}: {m}" for s, m in zip(grp["_seed"], grp["mechanism"])),
                    "label_counts": "; ".join(f"{m} x{c}" for m, c in counts.most_common()),
                    "majority": counts.most_common(1)[0][0]})
    return pd.DataFrame(out)


def mechanism_points(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (mixer, short_conv, corrupt, layer, component, role): the restored share's
    n, mean, interval (analysis.stats: only from five seeds) and seeds, the mean restored
    probability, each run's label and the counts per label, runs_at_max_steps and lower_bound."""
    points = stats.summarize(rows, POINT, "restored_share")
    prob = rows.groupby(POINT)["restored_prob"].mean().rename("restored_prob").reset_index()
    points = points.merge(prob, on=POINT, how="left").merge(run_labels(rows), on=["label", "short_conv"], how="left")
    points = mark_lower_bounds(points, rows, ["label", "short_conv"]).assign(layer=lambda p: p["layer"].astype(int))
    # reading order: mixer, convolution on first, a token's path through the layers, roles left to right
    rank = {label: i for i, label in enumerate(label_order(rows))}
    order = points.assign(_m=points["label"].map(rank), _c=~points["short_conv"],
                          _k=points["component"].map({c: i for i, c in enumerate(COMPONENTS)}),
                          _r=points["role"].map({r: i for i, r in enumerate(ROLES)}))
    order = order.sort_values(["_m", "_c", "corrupt", "layer", "_k", "_r"], kind="stable")
    return order.drop(columns=["_m", "_c", "_k", "_r"]).reset_index(drop=True)


def share_grid(points: pd.DataFrame) -> pd.DataFrame:
    """(layer x component) rows, role columns: the mean restored share of one panel's points."""
    grid = points.pivot_table(index=["layer", "component"], columns="role", values="mean")
    order = sorted(grid.index, key=lambda lc: (lc[0], COMPONENTS.index(lc[1]) if lc[1] in COMPONENTS else 99))
    grid = grid.reindex(index=order, columns=[r for r in ROLES if r in grid.columns])
    grid.index = [f"{int(layer)} {component}" for layer, component in grid.index]
    return grid


def _panel(ax, part: pd.DataFrame, title: str) -> None:
    """One heat map; where most seeds did not learn, its shares are ratios of the small effect a
    corruption has on a model that guesses, so its cells go unnumbered and faded, and say so."""
    grid = share_grid(part)
    guessing = part["majority"].iloc[0] == NOT_LEARNED
    sns.heatmap(grid, vmin=SHARE_RANGE[0], vmax=SHARE_RANGE[1], cmap="magma", annot=not guessing, fmt=".2f",
                annot_kws={"fontsize": 5.5}, cbar=False, ax=ax, alpha=0.3 if guessing else 1.0)
    if guessing:
        ax.text(0.5, 0.5, "not learned:\nno map", transform=ax.transAxes, ha="center", va="center",
                fontsize="small", color="0.1")
    ax.grid(False)  # the style's grid would cut through the cells
    ax.set_title(title, fontsize="small")
    ax.set(xlabel="position restored (role)", ylabel="restored at (layer, component)")
    ax.tick_params(axis="x", labelrotation=90, labelsize="x-small")
    ax.tick_params(axis="y", labelrotation=0, labelsize="x-small")


def _title(part: pd.DataFrame, label: str, conv: bool, corrupt: str) -> str:
    """Mixer, arm and corruption; n and the runs at max_steps; the seeds' labels by the rule."""
    first = part.iloc[0]
    ns = sorted(set(part["n"].astype(int)))
    n = f"{ns[0]}" if len(ns) == 1 else f"{ns[0]}-{ns[-1]}"
    bound = f", {int(first['runs_at_max_steps'])} at max_steps" if first["runs_at_max_steps"] else ""
    counts = "\n".join(first["label_counts"].split("; "))
    return f"{label}, conv {'on' if conv else 'off'}\n{corrupt} corrupted (n = {n}{bound})\n{counts}"


@figure("mechanism")
def mechanism_figure(data) -> Figure:
    """Per mixer (rows of panels), short convolution on and off, key and value corrupted
    (columns): the mean share of the answer restored at each (layer, component) and role."""
    rows = mechanism_rows(data)
    points = mechanism_points(rows)
    order = label_order(rows)
    arms = [(conv, corrupt) for conv in (True, False) if (points["short_conv"] == conv).any()
            for corrupt in ("key", "value") if (points["corrupt"] == corrupt).any()]
    fig, axes = new_figure(len(order), len(arms), panel=(3.4, 3.3), legend=1.0)
    for i, label in enumerate(order):
        for j, (conv, corrupt) in enumerate(arms):
            ax = axes[i * len(arms) + j]
            part = points[(points["label"] == label) & (points["short_conv"] == conv) & (points["corrupt"] == corrupt)]
            if part.empty:
                ax.set_visible(False)
                continue
            _panel(ax, part, _title(part, label, conv, corrupt))
    drawn = [ax for ax in axes if ax.get_visible() and ax.collections]
    fig.colorbar(drawn[0].collections[0], ax=drawn, label="share of the answer restored (mean over seeds)",
                 shrink=0.5)
    caption(fig, "Where each mixer binds a key to its value: the share of the answer restored by the clean "
                 "state at one layer, component and position (interchange interventions)", points,
            extra="each cell the mean over seeds (seeds, intervals and each run's label by the rule of "
                  "harness.measure.mechanism in mechanism.csv); core_in: what the mixer's core is fed at the "
                  "position (q, k, v after the short convolution)",
            legend=1.0)
    fig.tables = {"mechanism": points}
    return fig


def label_table(points: pd.DataFrame) -> pd.DataFrame:
    """One row per mixer and short_conv: the labels the rule gave its seeds (for a notebook)."""
    cols = ["label", "short_conv", "majority", "label_counts", "labels", "runs_at_max_steps"]
    return points.drop_duplicates(["label", "short_conv"])[cols].reset_index(drop=True)

