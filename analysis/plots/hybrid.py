"""Hybrid stacks: how much attention, and where, recall needs beside a recurrent mixer.

Left: recall against the attention layers of a stack (none, one at each position, two, all),
one line per recurrent mixer, each seed a dot. Right: recall against the model's total decoding
memory (summary.state_bytes: the recurrent state plus the attention layers' KV cache at the
evaluated length), pooled over the positions of the attention layers, so the trade is visible:
every attention layer buys recall with a cache that grows with length. Recall is read at the
largest N the runs were tested at (summary.accuracy/num_pairs=<N>, where a sweep tests past its
training N, as the quick one does to go past a pure stack's capacity), else summary.accuracy.
The stack is read off each run's model label (harness.model.label: gated_deltanet*3+softmax);
the attention slots are the mixers that keep keys, as their classes say (registry.keeps_keys).
The all-attention stack is every recurrent mixer's last point.
"""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from analysis import stats
from analysis.plots import FigureSpec
from analysis.plots.common import (MissingData, caption, draw_estimates, figure, legend_outside, new_figure, palette,
                                   plain_log_axes, require, setting_values, table)
from analysis.plots.palette import mixer_markers
from harness.layers.registry import keeps_keys
from harness.model import stack_slots

# What this module's figures need (analysis.plots.figures finds it; nothing else lists them).
FIGURES = (
    FigureSpec("hybrid", "hybrid", "hybrid_figure", notebook="nb_hybrid", tables=("hybrid", "hybrid_memory")),
)

ACCURACY, MEMORY = "summary.accuracy", "summary.state_bytes"
RECALL = "recall"  # hybrid_rows: the test recall the figure draws (hardest_setting)
ALL = "all"


def slots(label: str) -> list[str]:
    """gated_deltanet*3+softmax -> [gated_deltanet, gated_deltanet, gated_deltanet, softmax]
    (harness.model.stack_slots: its counts bounded, a malformed label one ValueError)."""
    return stack_slots(label)


def stack_columns(runs: pd.DataFrame) -> pd.DataFrame:
    """runs with `recurrent` (the stack's recurrent mixer; None for an all-attention stack),
    `n_attn`, `depth` and `pattern` (which layers are attention: "none", "1@2", "2@1,3", "all")."""
    rows = []
    for label in runs["model"]:
        names = slots(label)
        keeps = [keeps_keys(n) for n in names]
        attn = [i for i, kept in enumerate(keeps) if kept]
        other = [n for n, kept in zip(names, keeps) if not kept]
        pattern = ("none" if not attn else ALL if len(attn) == len(names)
                   else f"{len(attn)}@{','.join(map(str, attn))}")
        rows.append({"recurrent": other[0] if other else None, "n_attn": len(attn), "depth": len(names),
                     "pattern": pattern})
    return pd.concat([runs.reset_index(drop=True), pd.DataFrame(rows)], axis=1)


def hardest_setting(runs: pd.DataFrame) -> tuple[str, int | None]:
    """The column of recall at the largest tested N (summary.accuracy/num_pairs=<N>) that every
    run reports, and that N; (summary.accuracy, None) where the runs test one N only."""
    prefix = ACCURACY + "/"
    named = {c: setting_values(c[len(prefix):]) for c in runs.columns if c.startswith(prefix)}
    tested = {v["num_pairs"]: c for c, v in named.items()
              if set(v) == {"num_pairs"} and isinstance(v["num_pairs"], int) and runs[c].notna().all()}
    if len(tested) < 2:
        return ACCURACY, None
    n = max(tested)
    return tested[n], n


def hybrid_rows(data: pd.DataFrame) -> pd.DataFrame:
    """Finished training runs of stacks, one row per run, with their stack columns and `recall`
    (hardest_setting's); the all-attention stack's runs repeated under each recurrent mixer (the
    end point of every line)."""
    runs = table(data, "runs", primary=True)
    if "mode" in runs.columns:
        runs = runs[runs["mode"] == "train"]
    runs = require(runs, ["model", ACCURACY], "hybrid runs (model, summary.accuracy)")
    column, n = hardest_setting(runs)
    runs = stack_columns(runs.assign(recall=runs[column], recall_num_pairs=n))
    mixed = runs[runs["recurrent"].notna()]
    if mixed.empty:
        raise MissingData("no hybrid runs with a recurrent layer")
    pure = runs[runs["recurrent"].isna()]
    return pd.concat([mixed] + [pure.assign(recurrent=r) for r in mixed["recurrent"].unique()], ignore_index=True)


def pattern_order(patterns) -> list[str]:
    """none, then one attention layer at each position, then more, then all."""
    def key(p):
        if p == "none":
            return (0, "")
        if p == ALL:
            return (99, "")
        count, _, where = p.partition("@")
        return (int(count), where)
    return sorted(set(patterns), key=key)


def hybrid_points(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(by recurrent mixer and pattern, by recurrent mixer and number of attention layers) of
    hybrid_rows: n, mean, interval and seeds of the test recall (`recall`, analysis.stats), with each
    point's mean decoding memory (bytes) where the runs report it."""
    memory = MEMORY in rows.columns and rows[MEMORY].notna().any()
    out = []
    for by in (["recurrent", "pattern", "n_attn"], ["recurrent", "n_attn"]):
        pts = stats.summarize(rows, by, RECALL, bounds=(0.0, 1.0))
        if memory:
            pts = pts.merge(rows.groupby(by)[MEMORY].mean().rename("memory_bytes").reset_index(), on=by, how="left")
        out.append(pts)
    return out[0], out[1]


@figure("hybrid")
def hybrid_figure(data) -> Figure:
    """Recall by where the attention layers sit (left) and by decoding memory (right)."""
    rows = hybrid_rows(data)
    by_pattern, by_count = hybrid_points(rows)
    order = pattern_order(by_pattern["pattern"])
    colors = palette(by_pattern["recurrent"])
    markers = mixer_markers(colors)
    fig, (left, right) = new_figure(1, 2, panel=(4.4, 3.4), legend=1.6)
    draw_estimates(left, by_pattern.assign(x=by_pattern["pattern"].map({p: i for i, p in enumerate(order)})),
                   "x", colors, markers, key="recurrent", connect=False)  # categories: no line between them
    left.set_xticks(range(len(order)), order, fontsize="x-small")
    left.set_xlabel("attention layers (k@i: k of them, at layers i)")
    n = rows["recall_num_pairs"].dropna()
    at = f" at N = {int(n.iloc[0])}" if len(n) else ""
    left.set_ylabel(f"recall accuracy (test{at})")
    left.set_ylim(-0.02, 1.02)
    if "memory_bytes" in by_count.columns and by_count["memory_bytes"].notna().any():
        draw_estimates(right, by_count.rename(columns={"memory_bytes": "memory"}).dropna(subset=["memory"]),
                       "memory", colors, markers, key="recurrent", log_x=True)
        right.set_xscale("log")
        plain_log_axes(right, "x")
        right.set_xlabel("decoding memory: state + KV cache (bytes)")
        right.set_ylabel(f"recall accuracy (test{at}, over positions)")
        right.set_ylim(-0.02, 1.02)
    else:
        right.set_visible(False)
    legend_outside(fig, left)
    depth = int(rows["depth"].max())
    caption(fig, f"Hybrid stacks of {depth} layers: recall against the number and position of attention "
                 "layers, and against decoding memory", by_pattern, by_count,
            extra="right: each point pools the positions of its attention layers; memory is the recurrent "
                  "state plus the KV cache at the evaluated length", legend=1.6)
    fig.tables = {"hybrid": by_pattern, "hybrid_memory": by_count}
    return fig
