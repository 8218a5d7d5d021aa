"""The recall-versus-state-size frontier (figure 10; the figure of Based and Zoology).

Runs are trained on a mixture of (seq_len, pairs) settings (config.task.mixture) and tested on
settings up to larger ones. x: the elements of state one layer keeps to decode the next token
(summary.state_elements_per_layer, Zoology's and Based's convention: per layer, every head):
the recurrent state of the linear families, the KV cache at the evaluation length for softmax
(and a sliding window's cache for swa); the top axis gives the same in bytes (float32). Left:
accuracy averaged over the test settings; right: at the largest test setting. Each point is
one setting (width, and the q/k width where the sweep varies it) at the learning rate chosen on
the validation split: each seed a dot, the mean a marker, an interval only from five seeds
(analysis.stats); a mixer's points are joined in order of state size, so its frontier reads
left to right. The table beside it (`frontier.csv`) gives each point's parameter count;
`frontier_ranking.csv` says which mixer is above which at each setting only where the
intervals separate.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from analysis import stats
from analysis.plots import FigureSpec
from analysis.plots.common import (LR, caption, draw_estimates, figure, label_styles, labelled, legend_outside,
                                   mixer_handles, new_figure, note, ranking_stops, require, select_on_validation,
                                   setting_values, table, with_stops)
from analysis.plots.labels import natural_key
from harness.devices import format_bytes

# What this module's figures need (analysis.plots.figures finds it; nothing else lists them).
FIGURES = (
    FigureSpec("frontier", "frontier", "frontier_figure", notebook="nb_frontier",
               tables=("frontier", "frontier_ranking", "frontier_largest"),
               synthetic="analysis.synthetic.frontier.frontier_runs"),
)

WIDTH, QK, LAYERS = "config.model.d_model", "config.model.qk_dim", "config.model.n_layers"
MIXTURE = "config.task.mixture"
BYTES_PER_ELEMENT = 4  # float32, as summary.state_bytes counts
STATE = "state_elements_per_layer"


def frontier_points(data: pd.DataFrame) -> pd.DataFrame:
    """One row per run: summary.accuracy, state elements (and bytes) per layer, parameters, and a
    label of its setting; labelled by mixer with the sizes (width, q/k width) left out of it."""
    runs = table(data, "runs", primary=True)
    if "task" in runs.columns:
        runs = runs[runs["task"] == "recall"]
    if "summary.state_elements_per_layer" in runs.columns:
        per_layer = runs["summary.state_elements_per_layer"]
    elif {"summary.state_bytes", LAYERS} <= set(runs.columns):
        per_layer = runs["summary.state_bytes"] / runs[LAYERS] / BYTES_PER_ELEMENT
    else:
        per_layer = pd.Series(float("nan"), index=runs.index)
    runs = runs.assign(**{STATE: per_layer, "state_bytes_per_layer": per_layer * BYTES_PER_ELEMENT})
    runs = require(runs, ["model", "summary.accuracy", STATE],
                   "recall accuracy with the state size per layer (summary.state_elements_per_layer)")
    runs = labelled(runs, exclude=(WIDTH, QK)).assign(setting=[_label(run) for _, run in runs.iterrows()])
    if LR in runs.columns and runs[LR].nunique() > 1:  # the learning rate chosen per point
        runs, _ = select_on_validation(runs, ["label", "setting"], test="summary.accuracy",
                                       val="summary.val_accuracy")
    return runs


def largest_setting(data: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """The settings rows of ``runs`` at the largest test setting (longest, then most pairs)."""
    settings = table(data, "settings")
    if not {"run_dir", "name", "accuracy"} <= set(settings.columns):
        return pd.DataFrame()
    settings = settings[settings["run_dir"].isin(set(runs["run_dir"]))]
    if settings.empty:
        return settings
    fields = [setting_values(n) for n in settings["name"]]
    size = [(f.get("seq_len", s), f.get("num_pairs", 0)) for f, s in zip(fields, settings.get("seq_len", 0))]
    settings = settings.assign(_size=size)
    top = max(size)
    keep = settings[settings["_size"] == top].drop(columns="_size")
    cols = ["run_dir", "label", "setting", STATE]
    return keep.drop(columns=[c for c in cols[1:] if c in keep.columns]).merge(runs[cols], on="run_dir")


def frontier_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per mixer and setting: state elements and bytes per layer, parameters, and the mean test
    accuracy's n, mean, interval and seeds."""
    by = ["label", "setting", STATE]
    summary = with_stops(stats.summarize(runs, by, "summary.accuracy"), runs, by)
    sizes = runs.groupby(["label", "setting"], as_index=False).agg(
        state_bytes_per_layer=("state_bytes_per_layer", "median"),
        params=("summary.params", "median") if "summary.params" in runs.columns else (STATE, lambda v: np.nan))
    out = summary.merge(sizes, on=["label", "setting"], how="left")
    first = ["label", "setting", STATE, "state_bytes_per_layer", "params"]
    return out[first + [c for c in out.columns if c not in first]]


def _label(run: pd.Series) -> str:
    parts = []
    if pd.notna(run.get(WIDTH)):
        parts.append(f"d{int(run[WIDTH])}")
    if pd.notna(run.get(QK)):
        parts.append(f"qk{int(run[QK])}")
    return " ".join(parts)


def _bytes(value: float, _pos=None) -> str:
    return format_bytes(value)


def _mixture(runs: pd.DataFrame) -> str:
    if MIXTURE not in runs.columns or runs[MIXTURE].dropna().empty:
        return ""
    mix = runs[MIXTURE].dropna().iat[0]  # entries (seq_len, pairs[, weight])
    return ("trained on the mixture " + ", ".join(f"({int(t)}, {int(n)}) x{e[0] if e else 1}" for t, n, *e in mix)
            + " ((seq_len, pairs) x weight)")


def _draw(ax, summary: pd.DataFrame, colors: dict, markers: dict, title: str) -> None:
    draw_estimates(ax, summary, STATE, colors, markers, log_x=True, spread=0.03)
    # a label at each point piles up where mixers share a state size: one note names the settings
    settings = sorted(summary["setting"].dropna().astype(str).unique(), key=natural_key)
    if len(settings) > 1:
        note(ax, "a mixer's points, joined left to right: " + ", ".join(settings), loc="lower right")
    ax.set_xscale("log", base=2)
    ax.set(ylim=(-0.02, 1.05), xlabel="state per layer (elements; softmax, swa: KV cache at the length)",
           ylabel="MQAR recall accuracy (fraction)", title=title)
    top = ax.secondary_xaxis("top", functions=(lambda e: e * BYTES_PER_ELEMENT, lambda b: b / BYTES_PER_ELEMENT))
    top.xaxis.set_major_locator(LogLocator(base=4))  # whole KB and MB: 1, 4, 16, 64 ...
    top.xaxis.set_major_formatter(FuncFormatter(_bytes))
    top.xaxis.set_minor_formatter(NullFormatter())
    top.set_xlabel("state per layer (bytes, float32)", fontsize="small")


@figure("frontier")
def frontier_figure(data) -> Figure:
    """Accuracy against state elements per layer (bytes on top), mean over the test settings and
    at the largest one; a line per mixer, points labelled by setting."""
    pts = frontier_points(data)
    colors, markers = label_styles(pts)
    fig, (mean_ax, top_ax) = new_figure(1, 2, panel=(5.0, 4.0), legend=1.8)
    summary = frontier_table(pts)
    _draw(mean_ax, summary, colors, markers, "mean over the test settings")
    largest = largest_setting(data, pts)
    top_summary = pd.DataFrame()
    if largest.empty:
        note(top_ax, "no settings rows (accuracy per test setting)")
        top_ax.set(xlabel="state per layer (elements)", ylabel="MQAR recall accuracy (fraction)")
    else:
        count = "count" if "count" in largest.columns and largest["count"].notna().all() else None
        by = ["label", "setting", STATE]
        top_summary = with_stops(stats.summarize(largest, by, "accuracy", count=count), largest, by)
        _draw(top_ax, top_summary, colors, markers, f"at the largest test setting, {largest['name'].iat[0]}")
    legend_outside(fig, None, mixer_handles(colors, markers), list(colors))
    caption(fig, "Recall against state size", summary, top_summary, legend=1.8,
            extra=_mixture(pts) or "each run's own training setting")
    fig.tables = {"frontier": summary,
                  "frontier_ranking": ranking_stops(stats.ranking(summary, within=["setting"]), summary, ["setting"]),
                  "frontier_largest": top_summary.assign(test_setting=largest["name"].iat[0]) if len(top_summary) else top_summary}
    return fig
