"""The law's pre-registered predictions against what the runs then measured (law_predictions.csv).

The predictions were written into the findings experiment files before the runs they predict
(analysis.preregister, between stage 1 and stage 2: git shows the order), so every run of those
files carries them in its config (config.analysis.law_predictions). Per setting: the law's, the
nominal and the anchored baseline's predicted accuracy, the measured mean over seeds (n and its
interval, analysis.stats: n, mean, low, high and each seed), each source's |error| in log-odds (analysis.plots.capacity.log_odds),
and the verdict (analysis.plots.capacity.verdict: a win only by more than the margin fixed in the
same file); then per part and mixer over its discriminating settings (where the law differed
from both baselines by more than the margin before the runs) the same, the row a finding quotes.
A law that loses is reported as losing; where it is the anchored baseline by algebra the verdict
says "identity", never a win. A setting the runs measured that no prediction names (a mixer
added later) is listed with preregistered False and judged on nothing.

Left: measured against predicted accuracy at the other key widths (each source its marker).
Right: the decayed mixer's recall against length, measured and as each source predicted it.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from analysis import stats
from analysis.plots import FigureSpec
from analysis.plots.capacity import (LAW_MARGIN_LOGODDS, MARGIN, capacity_points, log_odds, protocol_rows, stated,
                                     verdict)
from analysis.plots.common import (MissingData, caption, figure, log2_axis, new_figure, note, palette, setting_values,
                                   table, yerr)

# What this module's figures need (analysis.plots.figures finds it; nothing else lists them).
FIGURES = (
    # the findings profile's: its length sweep is its own; the other key widths are capacity runs
    FigureSpec("law", "capacity_length", "law_figure", also=("capacity",), notebook="nb_law",
               tables=("law_predictions",),
               synthetic="analysis.synthetic.law.capacity_length_runs"),
)

PREDICTIONS = "config.analysis.law_predictions"
SOURCES = ("law", "nominal", "anchored")
MARKERS = {"law": "o", "nominal": "s", "anchored": "^"}


def predictions(data: pd.DataFrame) -> pd.DataFrame:
    """The prediction rows the runs carry (every run that has them carries its file's rows; two
    files, two sets), one row per setting; MissingData where no run carries any."""
    runs = table(data, "runs")
    if PREDICTIONS not in runs.columns:
        raise MissingData("no run carries pre-registered predictions (config.analysis.law_predictions: "
                          "python -m analysis.preregister --write before stage 2)")
    rows = [dict(item) for value in runs[PREDICTIONS].dropna() for item in value if item]
    if not rows:
        raise MissingData("the runs' config.analysis.law_predictions are empty (written before stage 2)")
    keys = ["part", "model", "qk_dim", "num_pairs", "seq_len"]
    return pd.DataFrame(rows).drop_duplicates(subset=keys).reset_index(drop=True)


def _measured_key_width(data: pd.DataFrame) -> pd.DataFrame:
    """Per (model, qk_dim, num_pairs): each seed's accuracy at its own training N (none where the
    results hold no capacity run: the length sweep alone)."""
    try:
        proto = protocol_rows(capacity_points(data))
    except MissingData:
        return pd.DataFrame(columns=["model", "qk_dim", "train_n", "accuracy"])
    return proto.assign(model=proto["config.model.name"] if "config.model.name" in proto.columns else proto["model"])


def _measured_length(data: pd.DataFrame) -> pd.DataFrame:
    """Per (model, num_pairs, seq_len): each run's accuracy at each tested length."""
    settings = table(data, "settings")
    if settings.empty or "name" not in settings.columns:
        return pd.DataFrame(columns=["model", "num_pairs", "seq_len", "accuracy"])
    values = settings["name"].map(setting_values)
    out = settings.assign(seq_len=[v.get("seq_len", math.nan) for v in values],
                          num_pairs=settings.get("config.task.num_pairs", np.nan),
                          model=settings.get("config.model.name", settings.get("model")))
    return out.dropna(subset=["seq_len"])


def unpredicted(data: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """The settings the runs measured that no prediction row names (a mixer added after the
    predictions were written, say): kept, with no prediction and preregistered False, so the
    table shows what was run and nothing is judged on it."""
    wide, along = _measured_key_width(data), _measured_length(data)
    keys = ["part", "model", "qk_dim", "num_pairs", "seq_len"]
    found = pd.concat([wide.drop_duplicates(["model", "qk_dim", "train_n"]).assign(part="key_width", seq_len=None)
                       .rename(columns={"train_n": "num_pairs"}).reindex(columns=keys),
                       along.drop_duplicates(["model", "num_pairs", "seq_len"]).assign(part="length")
                       .reindex(columns=keys)], ignore_index=True)
    named = {(r["part"], r["model"]) for _, r in rows.iterrows()}
    return found[[(p, m) not in named for p, m in zip(found["part"], found["model"])]].assign(preregistered=False)


def measured_points(data: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """Each prediction row with the measured mean over seeds (n, interval: analysis.stats.summarize)
    of the runs at its setting; NaN where no run measured it yet."""
    wide, along = _measured_key_width(data), _measured_length(data)
    out = []
    for _, row in rows.iterrows():
        if row["part"] == "length":
            runs = along[(along["model"] == row["model"]) & (along["num_pairs"] == row["num_pairs"])
                         & (along["seq_len"] == row["seq_len"])]
        else:
            runs = wide[(wide["model"] == row["model"]) & (wide["qk_dim"] == row["qk_dim"])
                        & (wide["train_n"] == row["num_pairs"])]
        if len(runs) and stats.SEED in runs.columns:
            est = stats.summarize(runs.assign(_setting=0), ["_setting"], "accuracy",
                                  count="count" if "count" in runs.columns else None).iloc[0]
            found = {**est.drop("_setting").to_dict(),
                     "count": float(runs["count"].mean()) if "count" in runs.columns else math.nan}
        else:
            found = {"n": 0, "mean": math.nan, "interval_method": stats.NO_INTERVAL, "low": math.nan,
                     "high": math.nan, "count": math.nan}
        out.append({**row.to_dict(), **found})
    return pd.DataFrame(out)


def with_errors(points: pd.DataFrame, margin: float) -> pd.DataFrame:
    """Each source's |log-odds error| against the measured mean, and each setting's verdict."""
    count = points["count"].where(np.isfinite(points["count"].astype(float))) if "count" in points.columns else None
    measured = log_odds(points["mean"], count)
    points = points.assign(**{s: pd.to_numeric(points[s], errors="coerce") for s in SOURCES})
    errors = {f"err_{s}_logodds": np.abs(log_odds(points[s], count) - measured) for s in SOURCES}
    points = points.assign(**errors, margin_logodds=margin)
    points["verdict"] = [verdict(r["err_law_logodds"], r["err_nominal_logodds"], r["err_anchored_logodds"], margin,
                                 bool(r.get("law_anchored_by_algebra", False)))
                         if np.isfinite(r["mean"]) and np.isfinite(r["law"]) else "" for _, r in points.iterrows()]
    return points


def summary_rows(points: pd.DataFrame, margin: float) -> pd.DataFrame:
    """Per part and mixer, over its discriminating settings that were measured: mean errors and
    the verdict (num_pairs, seq_len: "all")."""
    done = points[points["discriminating"].fillna(False).astype(bool) & np.isfinite(points["mean"].astype(float))]
    rows = []
    for (part, model), grp in done.groupby(["part", "model"]):
        err = {c: float(grp[c].mean()) for c in grp.columns if c.startswith("err_")}
        identity = bool(grp["law_anchored_by_algebra"].astype(bool).all())
        rows.append({"row": "summary", "part": part, "model": model, "qk_dim": "all", "num_pairs": "all", "seq_len": "all",
                     "settings": len(grp), **err, "margin_logodds": margin,
                     "law_anchored_by_algebra": identity,
                     "verdict": verdict(err["err_law_logodds"], err["err_nominal_logodds"],
                                        err["err_anchored_logodds"], margin, identity)})
    return pd.DataFrame(rows)


def law_table(data: pd.DataFrame) -> pd.DataFrame:
    """law_predictions.csv: every pre-registered setting (row "setting") with what was measured
    there and its verdict, then the per-part summaries (row "summary"; law_beats_baseline: the
    verdict is "law")."""
    rows = predictions(data).assign(preregistered=True)
    rows = pd.concat([rows, unpredicted(data, rows)], ignore_index=True)
    margin = stated(table(data, "runs"), MARGIN, LAW_MARGIN_LOGODDS)
    points = with_errors(measured_points(data, rows), margin)
    out = pd.concat([points.assign(row="setting", settings=1), summary_rows(points, margin)], ignore_index=True)
    return out.assign(law_beats_baseline=(out["verdict"] == "law").where(out["verdict"] != ""))


def _draw_key_width(ax, points: pd.DataFrame, colors: dict) -> None:
    part = points[(points["part"] == "key_width") & np.isfinite(points["mean"].astype(float))]
    for source in SOURCES:
        for model, grp in part.groupby("model"):
            ax.scatter(grp[source], grp["mean"], marker=MARKERS[source], s=24, facecolors="none",
                       edgecolors=colors[model], linewidths=1.0)
    ax.plot([0, 1], [0, 1], color="k", ls="--", lw=1.0)
    ax.set(xlim=(-0.02, 1.02), ylim=(-0.02, 1.02), xlabel="predicted accuracy (fraction)",
           ylabel="measured accuracy (fraction, mean over seeds)",
           title="other key widths, from key width 8's statistics")
    if part.empty:
        note(ax, "no run at another key width measured yet (stage 2)")


def _draw_length(ax, points: pd.DataFrame, colors: dict) -> None:
    part = points[points["part"] == "length"].sort_values("seq_len")
    for model, grp in part.groupby("model"):
        for source, ls in zip(SOURCES, ("-", "--", ":")):
            ax.plot(grp["seq_len"], grp[source], color=colors[model], ls=ls, lw=1.0)
        done = grp[np.isfinite(grp["mean"].astype(float))]
        ax.errorbar(done["seq_len"], done["mean"], yerr=yerr(done["mean"], done["low"], done["high"])
                    if done["low"].notna().any() else None, fmt="o", color=colors[model], ms=4, capsize=2)
    if len(part):
        log2_axis(ax, part["seq_len"])
    ax.set(ylim=(-0.02, 1.02), xlabel="sequence length (tokens; filler between pairs and queries)",
           ylabel="recall accuracy (fraction)", title="the decayed mixer against length")
    if part.empty:
        note(ax, "no length predictions in these results")


@figure("law")
def law_figure(data) -> Figure:
    """Measured against predicted at the other key widths, and recall against length with the
    three predictions."""
    tab = law_table(data)
    points = tab[tab["row"] == "setting"]
    colors = palette(sorted(points["model"].unique()))
    fig, (left, right) = new_figure(1, 2, panel=(4.0, 3.6), legend=2.4)
    _draw_key_width(left, points, colors)
    _draw_length(right, points, colors)
    handles = [Line2D([], [], color=colors[m], marker="o", ls="") for m in colors]
    handles += [Line2D([], [], color="0.3", marker=MARKERS[s], ls="", markerfacecolor="none") for s in SOURCES]
    handles += [Line2D([], [], color="0.3", ls=ls) for ls in ("-", "--", ":")]
    labels = list(colors) + [f"{s} (left)" for s in SOURCES] + [f"{s} (right)" for s in SOURCES]
    fig.legend(handles, labels, loc="outside right upper", fontsize="small", frameon=False)
    summary = tab[tab["row"] == "summary"]
    said = "; ".join(f"{r['model']} ({r['part']}): {r['verdict']}" for _, r in summary.iterrows()) or "no verdict yet"
    measured = points[pd.to_numeric(points["n"], errors="coerce").fillna(0) > 0]
    caption(fig, "The law's pre-registered predictions", measured,
            extra=f"predictions written into the experiment files before these runs (analysis.preregister); "
                  f"verdict over each mixer's discriminating settings, a win only by more than "
                  f"{float(tab['margin_logodds'].iloc[0]):g} nats of log-odds: {said}")
    fig.tables = {"law_predictions": tab}
    return fig
