"""Hybrid stacks: how much attention, and where, recall needs beside a recurrent mixer.

Left: recall against the attention layers of a stack (none, one at each position, two, all),
one line per recurrent mixer, each seed a dot. Middle: recall against the attention share (the
attention layers over the depth; one layer's positions pooled), Wang et al.'s (2025) axis.
Right: recall against the model's total decoding memory (summary.state_bytes: the recurrent
state plus the attention layers' KV cache at the evaluated length), so the trade is visible:
every attention layer buys recall with a cache that grows with length.

Recall is read at the training mixture's largest N (test split, training length:
summary.accuracy/num_pairs=<N>, N the largest num_pairs of config.task.mixture, or
task.num_pairs without a mixture), so a stack that fails fails in distribution; runs made
before that (trained at one N, tested past it) are read at the largest N every run was tested
at. The stack is read off each run's model label (harness.model.label:
gated_deltanet*3+softmax); the attention slots are the mixers that keep keys, as their classes
say (registry.keeps_keys). The all-attention stack is every recurrent mixer's last point.

Tables: `hybrid` (per recurrent mixer and pattern: n, mean, interval, seeds, runs_at_max_steps,
lower_bound, the mean decoding memory, and retrieval_layer: the layer whose mixer output at the
query restores the most of a key corruption in the run's interchange map, its `intervene` rows,
the most common over seeds, where the runs have that map); `hybrid_memory` (per recurrent mixer
and number of attention layers); `hybrid_summary` (per recurrent mixer: recall with one attention
layer minus recall with none, at each position and pooled, with an interval, and Spearman's
correlation of recall with the attention share over every run, with its interval:
analysis.stats.difference and analysis.stats.spearman name their methods).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analysis import stats
from analysis.plots import FigureSpec
from analysis.plots.common import (MissingData, caption, draw_estimates, figure, legend_outside, mark_lower_bounds,
                                   new_figure, palette, plain_log_axes, require, setting_values, table,
                                   with_stop_flags)
from analysis.plots.palette import mixer_markers
from harness.layers.registry import keeps_keys
from harness.model import stack_slots

# What this module's figures need (analysis.plots.figures finds it; nothing else lists them).
FIGURES = (
    FigureSpec("hybrid", "hybrid", "hybrid_figure", notebook="nb_hybrid",
               tables=("hybrid", "hybrid_memory", "hybrid_summary"),
               synthetic="analysis.synthetic.hybrid.hybrid_runs"),
)

ACCURACY, MEMORY = "summary.accuracy", "summary.state_bytes"
MIXTURE, PAIRS = "config.task.mixture", "config.task.num_pairs"
RECALL = "recall"  # hybrid_rows: the test recall the figure draws (recall_setting)
SHARE = "attention_share"
ALL = "all"


def slots(label: str) -> list[str]:
    """gated_deltanet*3+softmax -> [gated_deltanet, gated_deltanet, gated_deltanet, softmax]
    (harness.model.stack_slots: its counts bounded, a malformed label one ValueError)."""
    return stack_slots(label)


def stack_columns(runs: pd.DataFrame) -> pd.DataFrame:
    """runs with `recurrent` (the stack's recurrent mixer; None for an all-attention stack),
    `n_attn`, `depth`, `attention_share` and `pattern` (which layers are attention: "none",
    "1@2", "2@1,3", "all")."""
    rows = []
    for label in runs["model"]:
        names = slots(label)
        keeps = [keeps_keys(n) for n in names]
        attn = [i for i, kept in enumerate(keeps) if kept]
        other = [n for n, kept in zip(names, keeps) if not kept]
        pattern = ("none" if not attn else ALL if len(attn) == len(names)
                   else f"{len(attn)}@{','.join(map(str, attn))}")
        rows.append({"recurrent": other[0] if other else None, "n_attn": len(attn), "depth": len(names),
                     SHARE: len(attn) / len(names), "pattern": pattern})
    return pd.concat([runs.reset_index(drop=True), pd.DataFrame(rows)], axis=1)


def _tested(runs: pd.DataFrame) -> dict[int, str]:
    """{N: its summary column} of the settings that vary in N alone and that every run reports."""
    prefix = ACCURACY + "/"
    named = {c: setting_values(c[len(prefix):]) for c in runs.columns if c.startswith(prefix)}
    return {v["num_pairs"]: c for c, v in named.items()
            if set(v) == {"num_pairs"} and isinstance(v["num_pairs"], int) and runs[c].notna().all()}


def trained_largest_n(runs: pd.DataFrame) -> int | None:
    """The largest N the runs trained on (config.task.mixture's, else config.task.num_pairs), when
    every run agrees on it; None otherwise."""
    def largest(row) -> float:
        mixture = row.get(MIXTURE)
        if isinstance(mixture, (list, tuple)) and mixture:
            return max(int(entry[1]) for entry in mixture)
        return row.get(PAIRS, np.nan)

    found = {largest(row) for _, row in runs.iterrows()}
    return int(found.pop()) if len(found) == 1 and all(np.isfinite(list(found) or [np.nan])) else None


def recall_setting(runs: pd.DataFrame) -> tuple[str, int | None, str]:
    """(the summary column of recall the figure reads, its N, how it was chosen): the training
    mixture's largest N where every run was tested there; else the largest N every run was
    tested at; else summary.accuracy."""
    tested = _tested(runs)
    trained = trained_largest_n(runs)
    if trained is not None and trained in tested and len(tested) > 1:
        return tested[trained], trained, "the training mixture's largest N"
    if len(tested) < 2:
        return ACCURACY, None, "the run's test recall"
    n = max(tested)
    return tested[n], n, "the largest N every run was tested at"


def hybrid_rows(data: pd.DataFrame) -> pd.DataFrame:
    """Finished training runs of stacks, one row per run, with their stack columns, `recall`
    (recall_setting's), `lower_bound` (ended at max_steps) and `retrieval_layer` (from the
    run's intervene rows, where it has them); the all-attention stack's runs repeated under each
    recurrent mixer (the end point of every line)."""
    runs = table(data, "runs", primary=True)
    if "mode" in runs.columns:
        runs = runs[runs["mode"] == "train"]
    runs = require(runs, ["model", ACCURACY], "hybrid runs (model, summary.accuracy)")
    column, n, chosen = recall_setting(runs)
    runs = stack_columns(with_stop_flags(runs.assign(recall=runs[column], recall_num_pairs=n, recall_at=chosen)))
    runs = runs.merge(retrieval_layers(data), on="run_dir", how="left") if "run_dir" in runs.columns else runs
    if "retrieval_layer" not in runs.columns:
        runs["retrieval_layer"] = np.nan
    mixed = runs[runs["recurrent"].notna()]
    if mixed.empty:
        raise MissingData("no hybrid runs with a recurrent layer")
    pure = runs[runs["recurrent"].isna()]
    return pd.concat([mixed] + [pure.assign(recurrent=r) for r in mixed["recurrent"].unique()], ignore_index=True)


def retrieval_layers(data: pd.DataFrame) -> pd.DataFrame:
    """Per run (run_dir), the layer whose mixer output at the query restores the most of a key
    corruption in its interchange map (the run's `intervene` rows: corrupt "key", component
    "mixer_out", role "query", restored_share); no rows where no run has that map."""
    rows = table(data, "intervene")
    need = {"run_dir", "corrupt", "component", "role", "layer", "restored_share"}
    if rows.empty or not need <= set(rows.columns):
        return pd.DataFrame(columns=["run_dir", "retrieval_layer"])
    mine = rows[(rows["corrupt"] == "key") & (rows["component"] == "mixer_out") & (rows["role"] == "query")]
    mine = mine.dropna(subset=["restored_share"])
    best = mine.loc[mine.groupby("run_dir")["restored_share"].idxmax(), ["run_dir", "layer"]]
    return best.rename(columns={"layer": "retrieval_layer"}).reset_index(drop=True)


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


def _retrieval_column(rows: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Per point of `by`: retrieval_layer (the most common over its runs) and retrieval_layer_runs
    (each run's, by seed), where any run has an interchange map."""
    found = rows.dropna(subset=["retrieval_layer"])
    if found.empty:
        return rows[by].drop_duplicates().assign(retrieval_layer=np.nan, retrieval_layer_runs="")
    grouped = found.groupby(by)["retrieval_layer"]
    common = grouped.agg(lambda v: int(v.astype(int).mode().min())).rename("retrieval_layer")
    listed = grouped.agg(lambda v: ",".join(str(int(x)) for x in v)).rename("retrieval_layer_runs")
    return pd.concat([common, listed], axis=1).reset_index()


def hybrid_points(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(by recurrent mixer and pattern, by recurrent mixer and number of attention layers) of
    hybrid_rows: n, mean, interval and seeds of the test recall (`recall`, analysis.stats), with
    runs_at_max_steps and lower_bound, and each point's mean decoding memory (bytes) where the
    runs report it; by pattern, also its retrieval_layer."""
    memory = MEMORY in rows.columns and rows[MEMORY].notna().any()
    out = []
    for by in (["recurrent", "pattern", "n_attn", SHARE], ["recurrent", "n_attn", SHARE]):
        pts = mark_lower_bounds(stats.summarize(rows, by, RECALL, bounds=(0.0, 1.0)), rows, by)
        if memory:
            pts = pts.merge(rows.groupby(by)[MEMORY].mean().rename("memory_bytes").reset_index(), on=by, how="left")
        out.append(pts)
    out[0] = out[0].merge(_retrieval_column(rows, ["recurrent", "pattern"]), on=["recurrent", "pattern"], how="left")
    return out[0], out[1]


def hybrid_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per recurrent mixer: recall with one attention layer (at each position, and at any, each
    seed's mean over the positions) minus recall with none (analysis.stats.difference), and
    Spearman's correlation of recall with the attention share over all its runs (analysis.stats.spearman)."""
    out = []
    for recurrent, mine in rows.groupby("recurrent", sort=False):
        none = mine.loc[mine["pattern"] == "none", RECALL]
        one = mine[mine["n_attn"] == 1]
        seed = one[stats.SEED] if stats.SEED in one.columns else pd.Series(range(len(one)), index=one.index)
        cases = [(p, one.loc[one["pattern"] == p, RECALL]) for p in pattern_order(one["pattern"])]
        cases.append(("1@any", one.groupby(seed)[RECALL].mean()))
        for pattern, values in cases:
            out.append({"recurrent": recurrent, "quantity": f"recall({pattern}) - recall(none)", **stats.difference(none, values)})
        rho = stats.spearman(mine[SHARE], mine[RECALL], mine[stats.SEED] if stats.SEED in mine.columns else mine.index)
        out.append({"recurrent": recurrent, "quantity": "spearman(recall, attention share)", "diff": rho["rho"],
                    "low": rho["low"], "high": rho["high"], "interval_method": rho["interval_method"],
                    "n_a": rho["n_seeds"], "n_b": rho["runs"]})
    table_ = pd.DataFrame(out).rename(columns={"diff": "value", "n_a": "n_none_or_seeds", "n_b": "n_with_or_runs"})
    return table_[["recurrent", "quantity", "value", "low", "high", "interval_method", "n_none_or_seeds",
                   "n_with_or_runs"]]


@figure("hybrid")
def hybrid_figure(data) -> Figure:
    """Recall by where the attention layers sit (left), by the attention share (middle) and by
    decoding memory (right)."""
    rows = hybrid_rows(data)
    by_pattern, by_count = hybrid_points(rows)
    order = pattern_order(by_pattern["pattern"])
    colors = palette(by_pattern["recurrent"])
    markers = mixer_markers(colors)
    fig, (left, middle, right) = new_figure(1, 3, panel=(4.0, 3.4), legend=1.6)
    draw_estimates(left, by_pattern.assign(x=by_pattern["pattern"].map({p: i for i, p in enumerate(order)})),
                   "x", colors, markers, key="recurrent", connect=False)  # categories: no line between them
    left.set_xticks(range(len(order)), order, fontsize="x-small")
    left.set_xlabel("attention layers (k@i: k of them, at layers i)")
    n = rows["recall_num_pairs"].dropna()
    at = f" at N = {int(n.iloc[0])}" if len(n) else ""
    for ax in (left, middle, right):
        ax.set_ylim(-0.02, 1.02)
    left.set_ylabel(f"recall accuracy (test{at})")
    draw_estimates(middle, by_count, SHARE, colors, markers, key="recurrent")
    middle.set_xlabel("attention share (attention layers / depth; positions pooled)")
    middle.set_ylabel(f"recall accuracy (test{at})")
    if "memory_bytes" in by_count.columns and by_count["memory_bytes"].notna().any():
        draw_estimates(right, by_count.rename(columns={"memory_bytes": "memory"}).dropna(subset=["memory"]),
                       "memory", colors, markers, key="recurrent", log_x=True)
        right.set_xscale("log")
        plain_log_axes(right, "x")
        right.set_xlabel("decoding memory: state + KV cache (bytes)")
        right.set_ylabel(f"recall accuracy (test{at}, over positions)")
    else:
        right.set_visible(False)
    legend_outside(fig, left)
    depth = int(rows["depth"].max())
    bounded = int(by_pattern["runs_at_max_steps"].sum())
    caption(fig, f"Hybrid stacks of {depth} layers: recall{at} ({rows['recall_at'].iloc[0]}) against the number "
                 "and position of attention layers, the attention share and decoding memory", by_pattern, by_count,
            extra=f"middle and right pool the positions of one attention layer; memory is the recurrent state plus "
                  f"the KV cache at the evaluated length; {bounded} run(s) ended at max_steps (lower bounds)",
            legend=1.6)
    fig.tables = {"hybrid": by_pattern, "hybrid_memory": by_count, "hybrid_summary": hybrid_summary(rows)}
    return fig
