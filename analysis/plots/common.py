"""What every figure function shares: picking a table out of the results, skipping a figure
whose data is absent (a printed warning, never an exception), one look for all figures, the
learning rate chosen on validation (flagged at the grid's edge), each run under its label
(analysis.plots.labels) in its mixer's colour, and each point drawn the one way the figures
draw it: every seed a dot, the mean, the interval of analysis.stats only from five seeds, and
a caption that says n and the method.

Figures are built on ``matplotlib.figure.Figure`` directly, never through pyplot, so they
draw the same under Agg, in a notebook, or in a test, and nothing holds them open.
"""
from __future__ import annotations

import functools
import os
import sys
import textwrap

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

from analysis import stats
from analysis.loader import NoResultsError, load_all
from analysis.plots.labels import label_runs, natural_key, shades
from analysis.plots.palette import FAMILY_SWATCHES, MARKERS, family_of, mixer_colors, mixer_markers, reading_order

SEED, LR, WIDTH = "config.seed", "config.trainer.lr", "config.model.d_model"
LR_EXTENDED = "lr_extended"  # a run whose rate the sweep added past its grid's edge
# where a run may carry that flag: a top-level field of results.json, or its summary or config
_LR_EXTENDED_COLUMNS = (LR_EXTENDED, f"summary.{LR_EXTENDED}", f"config.trainer.{LR_EXTENDED}")

class MissingData(Exception):
    """A figure's data is absent: the figure is skipped rather than drawn half empty."""


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


FORMATS = ("png", "pdf")


def save_figure(fig, out_dir, name: str) -> list:
    """Write ``fig`` as ``out_dir/name.png`` and ``out_dir/name.pdf``, and each table the
    figure carries (``fig.tables``: every learning rate's result, fitted numbers) as
    ``out_dir/<table>.csv`` beside it.

    Each file is drawn in memory, then written as a run writes its files (harness.outputs.results:
    a temporary file renamed into place), so a command killed at any moment leaves each file
    complete, the previous one or the new one, and a full disk is one OutputError naming the
    file, with no temporary file left (matplotlib writing straight to a file that cannot grow
    raises a second error from its own clean-up, and leaves the partial file)."""
    import io
    from pathlib import Path

    from harness.outputs.atomic import write_bytes, write_text

    out_dir = Path(out_dir)
    paths = []
    for fmt in FORMATS:
        drawn = io.BytesIO()
        fig.savefig(drawn, format=fmt, dpi=150, bbox_inches="tight")
        paths.append(out_dir / f"{name}.{fmt}")
        write_bytes(paths[-1], drawn.getvalue())
    for table_name, frame in getattr(fig, "tables", {}).items():
        if frame is not None and len(frame):
            paths.append(out_dir / f"{table_name}.csv")
            write_text(paths[-1], frame.to_csv(index=False))
    return paths


def figure(name: str):
    """Decorate a figure function: results paths are loaded, missing data skips with a warning.

    The decorated function takes a long frame (``load_all``), one table's frame, or a results
    path as its first argument and returns a Figure, or None when its data is absent.
    """

    def decorate(draw):
        @functools.wraps(draw)
        def wrapper(*args, **kwargs):
            try:
                if args and isinstance(args[0], (str, os.PathLike)):
                    args = (_load(args[0]),) + args[1:]
                if args and isinstance(args[0], pd.DataFrame):
                    _report_failed(name, args[0])
                with sns.axes_style("whitegrid"), sns.plotting_context("paper"):
                    return draw(*args, **kwargs)
            except MissingData as err:
                warn(f"figure {name} skipped: {err}")
                return None

        return wrapper

    return decorate


def table(data: pd.DataFrame | None, name: str, *, primary: bool = False) -> pd.DataFrame:
    """Rows of table ``name`` from finished runs.

    ``data`` is a long frame with a ``table`` column (``load_all``); a frame without that
    column is taken to be the figure's ``primary`` table itself and holds no other table.
    """
    if data is None:
        raise MissingData("no results")
    if "table" in data.columns:
        rows = data[data["table"] == name].drop(columns="table").dropna(axis=1, how="all")
    elif primary:
        rows = data
    else:
        return pd.DataFrame()
    if "status" in rows.columns:
        rows = rows[rows["status"] == "ok"]
    return rows.reset_index(drop=True).copy()  # consolidated: figures add columns to it one at a time


def require(frame: pd.DataFrame, columns: list[str], what: str) -> pd.DataFrame:
    """The rows of ``frame`` that have every column in ``columns``; MissingData if none."""
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise MissingData(f"no {what} (missing column(s): {', '.join(missing)})")
    rows = frame.dropna(subset=columns)
    if rows.empty:
        raise MissingData(f"no {what}")
    return rows.reset_index(drop=True)


def setting_values(name) -> dict:
    """The fields of an evaluation setting's name ("seq_len=1024,num_pairs=8": {"seq_len": 1024,
    "num_pairs": 8}; harness.train.loop.setting_names writes them), numbers as numbers."""
    out = {}
    for part in str(name).split(","):
        key, sep, value = part.partition("=")
        if not sep:
            continue
        try:
            number = float(value)
            out[key.strip()] = int(number) if number.is_integer() else number
        except ValueError:
            out[key.strip()] = value
    return out


def retrieval_heads(rows: pd.DataFrame) -> pd.DataFrame:
    """Heads-table rows of each run's retrieval head (summary.retrieval_layer / _head), the
    head whose sharpness and SNR the run reports; every row of a run that names none.
    Averaging every head would mix in heads that do other work (previous-token heads)."""
    layer, head = "summary.retrieval_layer", "summary.retrieval_head"
    if not {"layer", "head", layer, head} <= set(rows.columns):
        return rows
    chosen = (rows["layer"] == rows[layer]) & (rows["head"] == rows[head])
    unnamed = rows[layer].isna() | rows[head].isna()
    return rows[chosen | unnamed]


STOP = "summary.stop_reason"  # why a run ended: plateau | target | max_steps (harness.train)


def with_stop_flags(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with ``lower_bound``: the run ended at trainer.max_steps (summary.stop_reason), not
    on its validation plateau or target, so its accuracy is a lower bound on what it reaches."""
    return rows.assign(lower_bound=rows[STOP].eq("max_steps") if STOP in rows.columns else False)


def mark_lower_bounds(points: pd.DataFrame, rows: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """``points`` (stats.summarize of ``rows`` by ``by``) with runs_at_max_steps (seeds of the
    point that ended at max_steps) and lower_bound (any did: the mean is a lower bound)."""
    if points.empty:
        return points.assign(runs_at_max_steps=pd.Series(dtype=int), lower_bound=pd.Series(dtype=bool))
    runs = rows.drop_duplicates(["run_dir", *by]) if "run_dir" in rows.columns else rows
    keys = runs[by].astype(object).where(runs[by].notna(), "<na>")
    at_max = runs.assign(**{k: keys[k] for k in by}).groupby(by)["lower_bound"].sum()
    index = pd.MultiIndex.from_frame(points[by].astype(object).where(points[by].notna(), "<na>")) \
        if len(by) > 1 else points[by[0]].astype(object).where(points[by[0]].notna(), "<na>")
    counts = at_max.reindex(index).fillna(0).astype(int).to_numpy()
    return points.assign(runs_at_max_steps=counts, lower_bound=counts > 0)


def with_stops(points: pd.DataFrame, rows: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """``points`` (stats.summarize of ``rows`` by ``by``) with runs_at_max_steps and lower_bound
    (mark_lower_bounds), the stop of each run read from ``rows``' summary.stop_reason."""
    return mark_lower_bounds(points, rows if "lower_bound" in rows.columns else with_stop_flags(rows), by)


def ranking_stops(ranking: pd.DataFrame, points: pd.DataFrame, within: list[str] | None = None,
                  label: str = "label") -> pd.DataFrame:
    """A stats.ranking table with, per pair, the runs of its two points that ended at max_steps
    (runs_at_max_steps, a's and b's together) and lower_bound (either point is a lower bound:
    the pair's order may yet change)."""
    if ranking.empty or "runs_at_max_steps" not in points.columns:
        return ranking
    keys = list(within or [])
    flags = points[keys + [label, "runs_at_max_steps"]].drop_duplicates(keys + [label])
    out = ranking
    for side in ("a", "b"):
        out = out.merge(flags.rename(columns={label: side, "runs_at_max_steps": f"_{side}"}), on=keys + [side],
                        how="left")
    counts = out["_a"].fillna(0).astype(int) + out["_b"].fillna(0).astype(int)
    return out.drop(columns=["_a", "_b"]).assign(runs_at_max_steps=counts, lower_bound=counts > 0)


def select_on_validation(rows: pd.DataFrame, point: list[str], *, test: str = "accuracy",
                         val: str = "val_accuracy", count: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per point, the rows (every seed) of the learning rate with the best mean validation score.

    rows: one row per run (or per run and slice) with the ``point`` columns, the learning rate
    (config.trainer.lr), ``test`` and ``val``. The learning rate is chosen on ``val`` averaged
    over seeds, never on the reported ``test``; results without a validation column (written
    before the split existed) are chosen on ``test``, and the table says so.

    Returns (selected rows, per-lr table). The table has one row per point and learning rate:
    the mean validation score, the test score's n, mean, seeds and interval (analysis.stats,
    pooled by ``count`` where given), ``chosen``, ``lr_at_edge`` (the chosen rate is the
    lowest or highest the point tried, so the optimum may lie beyond it; always so with one
    rate) and ``lr_extended`` (a rate the sweep added past its grid).
    """
    rows = rows.copy()
    if LR not in rows.columns:
        rows[LR] = np.nan
    chosen_on = val if val in rows.columns and rows[val].notna().any() else test
    keys = list(point) + [LR]
    table = (rows.groupby(keys, dropna=False)
             .agg(val_score=(chosen_on, "mean"), test_score=(test, "mean"), runs=(test, "size"))
             .reset_index())
    # a point no validation batch covers (a test setting longer than the training length)
    # is chosen on test, and its rows say so
    unvalidated = table.groupby(list(point), dropna=False)["val_score"].transform(lambda v: v.isna().all())
    score = table["val_score"].where(~unvalidated, table["test_score"])
    best = table.loc[score.groupby([table[c] for c in point], dropna=False).idxmax(), keys]
    table["chosen"] = table.set_index(keys).index.isin(best.set_index(keys).index)
    table["selected_on"] = np.where(unvalidated | (chosen_on != val), "test (no validation split)", "validation")
    by_point = table.groupby(list(point), dropna=False)[LR]
    lowest, highest = by_point.transform("min"), by_point.transform("max")
    table["lr_at_edge"] = table["chosen"] & ((table[LR] == lowest) | (table[LR] == highest) | table[LR].isna())
    flag = next((c for c in _LR_EXTENDED_COLUMNS if c in rows.columns), None)
    if flag is not None:
        extended = rows.groupby(keys, dropna=False)[flag].agg(lambda v: bool(v.fillna(False).astype(bool).any()))
        table = table.merge(extended.rename(LR_EXTENDED).reset_index(), on=keys, how="left")
    else:
        table[LR_EXTENDED] = False
    # the test score is an accuracy: its interval is cut to what one can be
    seeds = stats.summarize(rows, keys, test, count=count, bounds=(0.0, 1.0))
    table = table.merge(seeds, on=keys, how="left")
    if STOP in rows.columns:  # each rate's runs that ended at max_steps
        table = with_stops(table, rows, keys)
    picked = rows.merge(best, on=keys, how="inner")
    return picked.reset_index(drop=True), table


def lr_heatmap(ax, table: pd.DataFrame, columns: list[str], order: list[str], *, title: str,
               row: str = "label", chosen_before: str | None = None) -> None:
    """Mean validation score per mixer (rows: ``row``, the run label) and learning rate (columns,
    with ``columns`` before it). Where a setting tried more than one rate, the chosen one is
    outlined in red, dashed with ▸ where it sits at the edge of the rates tried (lr_at_edge);
    a setting with one rate chose nothing here and has no outline (``chosen_before``: what chose
    that one rate before the sweep, said in the title). Every learning rate's result kept."""
    row = row if row in table.columns else "model"
    cols = [c for c in columns if c in table.columns] + [LR]
    grid = table.groupby([row] + cols, dropna=False)["val_score"].mean().unstack(cols)
    grid = grid.reindex([m for m in order if m in grid.index])
    labels = [", ".join(_short(c, v) for c, v in zip(cols, key if isinstance(key, tuple) else (key,)))
              for key in grid.columns]
    small = "xx-small" if grid.shape[0] > 8 or grid.shape[1] > 8 else "x-small"
    sns.heatmap(grid, annot=True, fmt=".2f", vmin=0, vmax=1, cmap="viridis", cbar=False,
                annot_kws={"fontsize": small}, xticklabels=labels, ax=ax)
    share = table.groupby([row] + cols, dropna=False)["chosen"].mean().unstack(cols)
    share = share.reindex(grid.index)[grid.columns]
    edge = table.groupby([row] + cols, dropna=False)["lr_at_edge"].any().unstack(cols) \
        if "lr_at_edge" in table.columns else share * 0
    edge = edge.reindex(grid.index)[grid.columns].fillna(False)
    rates = table.groupby([row] + cols[:-1], dropna=False)[LR].nunique() if cols[:-1] else \
        table.groupby(row, dropna=False)[LR].nunique()
    tried = [[_rates_tried(rates, name, key, len(cols) - 1) for key in grid.columns] for name in grid.index]
    for i in range(share.shape[0]):
        for j in range(share.shape[1]):
            if share.iat[i, j] > 0 and tried[i][j] > 1:  # chosen among rates (for some points in this cell)
                ax.add_patch(Rectangle((j + 0.04, i + 0.06), 0.92, 0.88, fill=False, edgecolor="red",
                                       lw=0.6 + 1.6 * share.iat[i, j], ls="--" if edge.iat[i, j] else "-"))
                if edge.iat[i, j]:
                    ax.plot(j + 0.85, i + 0.2, marker=">", color="red", ms=3.5)
    on = table["selected_on"].iat[0] if "selected_on" in table.columns and len(table) else "validation"
    chose = any(t > 1 for r in tried for t in r)
    legend = ("red: chosen, dashed with ▸: at the grid's edge" if chose
              else f"one rate per setting, chosen by {chosen_before}" if chosen_before
              else "one rate per setting: none chosen")
    ax.set(xlabel="learning rate (per setting)", ylabel="mixer (run label)",
           title=f"{title}\n(mean {on.split()[0][:3]}. accuracy;\n{legend})")
    ax.tick_params(axis="x", labelrotation=90, labelsize=small)
    ax.tick_params(axis="y", labelrotation=0, labelsize=small)


def _rates_tried(rates: pd.Series, name, key, depth: int) -> int:
    """How many rates the setting of heatmap cell (``name``, ``key``) tried."""
    key = key if isinstance(key, tuple) else (key,)
    at = (name, *key[:depth]) if depth else name
    try:
        return int(rates.loc[at])
    except KeyError:
        return 0


def _short(column: str, value) -> str:
    name = {LR: "lr", WIDTH: "d"}.get(column, column.split(".")[-1])
    return f"{name} {value:g}" if isinstance(value, (int, float, np.number)) else f"{name} {value}"


def mixer_order(names) -> list[str]:
    """Mixers in the project's reading order (softmax first), unknown names after, sorted."""
    names = set(pd.Series(list(names)).dropna().astype(str))
    known = [m for m in reading_order() if m in names]
    return known + sorted(names - set(known))


def palette(names, declared=None) -> dict[str, tuple]:
    """Colour per mixer name, in reading order (analysis.plots.palette: one colour per mixer in
    every figure); ``declared``: {outside mixer: the family its runs report}."""
    colors = mixer_colors(names, declared)
    return {n: colors[n] for n in mixer_order(names)}


def declared_families(rows: pd.DataFrame) -> dict[str, str]:
    """{mixer: the family its runs report (summary.family)}, for mixers the harness does not know."""
    column = next((c for c in ("summary.family", "family") if c in rows.columns), None)
    if column is None or "model" not in rows.columns:
        return {}
    pairs = rows[["model", column]].dropna().drop_duplicates("model")
    return dict(zip(pairs["model"].astype(str), pairs[column].astype(str)))


# --- run labels: a mixer and its variants --------------------------------------------------

def labelled(rows: pd.DataFrame, exclude=(WIDTH,)) -> pd.DataFrame:
    """``rows`` with the run label (analysis.plots.labels) in a ``label`` column."""
    return label_runs(rows, exclude)


def label_order(rows: pd.DataFrame) -> list[str]:
    """Labels in the mixers' reading order, a mixer's variants by their option values."""
    pairs = rows[["model", "label"]].dropna().drop_duplicates()
    rank = {m: i for i, m in enumerate(mixer_order(pairs["model"]))}
    ordered = sorted(zip(pairs["model"], pairs["label"]), key=lambda ml: (rank[ml[0]], natural_key(ml[1])))
    return list(dict.fromkeys(label for _, label in ordered))


def label_styles(rows: pd.DataFrame) -> tuple[dict[str, tuple], dict[str, str]]:
    """(colour, marker) per label: a mixer's colour and marker (analysis.plots.palette) for its
    runs, its variants in shades of that colour with the markers after its own, so that "dpfp
    ν=1" and "dpfp ν=3" read as one family and apart."""
    order = label_order(rows)
    base = palette(rows["model"].dropna(), declared_families(rows))
    shapes = mixer_markers(base)
    model_of = dict(zip(rows["label"], rows["model"]))
    colors, markers = {}, {}
    for model in base:
        own = [lab for lab in order if model_of.get(lab) == model]
        first = MARKERS.index(shapes[model])
        for k, (lab, color) in enumerate(zip(own, shades(base[model], len(own)))):
            colors[lab], markers[lab] = color, MARKERS[(first + k) % len(MARKERS)]
    return {lab: colors[lab] for lab in order}, {lab: markers[lab] for lab in order}


SMALL_MULTIPLES = 6  # curves one panel carries; past it, a panel per family of mixers


def family_groups(rows: pd.DataFrame) -> list[tuple[str, list[str]]]:
    """[(family, its labels in reading order)]: the labels of ``rows`` split by their mixer's
    family (softmax, linear, decay, delta, then others) when more than SMALL_MULTIPLES share
    the axes, so that a dashed line can be matched to its mixer; else one group ("", all)."""
    order = label_order(rows)
    if len(order) <= SMALL_MULTIPLES:
        return [("", order)]
    declared = declared_families(rows)
    model_of = dict(zip(rows["label"], rows["model"]))
    family = {lab: family_of(model_of[lab], declared) for lab in order}
    known = [f for f in FAMILY_SWATCHES if f in family.values()]
    return [(f, [lab for lab in order if family[lab] == f]) for f in known + sorted(set(family.values()) - set(known))]


# --- drawing the seeds, the mean and the interval ------------------------------------------

DODGE = 0.012  # each curve's shift along x, as a fraction of the x range drawn (see draw_estimates)


def draw_estimates(ax, summary: pd.DataFrame, x: str, colors: dict, markers: dict | None = None, *,
                   key: str = "label", ls="-", lw: float = 1.4, log_x: bool = False, spread: float = 0.06,
                   connect: bool = True, dodge: float = DODGE) -> None:
    """One line per ``key`` through its points' means (analysis.stats.summarize rows), each
    seed's value as a small dot beside the point, and the interval as error bars only where the
    point has one (n >= MIN_SEEDS). Each ``key`` is shifted along x by its own small step (``dodge``,
    a fraction of the x range; on a log axis, of its decades), so that mixers scoring alike at one
    point sit side by side rather than one hidden under the other."""
    markers = markers or {}
    drawn = [lab for lab in colors if (summary[key] == lab).any()]
    for k, lab in enumerate(drawn):
        grp = summary[summary[key] == lab].sort_values(x)
        color, marker = colors[lab], markers.get(lab, "o")
        xs = _dodged(grp[x].to_numpy(float), summary[x].to_numpy(float), (k - (len(drawn) - 1) / 2) * dodge, log_x)
        seeds = grp[[c for c in grp.columns if str(c).startswith("seed_")]].to_numpy(float)  # (points, seeds)
        if seeds.size:
            offsets = np.linspace(-spread, spread, seeds.shape[1]) if seeds.shape[1] > 1 else np.zeros(1)
            at = xs[:, None] * np.exp(offsets) if log_x else xs[:, None] + offsets * (np.ptp(xs) or 1.0)
            keep = np.isfinite(seeds)
            ax.scatter(at[keep], seeds[keep], s=7, color=color, alpha=0.45, marker=marker, linewidths=0, zorder=2)
        ax.plot(xs, grp["mean"], color=color, marker=marker, ms=4, lw=lw if connect else 0,
                ls=ls if connect else "", label=lab, zorder=3)
        have = np.isfinite(grp["low"].astype(float)).to_numpy()
        if have.any():
            mean, low, high = (grp[c].to_numpy(float)[have] for c in ("mean", "low", "high"))
            ax.errorbar(xs[have], mean, yerr=yerr(mean, low, high),
                        fmt="none", ecolor=color, elinewidth=1.0, capsize=2.5, zorder=3)


def yerr(mean, low, high) -> np.ndarray:
    """errorbar's (2, n) distances below and above the mean, never negative: an interval cut to
    [0, 1] can sit a rounding error inside a mean of exactly 1 (1 - 1.1e-16), which matplotlib
    refuses."""
    mean, low, high = (np.atleast_1d(np.asarray(v, float)) for v in (mean, low, high))
    return np.maximum(np.stack([mean - low, high - mean]), 0.0)


def _dodged(xs: np.ndarray, every: np.ndarray, step: float, log_x: bool) -> np.ndarray:
    """``xs`` shifted by ``step`` of the range of ``every`` (in log space on a log axis)."""
    every = every[np.isfinite(every) & ((every > 0) if log_x else True)]
    if not step or every.size == 0:
        return xs
    if log_x:
        return xs * np.exp(step * (np.ptp(np.log(every)) or 1.0))
    return xs + step * (np.ptp(every) or 1.0)


def draw_bars(ax, summary: pd.DataFrame, order: list[str], colors: dict, *, key: str = "label",
              offset: float = 0.0, width: float = 0.8, color_of=None, label: str | None = None) -> None:
    """A bar per ``key`` at its mean, each seed as a dot on it, the interval where n >= MIN_SEEDS;
    categories in ``order`` along x (``offset``/``width``: bars side by side for a hue)."""
    rng = np.random.default_rng(0)  # a fixed jitter: the figure redraws identically
    for i, lab in enumerate(order):
        point = summary[summary[key] == lab]
        if point.empty:
            continue
        point = point.iloc[0]
        color = color_of(lab) if color_of else colors[lab]
        ax.bar(i + offset, point["mean"], width=width, color=color, alpha=0.55, edgecolor=color,
               label=label if i == 0 else None)
        values = stats.seed_values(point)
        ax.scatter(i + offset + rng.uniform(-width / 4, width / 4, values.size), values, s=9,
                   color=colors[lab] if not color_of else "0.15", zorder=3, linewidths=0)
        if np.isfinite(point["low"]):
            ax.errorbar(i + offset, point["mean"], yerr=yerr(point["mean"], point["low"], point["high"]),
                        fmt="none", ecolor="0.1", elinewidth=1.0, capsize=3, zorder=4)
    # upright names run into each other past a few mixers: vertical ones never do
    ax.set_xticks(range(len(order)), order, rotation=90 if len(order) > 4 else 0,
                  fontsize="x-small" if len(order) > 8 else None)


def caption(fig: Figure, title: str, *summaries: pd.DataFrame, extra: str = "", legend: float = 2.6) -> str:
    """Set the figure's title, left-aligned, with the lines that say what its points are: n per
    point and the interval's method (analysis.stats.caption), then ``extra`` (what each axis is
    computed from); returns them (also ``fig.caption``). ``legend``: the inches on the right
    the figure legend takes, which the text stays clear of."""
    _wrap_ylabels(fig)
    parts = [s for s in summaries if s is not None and len(s)]
    line = stats.caption(pd.concat(parts, ignore_index=True) if parts else None)
    text = f"{line}. {extra[:1].upper()}{extra[1:]}" if extra else line
    _set_caption(fig, title, text, legend)
    return text


def _set_caption(fig: Figure, title: str, text: str, legend: float) -> None:
    width = max(50, int(12 * (fig.get_figwidth() - legend)))  # characters of 'small' text per line
    fig.suptitle("\n".join([*textwrap.wrap(title, width), *textwrap.wrap(text, width)]), x=0.01, ha="left",
                 fontsize="small")
    fig.caption, fig.caption_parts = text, (title, legend)


def extend_caption(fig: Figure, sentence: str) -> str:
    """Add ``sentence`` to a figure's caption (one set by :func:`caption`), wrapped as the rest:
    what the drawing pipeline knows and the figure function does not (analysis.pipeline: the
    learning-rate window of each mixer of a ranked figure)."""
    title, legend = getattr(fig, "caption_parts", (fig.get_suptitle().split("\n")[0], 2.6))
    text = getattr(fig, "caption", "")
    text = f"{text.rstrip('.')}. {sentence}" if text else sentence
    _set_caption(fig, title, text, legend)
    return text


def _wrap_ylabels(fig: Figure) -> None:
    """Break a y label longer than its panel is tall into lines: a label that overruns the panel
    runs into the caption above it."""
    for ax in fig.axes:
        label = ax.get_ylabel()
        spec = ax.get_subplotspec() if hasattr(ax, "get_subplotspec") else None
        if not label or spec is None:
            continue
        rows = spec.get_gridspec().nrows
        chars = max(12, int(fig.get_figheight() / rows * 8.5))  # characters of axis-label text per panel height
        if len(label) > chars:
            ax.set_ylabel("\n".join(textwrap.wrap(label, chars)))


def new_figure(nrows: int = 1, ncols: int = 1, *, panel=(4.2, 3.2), legend: float = 0.0,
               **subplot_kw):
    """A pyplot-free Figure of ``nrows`` x ``ncols`` panels (inches each) plus ``legend``
    inches on the right for a figure legend; its axes as a flat list."""
    fig = Figure(figsize=(panel[0] * ncols + legend, panel[1] * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **subplot_kw)
    return fig, list(axes.flat)


def log2_axis(ax, values) -> None:
    """Log-2 x axis with the data's own values as plain tick labels (16, 32, 64; not 2^4)."""
    ax.set_xscale("log", base=2)
    ticks = sorted({float(v) for v in values if v > 0})
    if 1 < len(ticks) <= 12:
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.xaxis.set_minor_locator(NullLocator())


def plain_log_axes(ax, which: str = "xy") -> None:
    """Log axes labelled with plain numbers at 1, 2 and 5 per decade (20, 50, 100; not 2 x 10^1)."""
    for name in which:
        axis = ax.xaxis if name == "x" else ax.yaxis
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())


def note(ax, text: str, loc: str = "lower left") -> None:
    """A small grey remark inside the axes (why a curve is missing, where theory came from)."""
    y, x = loc.split()
    ax.text(0.02 if x == "left" else 0.98, 0.03 if y == "lower" else 0.97, text,
            transform=ax.transAxes, ha=x, va="bottom" if y == "lower" else "top",
            fontsize="x-small", color="0.35", wrap=True,
            bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"})


def legend_outside(fig: Figure, ax=None, extra_handles=(), extra_labels=()) -> None:
    """One legend right of the figure, from ``ax``'s entries plus extra ones; it replaces
    the per-axes legends seaborn draws."""
    handles, labels = ax.get_legend_handles_labels() if ax is not None else ([], [])
    for each in fig.axes:
        if each.get_legend() is not None:
            each.get_legend().remove()
    fig.legend(list(handles) + list(extra_handles), list(labels) + list(extra_labels),
               loc="outside right upper", fontsize="small", frameon=False)


def mixer_handles(colors: dict, marker: str | dict = "o") -> list[Line2D]:
    """Legend entries for every mixer (or label) in ``colors``, whether or not a given panel
    shows it; ``marker``: one for all, or one per key (label_styles)."""
    return [Line2D([], [], color=c, marker=marker.get(k, "o") if isinstance(marker, dict) else marker)
            for k, c in colors.items()]


def loglog_slope(x, y) -> float:
    """Least-squares slope of log y on log x (positive finite points); NaN with < 2 distinct x."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    keep = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    if np.unique(x[keep]).size < 2:
        return float("nan")
    return float(np.polyfit(np.log(x[keep]), np.log(y[keep]), 1)[0])


def _load(path) -> pd.DataFrame:
    try:
        return load_all(path)
    except NoResultsError as err:
        raise MissingData(str(err)) from None


def _report_failed(name: str, data: pd.DataFrame) -> None:
    """Say which runs a figure leaves out because they failed, so a missing mixer is explained."""
    if "status" not in data.columns:
        return
    if "table" in data.columns:
        runs = data[data["table"] == "runs"]
    elif "run_dir" in data.columns:
        runs = data.drop_duplicates("run_dir")
    else:
        runs = data
    failed = runs[runs["status"] != "ok"]
    for _, run in failed.iterrows():
        print(f"note: figure {name} leaves out failed run {run.get('run_dir', '?')} "
              f"({run.get('model', '?')}): {run.get('error', '')}", file=sys.stderr)
