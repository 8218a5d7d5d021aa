"""Learning curves: validation accuracy against training step, per mixer and task.

Does a mixer fall short because it cannot hold the pairs (capacity) or because it has not
learnt yet (training)? Each run's metrics.jsonl rows of split "val" (the loader's metrics
table) give its validation accuracy at every evaluation. One panel per task in the results:
the default recall task (the sharpness sweep) and the capacity task, there the runs trained
at the reference N (analysis.plots.capacity.reference_n: the training N with the most runs).
Runs are those of the learning rate chosen per mixer on the validation split.

Each seed is a thin line ending where the run stopped (runs stop early on a plateau:
summary.stop_reason, marked by its own symbol), the mean over seeds a thick line (a seed that
has stopped keeps its last value, as its model does), with an interval only from five seeds
(analysis.stats). `learning_steps.csv`: the first step at which each seed's validation accuracy
reached THRESHOLD ("never" where it did not), the mean over seeds (only if every seed got
there), and the steps each seed actually trained.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.transforms import offset_copy
from scipy.cluster.hierarchy import fclusterdata

from analysis import stats
from analysis.plots import FigureSpec
from analysis.plots.capacity import reference_n
from analysis.plots.common import (MissingData, caption, family_groups, figure, label_order, label_styles, labelled,
                                   legend_outside, mixer_handles, new_figure, select_on_validation, table)

# What this module's figures need (analysis.plots.figures finds it; nothing else lists them).
FIGURES = (
    # the default recall task (the sharpness sweep) and the capacity task
    FigureSpec("learning", "sharpness", "learning_figure", also=("capacity",), notebook="nb_learning",
               tables=("learning_steps",)),
)

THRESHOLD = 0.9
TRAIN_N = "config.task.num_pairs"
STOP = "summary.stop_reason"
STOP_MARKERS = {"plateau": "x", "target": "*", "max_steps": "|"}
NEVER = "never"


def learning_rows(data: pd.DataFrame) -> pd.DataFrame:
    """Validation rows of the metrics table (step, accuracy) of the chosen runs, labelled per
    task, with ``panel`` naming the task (and the reference N where the runs differ in N)."""
    metrics = table(data, "metrics", primary=True)
    if not {"step", "accuracy", "run_dir", "model"} <= set(metrics.columns):
        raise MissingData("no learning curves (metrics.jsonl rows with step and accuracy)")
    if "split" in metrics.columns:
        metrics = metrics[metrics["split"] == "val"]
    metrics = metrics.dropna(subset=["step", "accuracy"])
    if metrics.empty:
        raise MissingData("no validation rows in metrics.jsonl")
    runs = table(data, "runs")
    if "task" not in metrics.columns:
        metrics = metrics.assign(task="task")
    parts = []
    for task, rows in metrics.groupby("task", sort=False):
        task_runs = runs[runs["task"] == task] if "task" in runs.columns else runs
        panel = f"task {task}"
        if TRAIN_N in task_runs.columns and task_runs[TRAIN_N].nunique() > 1:
            ref = reference_n(task_runs.assign(train_n=task_runs[TRAIN_N]))
            task_runs = task_runs[task_runs[TRAIN_N] == ref]
            panel += f", trained at N = {ref:g}"
        task_runs = labelled(task_runs)
        if "summary.val_accuracy" in task_runs.columns and "summary.accuracy" in task_runs.columns:
            task_runs, _ = select_on_validation(task_runs, ["label"], test="summary.accuracy",
                                                val="summary.val_accuracy")
        labels = task_runs.set_index("run_dir")["label"]
        chosen = rows[rows["run_dir"].isin(labels.index)]
        parts.append(chosen.assign(label=chosen["run_dir"].map(labels), panel=panel))
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if out.empty:
        raise MissingData("no learning curves of finished runs")
    if stats.SEED not in out.columns:
        out[stats.SEED] = out.groupby(["panel", "label"])["run_dir"].transform(lambda d: pd.factorize(d)[0])
    return out


def carried_forward(rows: pd.DataFrame) -> pd.DataFrame:
    """Per panel and label, every seed's accuracy at every step any seed was evaluated at, a
    stopped seed's last value carried forward (before its first evaluation: absent)."""
    parts = []
    for (panel, label), grp in rows.groupby(["panel", "label"], sort=False):
        wide = grp.pivot_table(index="step", columns=stats.SEED, values="accuracy", aggfunc="last").sort_index()
        long = wide.ffill().stack().rename("accuracy").reset_index()
        parts.append(long.assign(panel=panel, label=label))
    return pd.concat(parts, ignore_index=True)


def steps_to(rows: pd.DataFrame, runs: pd.DataFrame | None = None, threshold: float = THRESHOLD) -> pd.DataFrame:
    """Per panel and label: the first step each seed's validation accuracy reached ``threshold``
    (seed_<id>; "never" where it did not), n, the mean and interval over seeds where every seed
    reached it (else "never (k of n)"), the steps each seed trained (steps_trained_*), and the seeds
    that ended at max_steps (runs_at_max_steps; lower_bound: a seed that never reached the
    threshold may have been stopped before it would)."""
    out = []
    for (panel, label), grp in rows.groupby(["panel", "label"], sort=False):
        per_seed, trained, reasons = {}, {}, []
        for seed, run in grp.groupby(stats.SEED):
            run = run.sort_values("step")
            hit = run.loc[run["accuracy"] >= threshold, "step"]
            per_seed[seed] = float(hit.iat[0]) if len(hit) else NEVER
            trained[seed] = float(run["summary.steps"].iat[0]) if "summary.steps" in run.columns and \
                pd.notna(run["summary.steps"].iat[0]) else float(run["step"].max())
            reasons.append(str(run[STOP].iat[0]) if STOP in run.columns and pd.notna(run[STOP].iat[0]) else "")
        reached = [v for v in per_seed.values() if v != NEVER]
        est = stats.estimate(reached) if len(reached) == len(per_seed) else None
        row = {"panel": panel, "label": label, "threshold": threshold, "n": len(per_seed),
               "mean": est.mean if est else f"{NEVER} for {len(per_seed) - len(reached)} of {len(per_seed)} seeds",
               "interval_method": est.method if est else f"none (a seed never reached {threshold:g})",
               "low": est.low if est else math.nan, "high": est.high if est else math.nan,
               "steps_trained_mean": float(np.mean(list(trained.values()))),
               "stop_reasons": ", ".join(f"{r} x{reasons.count(r)}" for r in dict.fromkeys(reasons) if r),
               "runs_at_max_steps": reasons.count("max_steps"), "lower_bound": "max_steps" in reasons}
        row.update({stats.seed_column(s): v for s, v in per_seed.items()})
        row.update({f"steps_trained_{stats.seed_column(s)[5:]}": v for s, v in trained.items()})
        out.append(row)
    return pd.DataFrame(out)


END_STEP = 3.0  # points between the stop symbols of runs that end at one point
NEAR = 0.02  # ends closer than this (fraction of the steps' range, of accuracy) count as one point


def end_offsets(rows: pd.DataFrame) -> dict:
    """Per run_dir, its stop symbol's shift along x in points: runs ending at the same step and
    accuracy (seeds that stop together, mixers that all reach 1) sit side by side, centred on
    the point, rather than one symbol hidden under the next."""
    ends = rows.sort_values("step").groupby("run_dir", sort=False).tail(1)
    # "one point" as drawn: ends chained within NEAR of the steps' range and of the accuracy axis
    at = np.column_stack([ends["step"] / (ends["step"].max() or 1.0), ends["accuracy"]]).astype(float)
    near = fclusterdata(at, NEAR, criterion="distance", metric="chebyshev", method="single") if len(at) > 1 else np.ones(len(at))
    out = {}
    for _, same in ends.groupby(np.asarray(near), sort=False):
        for k, run_dir in enumerate(same["run_dir"]):
            out[run_dir] = (k - (len(same) - 1) / 2) * END_STEP
    return out


@figure("learning")
def learning_figure(data) -> Figure:
    """Validation accuracy against step per mixer: every seed, the mean, the stops; a panel per task."""
    rows = learning_rows(data)
    panels = list(dict.fromkeys(rows["panel"]))
    groups = family_groups(rows)  # a row of panels per family once the mixers crowd one panel
    fig, axes = new_figure(len(groups), len(panels), panel=(4.6, 3.4 if len(groups) == 1 else 2.6), legend=2.2,
                           sharey=True)
    filled = carried_forward(rows)
    summary = stats.summarize(filled, ["panel", "label", "step"], "accuracy")
    styles = {}
    for ax, (family, shown), panel in zip(axes, [g for g in groups for _ in panels], panels * len(groups)):
        part = rows[rows["panel"] == panel]
        colors, _ = label_styles(part)
        styles.update(colors)
        labels = [lab for lab in label_order(part) if lab in shown]
        beside = end_offsets(part[part["label"].isin(labels)])
        for label in labels:
            color = colors[label]
            for run_dir, run in part[part["label"] == label].groupby("run_dir"):
                run = run.sort_values("step")
                ax.plot(run["step"], run["accuracy"], color=color, lw=0.6, alpha=0.45)
                reason = run[STOP].iat[0] if STOP in run.columns else None
                ax.plot(run["step"].iat[-1], run["accuracy"].iat[-1], ls="", color=color, ms=5,
                        marker=STOP_MARKERS.get(reason, "."),
                        transform=offset_copy(ax.transData, fig=fig, x=beside[run_dir], units="points"))
            mean = summary[(summary["panel"] == panel) & (summary["label"] == label)].sort_values("step")
            ax.plot(mean["step"], mean["mean"], color=color, lw=1.8, label=label)
            band = mean[np.isfinite(mean["low"].astype(float))]
            if len(band):
                ax.fill_between(band["step"], band["low"].astype(float), band["high"].astype(float), color=color,
                                alpha=0.15, linewidth=0)
        ax.axhline(THRESHOLD, color="0.5", lw=0.8, ls=":")
        ax.set(ylim=(-0.02, 1.02), xlabel="training step (steps)", ylabel="validation accuracy (fraction)",
               title=panel + (f"\n{family} family" if family else ""))
    styles = {lab: styles[lab] for lab in label_order(rows) if lab in styles}
    stops = {f"stopped: {reason}": Line2D([], [], ls="", marker=m, color="0.3") for reason, m in STOP_MARKERS.items()}
    extra = {f"{THRESHOLD:g} (learning_steps.csv)": Line2D([], [], color="0.5", ls=":"), **stops}
    legend_outside(fig, None, mixer_handles(styles, "") + list(extra.values()), list(styles) + list(extra))
    caption(fig, "Learning curves: validation accuracy against step", summary, legend=2.2,
            extra="thin lines: each seed, ending where it stopped; thick: the mean over seeds, a stopped "
                  "seed's last value carried forward; band: the interval where n >= 5")
    fig.tables = {"learning_steps": steps_to(rows)}
    return fig
