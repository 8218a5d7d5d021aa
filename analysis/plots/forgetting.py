"""Forgetting: recall of keys written twice (the latest value wanted) against keys written once
(figure 11).

Left: accuracy on overwritten and on untouched keys per mixer. One additive state keeps both of
an overwritten key's values at full weight and cannot tell the latest from the stale one by
itself (a deeper model can learn to write the second one louder); decay and gating fade the
older write by construction (and, with it, the untouched keys' only write). Right:
accuracy against the age of the key's last write at the query (tokens, power-of-two bins).
"""
from __future__ import annotations

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from analysis.plots.common import (MissingData, figure, log2_axis, mixer_handles, mixer_order, new_figure,
                                   note, palette, require, table)

KIND = {0: "untouched (written once)", 1: "overwritten (latest of two)"}


def forgetting_points(data: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(accuracy by overwritten 0/1, accuracy by age bin) per run, from the forgetting slices."""
    rows = table(data, "slices", primary=True)
    if "task" in rows.columns:
        rows = rows[rows["task"] == "forgetting"]
    rows = require(rows, ["model", "slice", "value", "accuracy"], "forgetting accuracy slices")
    kinds = rows[rows["slice"] == "overwritten"]
    if kinds.empty:
        raise MissingData("no forgetting slices by overwritten")
    kinds = kinds.assign(key=kinds["value"].astype(int).map(KIND))
    return kinds, rows[rows["slice"] == "age"]


def overwrite_gap(data: pd.DataFrame) -> pd.DataFrame:
    """Per mixer: accuracy on overwritten and untouched keys (mean over runs) and their difference."""
    kinds, _ = forgetting_points(data)
    wide = kinds.pivot_table(index="model", columns="value", values="accuracy", aggfunc="mean")
    wide = wide.rename(columns={0: "untouched", 1: "overwritten"})
    return wide.assign(gap=wide.get("overwritten") - wide.get("untouched")).reset_index()


@figure("forgetting")
def forgetting_figure(data) -> Figure:
    kinds, ages = forgetting_points(data)
    order = mixer_order(kinds["model"])
    colors = palette(order)
    fig, (left, right) = new_figure(1, 2, panel=(4.2, 3.3), legend=1.6)
    sns.barplot(kinds, x="model", y="accuracy", hue="key", order=order,
                hue_order=[KIND[0], KIND[1]], palette=["0.75", "0.35"], errorbar="se", ax=left)
    left.tick_params(axis="x", labelrotation=30)
    left.set(ylim=(0, 1.05), xlabel="mixer", ylabel="recall accuracy (fraction of queries)",
             title="Overwritten against untouched keys")
    left.legend(fontsize="x-small", loc="upper right", frameon=False)
    if ages.empty:
        note(right, "no slices by age")
    else:
        sns.lineplot(ages, x="value", y="accuracy", hue="model", hue_order=order, palette=colors,
                     marker="o", errorbar="se", ax=right)
        log2_axis(right, ages["value"])
    right.set(ylim=(0, 1.05), xlabel="age of the key's last write (tokens, power-of-two bins)",
              ylabel="recall accuracy (fraction of queries)", title="by age of the last write")
    if right.get_legend() is not None:
        right.get_legend().remove()
    fig.legend(mixer_handles(colors), list(colors), loc="outside right upper", fontsize="small", frameon=False)
    fig.suptitle("Forgetting: the latest value of a key written twice")
    return fig
