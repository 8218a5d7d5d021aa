"""Capacity at Schlag's protocol: one model trained per number of stored pairs N, and where
each mixer breaks, against the size of its state.

Each run is trained at one N (config.task.num_pairs) and tested at every N of
task.test_num_pairs. Panels:

1. the protocol: accuracy at test N = training N, against N (one trained model per point);
2. the extrapolation view: the runs trained at one reference N (the training N with the most
   runs, or ``reference_n``), tested at every N, with the accuracy their kernel statistics
   predict out of sample (dashed: harness.measure.trained_theory's statistics measured at the
   training setting, evaluated at each other N through harness.measure.theory:
   ``acc_predicted_from_train`` of each settings row);
3. N at 50% accuracy of the protocol (interpolated on log N) against the state's elements per
   layer (summary.state_elements_per_layer), log-log, with the exponent fitted per family
   (summary.family, the mixer's kind; else its name);
4. every learning rate's result (chosen per mixer, width and training N on the validation
   split at the training N), and Schlag et al.'s break points beside each mixer's, scaled to
   the run's head width (x d_head / 64).

Every point: each seed drawn, the mean, and an interval only from five seeds (analysis.stats).
A point with a seed that ended at trainer.max_steps is a lower bound (capacity_protocol.csv's
lower_bound, hollow in the figure): no ranking is read from it, and a break point that rests on
one says so (n50_lower_bound). capacity_n50.csv gives Schlag's criterion beside N at 50%
(n_recalled: the largest N recalled at RECALL_THRESHOLD), the break rather than the ceiling
(n_break: BREAK_RULE), and, where a wide model's key width was set apart (model.qk_dim below
d_model: the findings profile), N at 50% against the key width (analysis.plots.capacity_keys:
its exponent, the largest-over-next ratio and the wide-over-narrow confound, each with an
interval); the out-of-sample law's mean error beside its two naive baselines'
(harness.measure.out_of_sample.predict_baselines), in accuracy and log-odds, softmax apart, with
a verdict that needs a margin (capacity_law_baseline.csv); capacity_stops.csv the share of runs
stopped on their validation plateau; capacity_control.csv softmax at every N of each width (the
control with no fixed state: below CONTROL_CEILING the width's curves measure the embedding).
A run's curve is labelled by its key width where that varies in its sweep ("elu qk_dim=4").
Every mixer the sweep ran is drawn (harness.config.mixers); its variants (dpfp ν, FAVOR+
features, the additive control) are told apart by the options that vary (analysis.plots.labels).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from analysis import stats
from analysis.lr_edge import in_rate_folder
from analysis.plots import FigureSpec
from analysis.plots.common import (STOP, WIDTH, caption, draw_estimates, figure, label_order, label_styles, labelled,
                                   legend_outside, log2_axis, loglog_slope, lr_heatmap, mark_lower_bounds, new_figure,
                                   note, plain_log_axes, require, retrieval_heads, select_on_validation, setting_values,
                                   table, with_stop_flags)
from analysis.plots.capacity_keys import key_width_table
from analysis.plots.reference import SCHLAG_BREAKS, SCHLAG_D_KEY
from harness.measure.out_of_sample import anchored_by_algebra

# What this module's figures need (analysis.plots.figures finds it; nothing else lists them).
FIGURES = (
    # capacity_narrow: the findings profile's narrow model beside its wide one (no such quick sweep)
    FigureSpec("capacity", "capacity", "capacity_figure", also=("capacity_narrow",), notebook="nb_capacity",
               tables=("capacity_per_lr", "capacity_n50", "capacity_schlag", "capacity_protocol",
                       "capacity_extrapolation", "capacity_families", "capacity_stops", "capacity_law_baseline",
                       "capacity_ranking", "capacity_control"),
               synthetic="analysis.synthetic.capacity.capacity_runs"),
)

TRAIN_N = "config.task.num_pairs"
QK = "config.model.qk_dim"  # a wide model's key width set apart from its width: an axis, not a variant
POINT = ["label", WIDTH, "train_n"]   # one trained model family: the learning rate is chosen per point
FROM_TRAIN = "acc_predicted_from_train"
READOUT = "acc_readout_trained"
STATE = "summary.state_elements_per_layer"
# softmax, with no fixed state, is the control: where it falls below this at a width, that
# width's curves measure its embedding as well as the mixers' states
CONTROL_CEILING = 0.98
# Schlag et al.'s criterion: the largest N still recalled, read at this accuracy (beside N at 50%)
RECALL_THRESHOLD = 0.9
# The break, not the ceiling: the largest N still recalled at this fraction of the mixer's own
# accuracy at its smallest N, so a model that never reaches 0.9 (a narrow embedding) still has one
BREAK_FRACTION = 0.99
BREAK_RULE = (f"n_break: the largest N whose mean accuracy is at least {BREAK_FRACTION} x the mixer's own at "
              f"its smallest N (every smaller N too)")


def capacity_points(data: pd.DataFrame) -> pd.DataFrame:
    """Interference-task slices by number of pairs, labelled, with the run's training N
    (``train_n``; NaN for runs that do not say), the test N (``value``) and ``lower_bound``: the run
    ended at trainer.max_steps (summary.stop_reason), not on its validation plateau, so its
    accuracy is a lower bound on what the mixer reaches there."""
    rows = table(data, "slices", primary=True)
    if "slice" in rows.columns:
        rows = rows[rows["slice"] == "num_pairs"]
    if "task" in rows.columns:
        rows = rows[rows["task"] == "interference"]
    rows = require(rows, ["model", "value", "accuracy"], "interference-task accuracy by num_pairs")
    if WIDTH not in rows.columns:
        rows = rows.assign(**{WIDTH: np.nan})
    rows = with_stop_flags(rows.assign(train_n=rows[TRAIN_N] if TRAIN_N in rows.columns else np.nan,
                                       qk_dim=key_width(rows)))
    base = labelled(rows, exclude=(WIDTH, QK))["label"]  # the mixer whatever its key width
    return labelled(rows).assign(base_label=base)


def key_width(rows: pd.DataFrame) -> pd.Series:
    """Each row's per-head q/k width: config.model.qk_dim where set, else d_model / n_heads."""
    heads = rows["config.model.n_heads"] if "config.model.n_heads" in rows.columns else 1
    own = pd.to_numeric(rows[WIDTH], errors="coerce") / heads
    return pd.to_numeric(rows[QK], errors="coerce").fillna(own) if QK in rows.columns else own


def capacity_selected(data: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(every slice of the runs at the learning rate chosen per point, per-lr table). The rate
    is chosen on validation at the training N (where the validation batches are); runs that do
    not name their training N are chosen on their mean over the tested N."""
    rows = capacity_points(data)
    at_train = rows[(rows["value"] == rows["train_n"]) | rows["train_n"].isna()]
    picked, per_lr = select_on_validation(at_train, POINT, count="count")
    return rows[rows["run_dir"].isin(set(picked["run_dir"]))].reset_index(drop=True), per_lr


def protocol_rows(selected: pd.DataFrame) -> pd.DataFrame:
    """Test N = training N: the per-N protocol's points (one model per N)."""
    return selected[selected["value"] == selected["train_n"]]


def reference_n(rows: pd.DataFrame, reference: float | None = None) -> float:
    """The training N of the extrapolation view: ``reference`` if given, else the training N
    with the most runs of ``rows`` (every learning rate counted: where the sweep spent more;
    ties: the smallest, which has the most test N beyond it)."""
    if reference is not None:
        return float(reference)
    runs = rows.drop_duplicates("run_dir")
    counts = runs.groupby("train_n")["run_dir"].size()
    if counts.empty:
        return math.nan
    top = counts[counts == counts.max()].index
    return float(min(top)) if len(top) else math.nan


def predicted_points(data: pd.DataFrame, labels: pd.Series) -> pd.DataFrame:
    """Out-of-sample predicted accuracy (``predicted``) per run and test N (``value``) of the
    runs in ``labels`` (run_dir -> label): the settings rows' acc_predicted_from_train, else the
    summary's acc_predicted_from_train/<setting>; empty when the runs carry no prediction."""
    settings = table(data, "settings")
    if FROM_TRAIN in settings.columns and "run_dir" in settings.columns:
        pts = settings[settings["run_dir"].isin(labels.index)].dropna(subset=[FROM_TRAIN])
        trained = pts[TRAIN_N] if TRAIN_N in pts.columns else pd.Series(np.nan, index=pts.index)
        pts = pts.assign(value=[setting_values(name).get("num_pairs", n) for name, n in zip(pts["name"], trained)])
        pts = pts.rename(columns={FROM_TRAIN: "predicted"})
    else:
        runs = table(data, "runs")
        prefix = f"summary.{FROM_TRAIN}/"
        cols = [c for c in runs.columns if c.startswith(prefix)]
        if not cols or "run_dir" not in runs.columns:
            return pd.DataFrame(columns=["run_dir", "label", WIDTH, "value", "predicted"])
        runs = runs[runs["run_dir"].isin(labels.index)]
        pts = runs.melt(id_vars=["run_dir"] + [c for c in (WIDTH,) if c in runs.columns], value_vars=cols,
                        var_name="setting", value_name="predicted").dropna(subset=["predicted"])
        pts = pts.assign(value=[setting_values(s[len(prefix):]).get("num_pairs", np.nan) for s in pts["setting"]])
    return _with_labels(pts, labels)


def readout_points(data: pd.DataFrame, labels: pd.Series) -> pd.DataFrame:
    """The same-setting read-out analysis (acc_readout_trained) of the retrieval head, per run
    and N: what the weights at each tested N give, not a prediction."""
    heads = retrieval_heads(table(data, "heads"))
    if heads.empty or READOUT not in heads.columns or "run_dir" not in heads.columns:
        return pd.DataFrame(columns=["run_dir", "label", WIDTH, "value", READOUT])
    return _with_labels(heads[heads["run_dir"].isin(labels.index)].dropna(subset=[READOUT]), labels)


def _with_labels(rows: pd.DataFrame, labels: pd.Series) -> pd.DataFrame:
    """Rows of other tables under the labels their runs have in the figure's own rows."""
    rows = rows.assign(label=rows["run_dir"].map(labels))
    return rows if WIDTH in rows.columns else rows.assign(**{WIDTH: np.nan})


def run_labels(rows: pd.DataFrame) -> pd.Series:
    """run_dir -> label of the figure's labelled rows."""
    return rows.drop_duplicates("run_dir").set_index("run_dir")["label"]


def half_point(n, accuracy) -> float:
    """N at which accuracy (mean per N) first falls to 0.5, interpolated in log N; inf if it
    stays above 0.5 over the measured N, NaN if it starts below."""
    curve = pd.Series(np.asarray(accuracy, float), index=np.asarray(n, float)).groupby(level=0).mean().sort_index()
    curve = curve.dropna()
    if curve.empty or curve.iloc[0] < 0.5:
        return math.nan
    below = np.nonzero(curve.to_numpy() < 0.5)[0]
    if below.size == 0:
        return math.inf
    i = below[0]
    (n0, a0), (n1, a1) = (curve.index[i - 1], curve.iloc[i - 1]), (curve.index[i], curve.iloc[i])
    frac = (a0 - 0.5) / (a0 - a1)
    return float(math.exp(math.log(n0) + frac * (math.log(n1) - math.log(n0))))


def recalled_n(n, accuracy, threshold: float = RECALL_THRESHOLD) -> float:
    """Schlag et al.'s criterion: the largest N whose mean accuracy is still >= threshold, every
    smaller N too; NaN if the smallest N is already below it."""
    curve = pd.Series(np.asarray(accuracy, float), index=np.asarray(n, float)).groupby(level=0).mean().sort_index()
    curve = curve.dropna()
    failing = np.nonzero(curve.to_numpy() < threshold)[0]
    held = curve.index if failing.size == 0 else curve.index[:failing[0]]
    return float(held[-1]) if len(held) else math.nan


def break_n(n, accuracy, fraction: float = BREAK_FRACTION) -> float:
    """The break, not the ceiling (BREAK_RULE): the largest N whose mean accuracy is still at
    least ``fraction`` of the mean at the smallest N tested, every smaller N too."""
    curve = pd.Series(np.asarray(accuracy, float), index=np.asarray(n, float)).groupby(level=0).mean().sort_index()
    curve = curve.dropna()
    return recalled_n(curve.index, curve.to_numpy(), fraction * curve.iloc[0]) if len(curve) else math.nan


def rests_on_lower_bounds(n, lower_bound, break_n: float) -> bool:
    """Whether a break point read at ``break_n`` rests on a run that ended at max_steps: any such
    run at N <= the first tested N past the break (their accuracy could be higher, the break
    later). A break that holds past every tested N rests on all of them."""
    n, lower = np.asarray(n, float), np.asarray(lower_bound, bool)
    if not np.isfinite(break_n):
        return bool(lower.any())
    past = n[n > break_n]
    limit = past.min() if past.size else math.inf
    return bool(lower[n <= limit].any())


def stop_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per mixer and all together: runs, how many stopped on the validation plateau and how many
    at max_steps, and the share on the plateau (summary.stop_reason; NaN where runs do not say)."""
    runs = rows.drop_duplicates("run_dir") if "run_dir" in rows.columns else rows
    reason = runs[STOP] if STOP in runs.columns else pd.Series(np.nan, index=runs.index)
    runs = runs.assign(_plateau=reason.eq("plateau"), _max=reason.eq("max_steps"), _known=reason.notna())
    out = []
    for label, grp in [*runs.groupby("label"), ("all", runs)]:
        known = int(grp["_known"].sum())
        out.append({"label": label, "runs": len(grp), "on_plateau": int(grp["_plateau"].sum()),
                    "at_max_steps": int(grp["_max"].sum()),
                    "plateau_share": grp["_plateau"].sum() / known if known else math.nan})
    return pd.DataFrame(out)


# ---- the law against its baselines (harness.measure.out_of_sample.predict_baselines)

SOURCES = {"law": FROM_TRAIN, "nominal": "acc_baseline_nominal", "anchored": "acc_baseline_anchored"}
TOLERANCE = "config.analysis.law_tolerance_logodds"  # written in the experiment before its runs
# A win is a mean |error| under the better baseline's by more than this many nats of log-odds
# (config.analysis.law_margin_logodds where the experiment states it): a tie within it is no win.
# 0.25 nats is about three standard errors of a five-seed mean accuracy near 0.5.
MARGIN = "config.analysis.law_margin_logodds"
LAW_MARGIN_LOGODDS = 0.25
STATS = "train_stats."
FLOOR = 0.005  # log-odds clip where a row does not say how many queries it counted


def is_training_setting(row: pd.Series) -> bool:
    """Whether a settings row is its run's training setting: every field its name sets
    (num_pairs=16, seq_len=256) equals the run's config.task.<field>."""
    fields = setting_values(row.get("name", ""))
    known = {k: v for k, v in fields.items() if f"config.task.{k}" in row.index and pd.notna(row[f"config.task.{k}"])}
    return bool(known) and all(row[f"config.task.{k}"] == v for k, v in known.items())


def out_of_sample_rows(data: pd.DataFrame, chosen: set | None) -> pd.DataFrame:
    """Settings rows of the ``chosen`` runs (None: every run) other than their training setting
    with both the measured accuracy and acc_predicted_from_train, labelled, with train_n and
    test_n; empty if none."""
    settings = table(data, "settings")
    if not {FROM_TRAIN, "accuracy", "run_dir", "name"} <= set(settings.columns):
        return pd.DataFrame()
    if chosen is not None:
        settings = settings[settings["run_dir"].isin(chosen)]
    settings = settings.dropna(subset=[FROM_TRAIN, "accuracy"])
    if settings.empty:
        return settings
    other = settings[[not is_training_setting(r) for _, r in settings.iterrows()]]
    if WIDTH not in other.columns:
        other = other.assign(**{WIDTH: np.nan})
    train_n = other[TRAIN_N] if TRAIN_N in other.columns else np.nan
    other = other.assign(train_n=train_n, test_n=[setting_values(n).get("num_pairs", np.nan) for n in other["name"]])
    return labelled(other)


def log_odds(p, count=None) -> np.ndarray:
    """logit of accuracies, clipped half a query in from 0 and 1 (1 / (2 count); FLOOR where the
    count is unknown), so that a floor or a ceiling costs a finite error."""
    p = np.asarray(p, float)
    eps = FLOOR if count is None else 0.5 / np.maximum(np.asarray(count, float), 1.0)
    eps = np.where(np.isfinite(eps), eps, FLOOR)
    q = np.clip(p, eps, 1 - eps)
    return np.log(q / (1 - q))


def law_errors(points: pd.DataFrame) -> pd.DataFrame:
    """Out-of-sample rows with each source's |error| against the measured accuracy, in accuracy
    (err_<source>_acc) and in log-odds (err_<source>_logodds), NaN where a source is missing."""
    count = points["count"] if "count" in points.columns else None
    measured = log_odds(points["accuracy"], count)
    extra = {}
    for source, column in SOURCES.items():
        pred = points[column].astype(float) if column in points.columns else pd.Series(np.nan, index=points.index)
        extra[f"err_{source}_acc"] = (pred - points["accuracy"]).abs()
        extra[f"err_{source}_logodds"] = pd.Series(np.abs(log_odds(pred, count) - measured),
                                                   index=points.index).where(pred.notna())
    return points.assign(**extra)


def stated(rows: pd.DataFrame, column: str, default: float = math.nan) -> float:
    """A number the experiment fixed before its runs (config.analysis.*), else ``default``."""
    return float(rows[column].dropna().iloc[0]) if column in rows.columns and rows[column].notna().any() else default


def law_is_anchored(rows: pd.DataFrame) -> pd.Series:
    """Per row, whether its run's law is the anchored baseline by algebra
    (harness.measure.out_of_sample.anchored_by_algebra of its train_stats); False where the run
    recorded none."""
    names = ("law", "kernel_target", "log_decay", "target_write_gain")
    if not all(f"{STATS}{n}" in rows.columns for n in names):
        return pd.Series(False, index=rows.index)
    return pd.Series([isinstance(r[f"{STATS}law"], str) and anchored_by_algebra(*(r[f"{STATS}{n}"] for n in names))
                      for _, r in rows.iterrows()], index=rows.index, dtype=bool)


def verdict(err_law: float, err_nominal: float, err_anchored: float, margin: float, identity: bool = False) -> str:
    """Who predicted better, in mean |log-odds error|: "law" where its error is under the better
    baseline's by more than ``margin``, "nominal" or "anchored" where that baseline's is under the
    law's by more than it, "tie" otherwise; "identity" where the law is the anchored baseline by
    algebra (no contest); "" where an error is missing."""
    if identity:
        return "identity"
    errors = {"nominal": err_nominal, "anchored": err_anchored}
    if not all(np.isfinite([err_law, *errors.values()])):
        return ""
    best = min(errors, key=errors.get)
    if err_law + margin < errors[best]:
        return "law"
    if errors[best] + margin < err_law:
        return best
    return "tie"


def law_baseline_table(points: pd.DataFrame) -> pd.DataFrame:
    """Per mixer and width: the mean |error| of the law and of each baseline over its
    out-of-sample settings (accuracy and log-odds), the verdict (``verdict``: a win needs a margin
    of margin_logodds), law_beats_baseline (the verdict is "law"), law_anchored_by_algebra (its
    runs' law is the anchored baseline by construction: no win is counted), whether it is within
    the experiment's tolerance, and counted_in_mean (False for softmax, whose prediction sits at
    the ceiling: reported apart); then one row, label "mean (softmax apart)", over the mixers
    counted."""
    if points.empty:
        return pd.DataFrame(columns=["label", WIDTH, "settings", "law_beats_baseline"])
    errors = law_errors(points).assign(_identity=law_is_anchored(points))
    cols = [c for c in errors.columns if c.startswith("err_")]
    tol = stated(errors, TOLERANCE)
    margin = stated(errors, MARGIN, LAW_MARGIN_LOGODDS)
    rows = []
    for (label, width), grp in errors.groupby(["label", WIDTH], dropna=False):
        row = {"label": label, WIDTH: width, "family": _family(grp.iloc[0]), "settings": len(grp),
               **{c: float(grp[c].mean()) for c in cols}, "law_anchored_by_algebra": bool(grp["_identity"].all())}
        rows.append(row)
    out = pd.DataFrame(rows)
    out["counted_in_mean"] = out["family"] != "softmax"
    counted = out[out["counted_in_mean"]]
    mean = {"label": "mean (softmax apart)", WIDTH: math.nan, "family": "", "settings": int(counted["settings"].sum()),
            **{c: float(counted[c].mean()) for c in cols}, "counted_in_mean": False,
            "law_anchored_by_algebra": bool(counted["law_anchored_by_algebra"].all()) if len(counted) else False}
    out = pd.concat([out, pd.DataFrame([mean])], ignore_index=True)
    out["margin_logodds"] = margin
    out["verdict"] = [verdict(r.get("err_law_logodds", math.nan), r.get("err_nominal_logodds", math.nan),
                              r.get("err_anchored_logodds", math.nan), margin, r["law_anchored_by_algebra"])
                      for _, r in out.iterrows()]
    out["law_beats_baseline"] = (out["verdict"] == "law").where(out["verdict"] != "")
    out["tolerance_logodds"] = tol
    out["law_within_tolerance"] = (out["err_law_logodds"] <= tol).where(np.isfinite(tol) & out["err_law_logodds"].notna())
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if np.isfinite(a) and np.isfinite(b) and b > 0 else math.nan


def half_capacity_table(selected: pd.DataFrame, predicted: pd.DataFrame, readout: pd.DataFrame | None = None,
                        reference: float | None = None) -> pd.DataFrame:
    """Per mixer (label) and width: N at 50% of the per-N protocol (its seeds' values, n, mean
    and interval; n50_lower_bound where it rests on a run that ended at max_steps), Schlag's
    criterion (n_recalled: the largest N recalled at recall_threshold, and its lower-bound
    flag), N at 50% of the extrapolation from the reference training N measured and predicted out
    of sample (and read out of the same weights), their ratios, state elements and parameters.
    ``reference``: the training N of the extrapolation (default: reference_n of ``selected``)."""
    ref = reference_n(selected, reference)
    protocol = protocol_rows(selected)
    extrapolation = selected[selected["train_n"] == ref] if np.isfinite(ref) else selected
    rows = []
    for (label, width), grp in selected.groupby(["label", WIDTH], dropna=False):
        proto = protocol[(protocol["label"] == label) & _same(protocol[WIDTH], width)]
        extra = extrapolation[(extrapolation["label"] == label) & _same(extrapolation[WIDTH], width)]
        pred = predicted[(predicted["label"] == label) & _same(predicted[WIDTH], width)] \
            if len(predicted) else predicted
        read = readout[(readout["label"] == label) & _same(readout[WIDTH], width)] \
            if readout is not None and len(readout) else pd.DataFrame()
        per_n = half_point(proto["value"], proto["accuracy"]) if len(proto) else math.nan
        recalled = recalled_n(proto["value"], proto["accuracy"]) if len(proto) else math.nan
        broke = break_n(proto["value"], proto["accuracy"]) if len(proto) else math.nan
        lower = proto["lower_bound"] if "lower_bound" in proto.columns else np.zeros(len(proto), bool)
        measured = half_point(extra["value"], extra["accuracy"]) if len(extra) else math.nan
        expected = half_point(pred["value"], pred["predicted"]) if len(pred) else math.nan
        read_out = half_point(read["value"], read[READOUT]) if len(read) else math.nan
        seeds = {s: half_point(g["value"], g["accuracy"]) for s, g in proto.groupby(stats.SEED)} \
            if stats.SEED in proto.columns else {}
        est = stats.estimate(list(seeds.values())) if all(np.isfinite(list(seeds.values()))) else None
        first = grp.iloc[0]
        row = {"label": label, "base_label": first.get("base_label", label), "model": first["model"],
               "family": _family(first), WIDTH: width, "qk_dim": _median(grp, "qk_dim"),
               "d_head": _median(grp, "summary.d_head"), "reference_n": ref,
               "n50_per_n": per_n, "n50_lower_bound": rests_on_lower_bounds(proto["value"], lower, per_n),
               "recall_threshold": RECALL_THRESHOLD, "n_recalled": recalled,
               "n_recalled_lower_bound": rests_on_lower_bounds(proto["value"], lower, recalled),
               "break_fraction": BREAK_FRACTION, "n_break": broke,
               "n_break_lower_bound": rests_on_lower_bounds(proto["value"], lower, broke),
               "n50_extrapolation": measured, "n50_predicted": expected,
               "n50_readout": read_out,
               "ratio_predicted_to_extrapolation": _ratio(expected, measured),
               "ratio_predicted_to_per_n": _ratio(expected, per_n),
               "ratio_extrapolation_to_per_n": _ratio(measured, per_n),
               "n": len(seeds), "mean": est.mean if est else (float(np.mean(list(seeds.values()))) if seeds else math.nan),
               "interval_method": est.method if est else "none (a seed holds past the tested N)" if seeds
               else stats.NO_INTERVAL,
               "low": est.low if est else math.nan, "high": est.high if est else math.nan,
               "state_elements_per_layer": _median(grp, STATE), "params": _median(grp, "summary.params")}
        row.update({f"seed_{int(s)}": v for s, v in seeds.items()})
        rows.append(row)
    return pd.DataFrame(rows)


def _same(column: pd.Series, value) -> pd.Series:
    return column.isna() if pd.isna(value) else column == value


def _median(rows: pd.DataFrame, column: str) -> float:
    return float(rows[column].median()) if column in rows.columns and rows[column].notna().any() else math.nan


def _family(run: pd.Series) -> str:
    family = run.get("summary.family")
    return str(family) if isinstance(family, str) and family else str(run["model"])


def schlag_table(half: pd.DataFrame, selected: pd.DataFrame) -> pd.DataFrame:
    """Each mixer's measured break point (N50 of the protocol) beside Schlag et al.'s row for
    the same map (reference.SCHLAG_BREAKS), their keys scaled to the run's key width (x d_key /
    64): model.qk_dim where the key width is set apart from the head, else d_head."""
    options = selected.drop_duplicates("label").set_index("label")
    rows = []
    for _, mine in half.iterrows():
        row = next((b for b in SCHLAG_BREAKS if _matches(b, options.loc[mine["label"]])), None)
        d = mine["qk_dim"] if np.isfinite(mine.get("qk_dim", math.nan)) else mine["d_head"]
        scaled = row.scaled(d) if row is not None and np.isfinite(d) else None
        rows.append({"label": mine["label"], WIDTH: mine[WIDTH], "d_head": mine["d_head"], "d_key": d,
                     "n50_per_n": mine["n50_per_n"],
                     "n": mine["n"], "schlag_row": row.name if row else "",
                     f"schlag_keys_at_d{SCHLAG_D_KEY}": _span(row.low, row.high) if row and row.low else
                     (row.note if row else ""),
                     "schlag_keys_scaled": _span(*scaled) if scaled else "",
                     "ratio_to_schlag_scaled": _ratio(mine["n50_per_n"], sum(scaled) / 2) if scaled else math.nan})
    return pd.DataFrame(rows)


def _matches(row, run: pd.Series) -> bool:
    if run["model"] != row.model:
        return False
    return all(run.get(f"config.model.{k}") == v for k, v in row.options.items())


def _span(low: float, high: float) -> str:
    return f"{low:.0f}" if abs(high - low) < 0.5 else f"{low:.0f}-{high:.0f}"


def family_fits(half: pd.DataFrame) -> pd.DataFrame:
    """Per family: the exponent of N50 on state elements (log-log least squares over its mixers'
    finite break points) and the number of points it rests on."""
    rows = []
    for family, grp in half.groupby("family"):
        ok = grp[np.isfinite(grp["n50_per_n"]) & np.isfinite(grp["state_elements_per_layer"])]
        rows.append({"family": family, "exponent": loglog_slope(ok["state_elements_per_layer"], ok["n50_per_n"]),
                     "points": len(ok), "mixers": ", ".join(ok["label"])})
    return pd.DataFrame(rows)


def _draw_break_points(ax, half: pd.DataFrame, fits: pd.DataFrame, colors, markers, n_max: float) -> list:
    styles = ("-", "--", ":", "-.")
    handles = []
    for _, row in half.iterrows():
        x, y = row["state_elements_per_layer"], row["n50_per_n"]
        if not np.isfinite(x) or np.isnan(y):
            continue
        holds = not np.isfinite(y)  # never fell to 50%: a lower bound at the largest N tested
        # a lower bound: the mixer's own marker, hollow (two mixers holding at one state size stay apart)
        ax.scatter([x], [n_max if holds else y], s=36, marker=markers[row["label"]],
                   facecolors="none" if holds else colors[row["label"]], edgecolors=colors[row["label"]], zorder=3)
        for s in stats.seed_values(row):
            ax.scatter([x], [s], s=8, color=colors[row["label"]], alpha=0.4, linewidths=0)
    for (_, fit), ls in zip(fits.iterrows(), styles * 4):
        ok = half[(half["family"] == fit["family"]) & np.isfinite(half["n50_per_n"])
                  & np.isfinite(half["state_elements_per_layer"])]
        if not np.isfinite(fit["exponent"]):
            continue
        x = np.geomspace(ok["state_elements_per_layer"].min(), ok["state_elements_per_layer"].max(), 10)
        offset = np.mean(np.log(ok["n50_per_n"]) - fit["exponent"] * np.log(ok["state_elements_per_layer"]))
        ax.plot(x, np.exp(offset) * x ** fit["exponent"], color="0.25", ls=ls, lw=1.0)
        handles.append((Line2D([], [], color="0.25", ls=ls), f"{fit['family']}: N50 ∝ S^{fit['exponent']:.2f}"))
    return handles


def _draw_table(ax, frame: pd.DataFrame) -> None:
    ax.axis("off")
    if frame.empty:
        return
    cells = [[r["label"], f"{r['d_key']:g}" if np.isfinite(r["d_key"]) else "",
              "≥ tested" if r["n50_per_n"] == np.inf else (f"{r['n50_per_n']:.0f}" if np.isfinite(r["n50_per_n"]) else "—"),
              str(r[f"schlag_keys_at_d{SCHLAG_D_KEY}"]) or "—", r["schlag_keys_scaled"] or "—"] for _, r in frame.iterrows()]
    tab = ax.table(cellText=cells, colLabels=["mixer", "d_key", "N50 here", f"Schlag et al., d = {SCHLAG_D_KEY}",
                                              "Schlag x d_key/64"], bbox=[0, 0, 1, 1], cellLoc="left",
                   colWidths=[0.2, 0.08, 0.1, 0.46, 0.16])  # the whole axes: never up into its title
    tab.auto_set_font_size(False)
    tab.set_fontsize(6 if len(cells) <= 12 else 5)
    ax.set_title("break points beside Schlag et al. (2021)\n(keys at 50% recall; scaled to the key width)", fontsize="small")


def _share_text(share: pd.Series) -> str:
    if share.empty or not np.isfinite(share.iloc[0]):
        return "runs do not say where they stopped (summary.stop_reason)"
    return f"{share.iloc[0]:.0%} of runs stopped on their validation plateau"


def _mark_lower_bounds(ax, points: pd.DataFrame, colors, markers) -> None:
    """Hollow over the mean of every point with a seed that ended at max_steps."""
    for _, row in points[points["lower_bound"].astype(bool)].iterrows():
        ax.scatter([row["value"]], [row["mean"]], s=30, marker=markers[row["label"]], facecolors="white",
                   edgecolors=colors[row["label"]], linewidths=1.0, zorder=4)


@figure("capacity")
def capacity_figure(data, reference: float | None = None) -> Figure:
    """The per-N protocol, the extrapolation from one training N with its out-of-sample
    prediction, N50 against state elements, every learning rate, and Schlag's break points."""
    selected, per_lr = capacity_selected(data)
    ref = reference_n(capacity_points(data), reference)
    protocol = protocol_rows(selected)
    extra_runs = selected[selected["train_n"] == ref] if np.isfinite(ref) else selected
    order = label_order(selected)
    colors, markers = label_styles(selected)
    point = ["label", WIDTH, "value"]
    proto_pts = mark_lower_bounds(stats.summarize(protocol, point, "accuracy", count="count"), protocol, point)
    extra_pts = mark_lower_bounds(stats.summarize(extra_runs, point, "accuracy", count="count"), extra_runs, point)
    stops = stop_table(selected)
    predicted = predicted_points(data, run_labels(extra_runs))
    readout = readout_points(data, run_labels(extra_runs))
    half = half_capacity_table(selected, predicted, readout, ref)
    versus = law_baseline_table(out_of_sample_rows(data, set(selected["run_dir"])))
    if len(versus):
        keep = [c for c in versus.columns if c.startswith("err_")] + ["verdict", "law_beats_baseline",
                                                                        "law_anchored_by_algebra", "margin_logodds",
                                                                        "law_within_tolerance", "tolerance_logodds",
                                                                        "counted_in_mean"]
        half = half.merge(versus[["label", WIDTH, *keep]], on=["label", WIDTH], how="left")
    keys = key_width_table(half)
    if len(keys):
        half = half.merge(keys, on="base_label", how="left")
    fits = family_fits(half)

    fig, axes = new_figure(2, 3, panel=(3.6, 3.1), legend=2.2)
    proto_ax, extra_ax, state_ax, heat = axes[:4]
    grid = axes[0].get_subplotspec().get_gridspec()
    for ax in axes[4:]:
        ax.remove()
    tab_ax = fig.add_subplot(grid[1, 1:])  # the table takes the width of two panels
    draw_estimates(proto_ax, proto_pts, "value", colors, markers, log_x=True)
    _mark_lower_bounds(proto_ax, proto_pts, colors, markers)
    log2_axis(proto_ax, proto_pts["value"])
    proto_ax.set(ylim=(-0.02, 1.02), xlabel="N  (stored pairs; trained and tested at N)",
                 ylabel="recall accuracy (fraction)", title="one model per N (Schlag's protocol)")
    if protocol.empty:
        note(proto_ax, "no run tested at its own training N (config.task.num_pairs)")

    draw_estimates(extra_ax, extra_pts, "value", colors, markers, log_x=True)
    if len(predicted):
        mean_pred = predicted.groupby(["label", "value"], as_index=False)["predicted"].mean()
        for lab in order:
            part = mean_pred[mean_pred["label"] == lab].sort_values("value")
            extra_ax.plot(part["value"], part["predicted"], color=colors[lab], ls="--", lw=1.0)
    else:
        note(extra_ax, f"no out-of-sample prediction in these results ({FROM_TRAIN})")
    if np.isfinite(ref):
        extra_ax.axvline(ref, color="0.5", lw=0.8, ls=":")
    log2_axis(extra_ax, extra_pts["value"])
    extra_ax.set(ylim=(-0.02, 1.02), xlabel="test N  (stored pairs)", ylabel="recall accuracy (fraction)",
                 title=f"trained at N = {ref:g}, tested at every N" if np.isfinite(ref) else "tested at every N")

    n_max = float(protocol["value"].max()) if len(protocol) else float(selected["value"].max())
    fit_handles = _draw_break_points(state_ax, half, fits, colors, markers, n_max)
    state_ax.set(xscale="log", yscale="log", xlabel="state per layer (elements)",
                 ylabel="N at 50% accuracy (pairs, per-N protocol)", title="break point against state size")
    plain_log_axes(state_ax)
    if not np.isfinite(half["state_elements_per_layer"]).any():
        note(state_ax, "no state size in these results (summary.state_elements_per_layer)")
    elif half["n50_per_n"].isna().all():
        note(state_ax, "no break point: every mixer starts below 50% at the smallest N")
    piloted = selected["run_dir"].map(in_rate_folder).any()  # each ran at the rate the pilot chose
    lr_heatmap(heat, per_lr, [WIDTH, "train_n"], order, title="every learning rate (per training N)",
               chosen_before="the rate pilot" if piloted else None)
    schlag = schlag_table(half, selected)
    _draw_table(tab_ax, schlag)

    extra = {"predicted out of sample (dashed)": Line2D([], [], color="0.3", ls="--"),
             "ended at max_steps (lower bound)": Line2D([], [], color="0.3", marker="o", ls="",
                                                        markerfacecolor="white"),
             "holds past the largest N (lower bound)": Line2D([], [], color="0.3", marker="^", ls="",
                                                              markerfacecolor="none")}
    extra.update({label: handle for handle, label in fit_handles})
    handles = [Line2D([], [], color=colors[lab], marker=markers[lab]) for lab in order]
    legend_outside(fig, None, handles + list(extra.values()), order + list(extra))
    share = stops[stops["label"] == "all"]["plateau_share"]
    caption(fig, "Capacity: one model per N, and the extrapolation from one N", proto_pts, extra_pts,
            extra=f"{_share_text(share)}; hollow: a point with a seed that ended at max_steps (a lower bound: no "
                  f"break point or ranking is read from it); N recalled: the largest N at accuracy >= {RECALL_THRESHOLD}; "
                  f"{BREAK_RULE}; a wide model's curves are labelled by their key width (qk_dim), and capacity_n50.csv "
                  f"sets their N at 50% against it")
    protocol_csv = proto_pts.rename(columns={"value": "num_pairs"})
    extra_csv = extra_pts.rename(columns={"value": "test_num_pairs"}).assign(train_num_pairs=ref)
    fig.tables = {"capacity_per_lr": per_lr, "capacity_n50": half, "capacity_schlag": schlag,
                  "capacity_protocol": protocol_csv, "capacity_extrapolation": extra_csv,
                  "capacity_families": fits, "capacity_stops": stops, "capacity_law_baseline": versus,
                  "capacity_ranking": stats.ranking(proto_pts[~proto_pts["lower_bound"].astype(bool)],
                                                    within=[WIDTH, "value"]),
                  "capacity_control": control_table(protocol_csv, selected)}
    return fig


def control_table(points: pd.DataFrame, selected: pd.DataFrame) -> pd.DataFrame:
    """softmax's points of the protocol (no fixed state: the control) at each width and N, with
    below_ceiling where its mean falls under CONTROL_CEILING: there the width's curves measure the
    embedding too. Empty where softmax did not run."""
    runs = selected.drop_duplicates("label")
    softmax = set(runs.loc[[_family(run) == "softmax" for _, run in runs.iterrows()], "label"])
    rows = points[points["label"].isin(softmax)]
    return rows.assign(ceiling=CONTROL_CEILING, below_ceiling=rows["mean"] < CONTROL_CEILING)
