"""Hybrid stacks: how much attention, and where, recall needs beside a recurrent mixer.

Left: recall against the attention layers of a stack (none, one at each position, two, all),
one line per recurrent mixer, each seed a dot. Right: recall against the model's total decoding
memory (summary.state_bytes: the recurrent state plus the attention layers' KV cache at the
evaluated length), so the trade is visible: every attention layer buys recall with a cache that
grows with length. The stack is read off each run's model label (harness.model.label:
gated_deltanet*3+softmax); the attention slots are those named in ATTENTION.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analysis.plots.common import MissingData, new_figure

ATTENTION = ("softmax", "swa")
ACCURACY, MEMORY = "summary.accuracy", "summary.state_bytes"


def slots(label: str) -> list[str]:
    """gated_deltanet*3+softmax -> [gated_deltanet, gated_deltanet, gated_deltanet, softmax]."""
    out = []
    for part in str(label).split("+"):
        name, _, count = part.partition("*")
        out += [name] * (int(count) if count else 1)
    return out


def stack_columns(runs: pd.DataFrame) -> pd.DataFrame:
    """runs with `recurrent` (the stack's recurrent mixer, or the attention mixer of an all-
    attention stack), `n_attn`, and `pattern` (which layers are attention: "none", "1@2", "2", ...)."""
    rows = []
    for label in runs["model"]:
        names = slots(label)
        attn = [i for i, n in enumerate(names) if n in ATTENTION]
        other = [n for n in names if n not in ATTENTION]
        pattern = "none" if not attn else f"1@{attn[0]}" if len(attn) == 1 else str(len(attn))
        rows.append({"recurrent": other[0] if other else "attention only", "n_attn": len(attn),
                     "depth": len(names), "pattern": pattern})
    return pd.concat([runs.reset_index(drop=True), pd.DataFrame(rows)], axis=1)


def hybrid_figure(runs: pd.DataFrame) -> Figure:
    """The figure from the loader's runs frame (analysis.loader.load_results(path))."""
    if runs.empty or not {"model", ACCURACY} <= set(runs.columns):
        raise MissingData("no hybrid runs (model, summary.accuracy)")
    data = stack_columns(runs[runs["mode"].eq("train")] if "mode" in runs.columns else runs)
    order = sorted(data["pattern"].unique(), key=lambda p: (p != "none", len(p) > 1 and "@" not in p, p))
    fig, (left, right) = new_figure(1, 2, panel=(4.6, 3.4))
    x = {p: i for i, p in enumerate(order)}
    pure = data[data["n_attn"] == data["depth"]]
    for name, group in data[data["n_attn"] < data["depth"]].groupby("recurrent"):
        # an all-attention stack is the same point for every recurrent mixer: drawn with each
        group = pd.concat([group, pure])
        xs = group["pattern"].map(x).to_numpy(dtype=float)
        line = left.plot(sorted(set(xs)), group.groupby(xs)[ACCURACY].mean().to_numpy(), marker="o", label=name)[0]
        left.scatter(xs, group[ACCURACY], s=10, alpha=0.5, color=line.get_color())
        if MEMORY in group.columns:
            right.scatter(group[MEMORY], group[ACCURACY], s=14, color=line.get_color(), label=name)
    left.set_xticks(range(len(order)), order)
    left.set_xlabel("attention layers (1@i: one, at layer i)")
    left.set_ylabel("recall accuracy (test)")
    left.set_ylim(-0.02, 1.02)
    right.set_xscale("log")
    right.set_xlabel("decoding memory: state + KV cache (bytes)")
    right.set_ylim(-0.02, 1.02)
    left.legend(fontsize=7)
    if not np.isfinite(right.get_xlim()).all():
        right.set_visible(False)
    return fig
