"""Forgetting: recall of keys written twice (the latest value wanted) against keys written once
(figure 11).

Left: accuracy on overwritten and on untouched keys per mixer. One additive state keeps both of
an overwritten key's values at full weight and cannot tell the latest from the stale one by
itself (a deeper model can learn to write the second one louder); decay and gating fade the
older write by construction (and, with it, the untouched keys' only write). Right:
accuracy against the age of the key's last write at the query (tokens, power-of-two bins).
Each seed a dot, the mean a bar or line, an interval only from five seeds (analysis.stats).
"""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from analysis import stats
from analysis.plots import FigureSpec
from analysis.plots.common import (MissingData, caption, draw_bars, draw_estimates, figure, label_order, label_styles,
                                   labelled, log2_axis, mixer_handles, new_figure, note, require, table)

# What this module's figures need (analysis.plots.figures finds it; nothing else lists them).
FIGURES = (
    FigureSpec("forgetting", "forgetting", "forgetting_figure", notebook="nb_forgetting",
               tables=("forgetting", "forgetting_by_age", "forgetting_gap")),
)

KIND = {0: "untouched (written once)", 1: "overwritten (latest of two)"}


def forgetting_points(data: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(accuracy by overwritten 0/1, accuracy by age bin) per run, labelled, from the forgetting slices."""
    rows = table(data, "slices", primary=True)
    if "task" in rows.columns:
        rows = rows[rows["task"] == "forgetting"]
    rows = labelled(require(rows, ["model", "slice", "value", "accuracy"], "forgetting accuracy slices"))
    kinds = rows[rows["slice"] == "overwritten"]
    if kinds.empty:
        raise MissingData("no forgetting slices by overwritten")
    kinds = kinds.assign(key=kinds["value"].astype(int).map(KIND))
    return kinds, rows[rows["slice"] == "age"]


def _count(rows: pd.DataFrame) -> str | None:
    return "count" if "count" in rows.columns and rows["count"].notna().all() else None


def forgetting_table(kinds: pd.DataFrame) -> pd.DataFrame:
    """Per mixer and kind of key (untouched, overwritten): n, mean, interval and seeds."""
    return stats.summarize(kinds, ["label", "key"], "accuracy", count=_count(kinds))


def overwrite_gap(data: pd.DataFrame) -> pd.DataFrame:
    """Per mixer: accuracy on overwritten and untouched keys (mean over seeds) and the gap, with
    a paired t-test of the gap across seeds (overwritten - untouched, paired by seed)."""
    return gap_table(forgetting_points(data)[0])


def gap_table(kinds: pd.DataFrame) -> pd.DataFrame:
    """overwrite_gap on the slices by overwritten (forgetting_points' first frame)."""
    per_seed = stats.per_seed(kinds, ["label", "value"], "accuracy", count=_count(kinds))
    rows = []
    for label, grp in per_seed.groupby("label"):
        by_seed = grp.set_index(stats.SEED)
        untouched, overwritten = by_seed.loc[by_seed["value"] == 0, "accuracy"], by_seed.loc[by_seed["value"] == 1, "accuracy"]
        test = stats.paired_test(untouched, overwritten)
        rows.append({"label": label, "untouched": untouched.mean(), "overwritten": overwritten.mean(),
                     "gap": test["diff"], "n_paired": test["n_paired"], "p_value": test["p_value"], "test": test["test"]})
    return pd.DataFrame(rows)


@figure("forgetting")
def forgetting_figure(data) -> Figure:
    kinds, ages = forgetting_points(data)
    order = label_order(kinds)
    colors, markers = label_styles(kinds)
    fig, (left, right) = new_figure(1, 2, panel=(4.6, 3.4), legend=1.8)
    per_kind = forgetting_table(kinds)
    shade = {KIND[0]: "0.75", KIND[1]: "0.35"}
    for offset, kind in ((-0.2, KIND[0]), (0.2, KIND[1])):
        draw_bars(left, per_kind[per_kind["key"] == kind], order, colors, offset=offset, width=0.4,
                  color_of=lambda _lab, kind=kind: shade[kind], label=kind)
    left.tick_params(axis="x", labelrotation=90)
    left.set(ylim=(0, 1.05), xlabel="mixer", ylabel="recall accuracy (fraction of queries)",
             title="Overwritten against untouched keys")
    by_age = pd.DataFrame()
    if ages.empty:
        note(right, "no slices by age")
    else:
        by_age = stats.summarize(ages, ["label", "value"], "accuracy", count=_count(ages))
        draw_estimates(right, by_age, "value", colors, markers, log_x=True)
        log2_axis(right, ages["value"])
    right.set(ylim=(0, 1.05), xlabel="age of the key's last write (tokens, power-of-two bins)",
              ylabel="recall accuracy (fraction of queries)", title="by age of the last write")
    kinds_handles = [Patch(facecolor=shade[k], alpha=0.55, edgecolor=shade[k]) for k in (KIND[0], KIND[1])]
    fig.legend(mixer_handles(colors, markers) + kinds_handles, list(colors) + [KIND[0], KIND[1]],
               loc="outside right upper", fontsize="small", frameon=False)
    caption(fig, "Forgetting: the latest value of a key written twice", per_kind, by_age, legend=1.8,
            extra="the gap (overwritten - untouched) is tested paired by seed (forgetting_gap.csv)")
    fig.tables = {"forgetting": per_kind, "forgetting_by_age": by_age.rename(columns={"value": "age"}),
                  "forgetting_gap": gap_table(kinds)}
    return fig
