"""Recall against context length: each mixer trained short, evaluated far past it (figure 8).

Accuracy on the recall task (N fixed) at every evaluation length, the training length marked.
Theory in each mixer's colour, dashed: harness.measure.theory.predicted_length_accuracy for a
state of the run's key dimension, its decay (the measured mean log decay per step of a decay
mixer's retrieval head; none for the additive states) and, in the distractor layout, every
random filler token counted as a crosstalk write. One panel per filler layout in the sweep.
Each seed a dot (its accuracy pooled over the N tested at that length), the mean a line, an
interval only from five seeds (analysis.stats).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from analysis import stats
from analysis.plots import FigureSpec
from analysis.plots.common import (caption, draw_estimates, family_groups, figure, label_styles, labelled,
                                   legend_outside, log2_axis, mixer_handles, new_figure, note, require, table,
                                   with_stops)
from analysis.plots.reference import length_accuracy_curve

# What this module's figures need (analysis.plots.figures finds it; nothing else lists them).
FIGURES = (
    FigureSpec("length", "length", "length_figure", notebook="nb_length", tables=("length",),
               synthetic="analysis.synthetic.length.length_runs"),
)

TRAIN_LEN, FILLER = "config.task.seq_len", "config.task.filler"


def length_points(data: pd.DataFrame) -> pd.DataFrame:
    """Recall accuracy per run and evaluation length (slices by num_pairs, pooled over N)."""
    rows = table(data, "slices", primary=True)
    if "task" in rows.columns:
        rows = rows[rows["task"] == "recall"]
    if "slice" in rows.columns:
        rows = rows[rows["slice"] == "num_pairs"]
    rows = require(rows, ["model", "seq_len", "accuracy"], "recall accuracy by length (slices with seq_len)")
    if FILLER not in rows.columns:
        rows = rows.assign(**{FILLER: "zero"})
    return labelled(rows.assign(**{FILLER: rows[FILLER].fillna("zero")}))


def length_table(points: pd.DataFrame) -> pd.DataFrame:
    """Per filler layout, mixer and evaluation length: n, mean, interval and seeds (analysis.stats)."""
    count = "count" if "count" in points.columns and points["count"].notna().all() else None
    by = [FILLER, "label", "seq_len"]
    return with_stops(stats.summarize(points, by, "accuracy", count=count), points, by)


def _value(run: pd.Series, name: str, default=math.nan):
    value = run.get(name, default)
    return default if value is None or (isinstance(value, float) and math.isnan(value)) else value


def theory_lines(points: pd.DataFrame, lengths: np.ndarray) -> tuple[dict, str | None]:
    """{(filler, label): predicted accuracy at `lengths`} for every model without a KV cache
    (summary.attention_kv_cache_bytes 0) whose runs carry what the theory needs, and a note when
    some could not be drawn."""
    lines, missing = {}, None
    if "label" not in points.columns:
        points = points.assign(label=points["model"])
    first = points.drop_duplicates("run_dir") if "run_dir" in points.columns else points.drop_duplicates("label")
    for _, run in first.iterrows():
        key = (run[FILLER], run["label"])
        # A model that keeps keys (softmax, swa's window, a hybrid's attention layer) reads them by
        # softmax, not out of one fixed-size state: the crosstalk law does not describe it.
        if key in lines or float(_value(run, "summary.attention_kv_cache_bytes", 0.0)) > 0:
            continue
        d_key, vocab = _value(run, "summary.d_key"), _value(run, "config.task.vocab_size")
        d_v = _value(run, "summary.d_head")
        n = _value(run, "config.task.num_pairs")
        if any(isinstance(x, float) and math.isnan(x) for x in (d_key, vocab, d_v, n)):
            missing = "theory not drawn for some runs: needs summary.d_key, summary.d_head, config.task.vocab_size, num_pairs"
            continue
        rate = float(_value(run, "config.task.filler_rate", 1.0)) if run[FILLER] == "random" else 0.0
        queries = _value(run, "config.task.num_queries", None)
        lines[key] = length_accuracy_curve(
            lengths, num_pairs=int(n), d_key=float(d_key), value_dim=int(d_v), candidates=int(vocab - vocab // 2),
            log_decay=float(_value(run, "summary.log_decay", 0.0)), distractor_rate=rate,
            num_queries=queries, power_a=float(_value(run, "config.task.power_a", 0.01)))
    return lines, missing


@figure("length")
def length_figure(data) -> Figure:
    """Accuracy against evaluation length per mixer (each seed, mean, interval), the training
    length dotted, predicted accuracy dashed; a panel per filler layout."""
    pts = length_points(data)
    colors, markers = label_styles(pts)
    summary = length_table(pts)
    layouts = sorted(pts[FILLER].unique(), key=lambda f: (f != "zero", f))
    groups = family_groups(pts)  # a row of panels per family once the mixers crowd one panel
    fig, axes = new_figure(len(groups), len(layouts), panel=(4.4, 3.4 if len(groups) == 1 else 2.6),
                           legend=2.0, sharey=True)
    lengths = np.unique(pts["seq_len"].to_numpy(float))  # theory at each evaluated length (each costs integrations)
    lines, missing = theory_lines(pts, lengths)
    for k, (ax, (family, shown), layout) in enumerate(
            zip(axes, [g for g in groups for _ in layouts], layouts * len(groups))):
        part = pts[pts[FILLER] == layout]
        draw_estimates(ax, summary[summary[FILLER] == layout], "seq_len", {lab: colors[lab] for lab in shown},
                       markers, log_x=True)
        for (fill, label), curve in lines.items():
            if fill == layout and label in shown:
                ax.plot(lengths, curve, ls="--", lw=1.0, color=colors[label])
        if TRAIN_LEN in part.columns:
            for trained in sorted(part[TRAIN_LEN].dropna().unique()):
                ax.axvline(trained, color="0.4", lw=0.9, ls=":")
                ax.text(trained, 0.0, f" trained at {trained:g}", fontsize="x-small", color="0.3",
                        va="bottom", ha="left")
        log2_axis(ax, pts["seq_len"])
        where = "distractors (filler=random)" if layout == "random" else f"filler={layout}"
        ax.set(ylim=(-0.02, 1.05), xlabel="evaluation length T (tokens)",
               ylabel="recall accuracy (fraction of queries)",
               title=f"Recall against length, {where}" + (f"\n{family} family" if family else ""))
        if missing:
            note(ax, missing)
    extra = {"theory: predicted accuracy": Line2D([], [], color="0.3", ls="--"),
             "training length": Line2D([], [], color="0.4", ls=":")}
    legend_outside(fig, None, mixer_handles(colors, markers) + list(extra.values()), list(colors) + list(extra))
    caption(fig, "Recall against context length", summary, legend=2.0)
    fig.tables = {"length": summary}
    return fig
