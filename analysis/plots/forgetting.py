"""Forgetting: recall of keys written twice (the latest value wanted) against keys written once
(figure 11).

Left: accuracy on overwritten and on untouched keys per mixer. One additive state keeps both of
an overwritten key's values at full weight and cannot tell the latest from the stale one by
itself (a deeper model can learn to write the second one louder); decay and gating fade the
older write by construction (and, with it, the untouched keys' only write). Right:
accuracy against the age of the key's last write at the query (tokens, power-of-two bins).
Each seed a dot, the mean a bar or line, an interval only from five seeds (analysis.stats).

Re-assignment (`reassignment`, +experiment=reassignment): the delta rule where Schlag et al.
(2021) measured its gain, keys written again with a new value, as a 2x2: each delta-rule mixer
and its additive control (model.rule=additive) on overwritten and untouched keys of the same
runs. reassignment.csv, one row per mixer and quantity: each cell's accuracy, the rule's gain
(delta - additive, paired by seed) on each kind of key, their interaction (the gain on
overwritten keys minus the gain on untouched ones: replacing a stale value, apart from
cancelling crosstalk in general), and the share of each rule's wrong answers on overwritten
keys that are the key's earlier value (the task records it: harness.tasks.forgetting), each
with its interval; the rates each rule ran at and how they were set; the runs that ended at
max_steps. reassignment_points.csv: each cell's seeds.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from analysis import stats
from analysis.lr_edge import in_rate_folder
from analysis.plots import FigureSpec
from analysis.plots.common import (LR, MissingData, caption, draw_bars, draw_estimates, figure, label_order,
                                   label_styles, labelled, log2_axis, mixer_handles, new_figure, note, require,
                                   select_on_validation, table, with_stop_flags, with_stops, yerr)

# What this module's figures need (analysis.plots.figures finds it; nothing else lists them).
FIGURES = (
    FigureSpec("forgetting", "forgetting", "forgetting_figure", notebook="nb_forgetting",
               tables=("forgetting", "forgetting_by_age", "forgetting_gap"),
               synthetic="analysis.synthetic.forgetting.forgetting_runs"),
    # the delta rule against its additive control where Schlag et al. measured it (re-assignment)
    FigureSpec("reassignment", "reassignment", "reassignment_figure", notebook="nb_reassignment",
               tables=("reassignment", "reassignment_points"),
               synthetic="analysis.synthetic.forgetting.reassignment_runs"),
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
    """Per mixer and kind of key (untouched, overwritten): n, mean, interval, seeds and the runs
    that ended at max_steps."""
    return with_stops(stats.summarize(kinds, ["label", "key"], "accuracy", count=_count(kinds)), kinds,
                      ["label", "key"])


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
        by_age = with_stops(stats.summarize(ages, ["label", "value"], "accuracy", count=_count(ages)), ages,
                            ["label", "value"])
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
OVERWRITTEN, UNTOUCHED = KIND[1], KIND[0]


def reassignment_runs(data: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """(the slices by overwritten of the runs each mixer is reported at, those runs, how their
    rates were set): a mixer swept at several rates takes the one with the best mean validation
    accuracy (select_on_validation); runs in a per-rate folder ran at the rate the pilot chose."""
    kinds, _ = forgetting_points(data)
    kinds = with_stop_flags(kinds.assign(rule=kinds[RULE].fillna("delta") if RULE in kinds.columns else "delta"))
    runs = kinds.drop_duplicates("run_dir") if "run_dir" in kinds.columns else kinds
    if "summary.accuracy" in runs.columns and runs.groupby("label")[LR].nunique().max() > 1:
        chosen, _ = select_on_validation(runs, ["label"], test="summary.accuracy", val="summary.val_accuracy")
        kinds, runs = kinds[kinds["run_dir"].isin(set(chosen["run_dir"]))], chosen
        how = "chosen per mixer on the validation split"
    elif "run_dir" in runs.columns and runs["run_dir"].map(in_rate_folder).any():
        how = "chosen per mixer by the rate pilot (reassignment_rates)"
    elif LR in runs.columns and runs[LR].nunique() > 1:
        how = "set per mixer before the sweep, not chosen"
    else:
        how = "set, not chosen: one rate for every mixer"
    return kinds.reset_index(drop=True), runs.reset_index(drop=True), how


def _per_seed(kinds: pd.DataFrame, rule: str, key: str) -> pd.Series:
    """A rule's accuracy on one kind of key, per seed."""
    rows = kinds[(kinds["rule"] == rule) & (kinds["key"] == key)]
    return stats.per_seed(rows, ["rule"], "accuracy", count=_count(rows)).set_index(stats.SEED)["accuracy"]


def stale_share(kinds: pd.DataFrame, rule: str) -> pd.Series:
    """Per seed: of a rule's wrong answers on overwritten keys, the share that are the key's
    earlier value (each slice row's ``stale``: the queries answered with it); NaN for a seed
    with no wrong answer, or results that do not record it."""
    rows = kinds[(kinds["rule"] == rule) & (kinds["key"] == OVERWRITTEN)]
    if "stale" not in rows.columns or rows["stale"].isna().all():
        return pd.Series(dtype=float)
    errors = (rows["count"] * (1 - rows["accuracy"])).round()
    per = rows.assign(errors=errors).groupby(stats.SEED)[["stale", "errors"]].sum()
    return (per["stale"] / per["errors"].where(per["errors"] > 0)).rename("stale_share")


def _quantity(name: str, per_seed: pd.Series, **extra) -> dict:
    """One row of the 2x2 table: a quantity over seeds, its mean, interval (stats.estimate) and seeds."""
    per_seed = per_seed.dropna()
    est = stats.estimate(per_seed.to_numpy())
    return {"quantity": name, "n": est.n, "mean": est.mean, "low": est.low, "high": est.high,
            "interval_method": est.method, **extra, **{stats.seed_column(k): v for k, v in per_seed.items()}}


def two_by_two(kinds: pd.DataFrame, runs: pd.DataFrame, how: str) -> pd.DataFrame:
    """Per delta-rule mixer (model) against its additive control: each cell's accuracy (rule x kind
    of key), the rule's gain on overwritten and on untouched keys, the interaction (gain on
    overwritten - gain on untouched: what replacing a stale value adds beyond cancelling
    crosstalk in general), each paired by seed with its interval, and the share of each rule's
    errors on overwritten keys that are the stale value. Each row carries the two rules' rates,
    how they were set, and the runs behind it that ended at max_steps."""
    rows = []
    for model, grp in kinds.groupby("model"):
        if not {"delta", "additive"} <= set(grp["rule"]):
            continue
        cell = {(rule, key): _per_seed(grp, rule, key) for rule in ("delta", "additive")
                for key in (OVERWRITTEN, UNTOUCHED)}
        gain = {key: cell[("delta", key)] - cell[("additive", key)] for key in (OVERWRITTEN, UNTOUCHED)}
        own = runs[runs["model"] == model]
        rates = own.groupby(own[RULE].fillna("delta") if RULE in own.columns else "delta")[LR].agg(
            lambda v: ",".join(f"{x:g}" for x in sorted(set(v))))
        bound = own["lower_bound"].astype(bool) if "lower_bound" in own.columns else pd.Series(False, index=own.index)
        extra = {"model": model, "lr_delta": rates.get("delta"), "lr_additive": rates.get("additive"),
                 "rates": how, "runs_at_max_steps": int(bound.sum()), "lower_bound": bool(bound.any())}
        quantities = [(f"{rule}, {key}", cell[(rule, key)]) for (rule, key) in cell]
        quantities += [(f"gain (delta - additive), {key}", gain[key]) for key in (OVERWRITTEN, UNTOUCHED)]
        quantities += [("interaction (gain on overwritten - gain on untouched)",
                        (gain[OVERWRITTEN] - gain[UNTOUCHED]))]
        quantities += [(f"stale share of the {rule} rule's errors on overwritten keys", stale_share(grp, rule))
                       for rule in ("additive", "delta")]
        rows += [_quantity(name, values, **extra) for name, values in quantities]
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    seeds = sorted((c for c in table.columns if c.startswith("seed_")), key=stats.seed_order)
    return table[[c for c in table.columns if not c.startswith("seed_")] + seeds]


@figure("reassignment")
def reassignment_figure(data) -> Figure:
    """Re-assignment as a 2x2 (the delta rule and its additive control, overwritten and untouched
    keys in the same runs): accuracy per cell, the rule's gains and their interaction, and the
    share of the wrong answers on overwritten keys that are the stale value."""
    kinds, runs, how = reassignment_runs(data)
    fig, axes = new_figure(1, 3, panel=(4.6, 3.4), legend=1.8)
    left, mid, right = axes
    order, styles = label_order(kinds), label_styles(kinds)
    per_kind = forgetting_table(kinds)
    for offset, kind in ((-0.2, UNTOUCHED), (0.2, OVERWRITTEN)):
        draw_bars(left, per_kind[per_kind["key"] == kind], order, styles[0], offset=offset, width=0.4,
                  color_of=lambda _lab, kind=kind: SHADE[kind], label=kind)
    # a mixer's name above its rule: side by side they run into the next mixer's at any slant
    left.set_xticks(range(len(order)), [lab.replace(" ", "\n") for lab in order], rotation=0, fontsize="x-small")
    left.axhline(0.5, color="0.5", lw=0.8, ls=":")  # guessing between a key's two values
    left.set(ylim=(0, 1.05), xlabel="mixer", ylabel="recall accuracy (fraction of queries)",
             title="each cell of the 2x2")
    table = two_by_two(kinds, runs, how)
    if table.empty:
        note(mid, f"no delta-rule mixer with its additive control ({RULE})")
        note(right, "no 2x2")
    else:
        contrasts = ["gain (delta - additive), " + UNTOUCHED, "gain (delta - additive), " + OVERWRITTEN,
                     "interaction (gain on overwritten - gain on untouched)"]
        _draw_quantities(mid, table, contrasts, ["gain, untouched", "gain, overwritten", "interaction"])
        mid.axhline(0.0, color="0.5", lw=0.8, ls=":")
        mid.set(xlabel="mixer", ylabel="difference in accuracy (paired by seed)",
                title="the rule's gains and their interaction")
        shares = [f"stale share of the {rule} rule's errors on overwritten keys" for rule in ("additive", "delta")]
        _draw_quantities(right, table, shares, ["additive control", "delta rule"])
        right.set(ylim=(0, 1.05), xlabel="mixer", ylabel="stale value's share of the errors (fraction)",
                  title="wrong answers that are the old value")
    fig.legend(*_kind_handles(per_kind), loc="outside right upper", fontsize="small", frameon=False)
    caption(fig, "Re-assignment as a 2x2: the delta rule and its additive control on overwritten and "
                 "untouched keys", per_kind, table, legend=1.8,
            extra=f"rates {how} (reassignment.csv: lr_delta, lr_additive); dotted at 0.5: guessing between a "
                  "key's two values; middle and right: each seed a dot, the mean and interval per mixer")
    fig.tables = {"reassignment": table, "reassignment_points": per_kind}
    return fig


def _draw_quantities(ax, table: pd.DataFrame, quantities: list[str], names: list[str]) -> None:
    """Per mixer, the given quantities of the 2x2 table side by side: each seed a dot, the mean a
    marker, the interval where there is one."""
    models = list(dict.fromkeys(table["model"]))
    width = 0.8 / len(quantities)
    for j, (quantity, name) in enumerate(zip(quantities, names)):
        for i, model in enumerate(models):
            row = table[(table["model"] == model) & (table["quantity"] == quantity)]
            if row.empty or not np.isfinite(row["mean"].iloc[0]):
                continue
            row = row.iloc[0]
            x = i - 0.4 + width * (j + 0.5)
            color = f"C{j}"
            seeds = stats.seed_values(row)
            ax.scatter(x + np.linspace(-width / 4, width / 4, len(seeds)), seeds, s=9, color=color, alpha=0.5,
                       linewidths=0)
            ax.scatter([x], [row["mean"]], color=color, zorder=3, label=name if i == 0 else None)
            if math.isfinite(row["low"]):
                ax.errorbar([x], [row["mean"]], yerr=yerr(row["mean"], row["low"], row["high"]),
                            fmt="none", ecolor="0.1", capsize=3)
    ax.set_xticks(range(len(models)), models)
    ax.legend(fontsize="x-small", loc="best")
