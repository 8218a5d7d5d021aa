"""Forgetting: recall of keys written twice (the latest value wanted) against keys written once
(figure 11).

Left: accuracy on overwritten and on untouched keys per mixer. One additive state keeps both of
an overwritten key's values at full weight and cannot tell the latest from the stale one by
itself (a deeper model can learn to write the second one louder); decay and gating fade the
older write by construction (and, with it, the untouched keys' only write). Right:
accuracy against the age of the key's last write at the query (tokens, power-of-two bins).
Each seed a dot, the mean a bar or line, an interval only from five seeds (analysis.stats).

Re-assignment (`reassignment`, +experiment=reassignment): the delta rule where Schlag et al.
(2021) measured its gain, keys written again with a new value beyond N = d: each delta-rule
mixer beside its additive control (model.rule=additive), on overwritten and untouched keys,
with the paired difference (delta - additive, by seed) and its interval (reassignment_rule.csv).
"""
from __future__ import annotations

import math

import numpy as np
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
    # the delta rule against its additive control where Schlag et al. measured it (re-assignment)
    FigureSpec("reassignment", "reassignment", "reassignment_figure", notebook="nb_reassignment",
               tables=("reassignment", "reassignment_rule")),
)

KIND = {0: "untouched (written once)", 1: "overwritten (latest of two)"}
SHADE = {KIND[0]: "0.75", KIND[1]: "0.35"}  # bar colour of each kind of key


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


def _kind_bars(kinds: pd.DataFrame):
    """A two-panel figure whose left panel bars each mixer's accuracy on untouched and
    overwritten keys: (fig, (left, right), mixer order, (colors, markers), the per-kind table)."""
    order = label_order(kinds)
    styles = label_styles(kinds)
    fig, axes = new_figure(1, 2, panel=(4.6, 3.4), legend=1.8)
    per_kind = forgetting_table(kinds)
    for offset, kind in ((-0.2, KIND[0]), (0.2, KIND[1])):
        draw_bars(axes[0], per_kind[per_kind["key"] == kind], order, styles[0], offset=offset, width=0.4,
                  color_of=lambda _lab, kind=kind: SHADE[kind], label=kind)
    return fig, axes, order, styles, per_kind


def _kind_handles(per_kind: pd.DataFrame) -> tuple[list, list]:
    """Legend patches of the kinds of key the bars show: a sweep where every key is written twice
    (re-assignment) has no untouched bar, and its legend names none."""
    present = [k for k in (KIND[0], KIND[1]) if k in set(per_kind["key"])]
    return [Patch(facecolor=SHADE[k], alpha=0.55, edgecolor=SHADE[k]) for k in present], present


@figure("forgetting")
def forgetting_figure(data) -> Figure:
    kinds, ages = forgetting_points(data)
    fig, (left, right), order, (colors, markers), per_kind = _kind_bars(kinds)
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
    handles, labels = _kind_handles(per_kind)
    fig.legend(mixer_handles(colors, markers) + handles, list(colors) + labels,
               loc="outside right upper", fontsize="small", frameon=False)
    caption(fig, "Forgetting: the latest value of a key written twice", per_kind, by_age, legend=1.8,
            extra="the gap (overwritten - untouched) is tested paired by seed (forgetting_gap.csv)")
    fig.tables = {"forgetting": per_kind, "forgetting_by_age": by_age.rename(columns={"value": "age"}),
                  "forgetting_gap": gap_table(kinds)}
    return fig


RULE = "config.model.rule"


def rule_table(kinds: pd.DataFrame) -> pd.DataFrame:
    """Per delta-rule mixer (model) and kind of key (untouched, overwritten, all): the delta
    rule's mean and its additive control's (model.rule), their difference paired by seed with
    its interval (stats.estimate over the seeds' differences: named in interval_method), the
    paired t-test, and whether the two rules' own intervals separate."""
    if RULE not in kinds.columns:
        return pd.DataFrame()
    kinds = kinds.assign(rule=kinds[RULE].fillna("delta"))
    every = kinds.assign(key="all keys")
    rows = []
    for (model, key), grp in pd.concat([kinds, every], ignore_index=True).groupby(["model", "key"]):
        per_seed = stats.per_seed(grp, ["rule"], "accuracy", count=_count(grp))
        by_rule = {r: g.set_index(stats.SEED)["accuracy"] for r, g in per_seed.groupby("rule")}
        if not {"delta", "additive"} <= set(by_rule):
            continue
        delta, additive = by_rule["delta"], by_rule["additive"]
        diff = (delta - additive).dropna()
        est = stats.estimate(diff.to_numpy())
        own = stats.summarize(grp, ["rule"], "accuracy", count=_count(grp)).set_index("rule")
        test = stats.paired_test(additive, delta)
        rows.append({"model": model, "key": key, "delta": delta.mean(), "additive": additive.mean(),
                     "delta_low": own.loc["delta", "low"], "delta_high": own.loc["delta", "high"],
                     "additive_low": own.loc["additive", "low"], "additive_high": own.loc["additive", "high"],
                     "n": est.n, "mean": est.mean, "low": est.low, "high": est.high,
                     "interval_method": est.method + " (of the paired difference delta - additive)",
                     "separated": stats.separated(own.loc["delta"], own.loc["additive"]),
                     "p_value": test["p_value"], "test": test["test"],
                     **{stats.seed_column(k): v for k, v in diff.items()}})
    return pd.DataFrame(rows)


@figure("reassignment")
def reassignment_figure(data) -> Figure:
    """The delta rule against its additive control on re-assigned keys beyond N = d: accuracy on
    overwritten and untouched keys per mixer (each seed, mean, interval), and the paired
    difference delta - additive per mixer."""
    kinds, _ = forgetting_points(data)
    fig, (left, right), order, (colors, markers), per_kind = _kind_bars(kinds)
    # a mixer's name above its rule: side by side they run into the next mixer's at any slant
    left.set_xticks(range(len(order)), [lab.replace(" ", "\n") for lab in order], rotation=0,
                  fontsize="small")
    left.set(ylim=(0, 1.05), xlabel="mixer", ylabel="recall accuracy (fraction of queries)",
             title="re-assigned keys beyond N = d")
    rules = rule_table(kinds)
    if rules.empty:
        note(right, f"no delta-rule mixer with its additive control ({RULE})")
    else:
        shown = rules[rules["key"] == KIND[1]].reset_index(drop=True)
        for i, row in shown.iterrows():
            right.scatter([i], [row["mean"]], color="0.2", zorder=3)
            seeds = stats.seed_values(row)
            # the seeds beside the mean, spread apart, so that neither the mean nor a like seed hides one
            right.scatter(i + np.linspace(0.1, 0.25, len(seeds)), seeds, s=9, color="0.5", linewidths=0)
            if math.isfinite(row["low"]):
                right.errorbar([i], [row["mean"]], yerr=[[row["mean"] - row["low"]], [row["high"] - row["mean"]]],
                               fmt="none", ecolor="0.1", capsize=3)
        right.axhline(0.0, color="0.5", lw=0.8, ls=":")
        right.set_xticks(range(len(shown)), shown["model"])
    right.set(xlabel="mixer", ylabel="delta - additive on overwritten keys (accuracy)",
              title="the rule's own effect (paired by seed)")
    # the bars are shaded by kind of key, not coloured by mixer (each bar names its mixer below it)
    fig.legend(*_kind_handles(per_kind), loc="outside right upper", fontsize="small", frameon=False)
    caption(fig, "Re-assignment: the delta rule against its additive control", per_kind, legend=1.8,
            extra="right: the difference of each seed's accuracies, its mean and interval "
                  "(reassignment_rule.csv names the method)")
    fig.tables = {"reassignment": per_kind, "reassignment_rule": rules}
    return fig
