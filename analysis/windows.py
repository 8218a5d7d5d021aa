"""Learning-rate windows (Okpekpe & Orvieto 2025): the rates at which a mixer learns, and whether a
ranked figure ran each mixer inside its window.

A mixer's window, at one setting (its model options and depth), is read off its mean accuracy
over seeds against the learning rate: the rates where the mean reaches WINDOW_SHARE of its best
mean, the mean interpolated linearly in log10(rate) between the rates tried, taken around the
best rate (a second stretch above the threshold, apart from the first, is not its window). Its
width is in decades. A window that reaches the lowest or highest rate tried is open there
(``low_open``, ``high_open``): its width is then a lower bound. A mixer whose best mean stays
under LEARNED has learned at no rate and has no window.

The width's interval resamples the seeds (each seed's whole curve over the rates at once, so a
resample keeps a seed's runs together) and recomputes the window: a percentile bootstrap over
seeds (WIDTH_METHOD), only from five seeds (analysis.stats.MIN_SEEDS).

``rate_check`` holds a figure's runs against the windows: per mixer (model, the options the
window sweep varied, depth) and rate, inside, outside, or no window measured.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis import stats

WINDOW_SHARE = 0.9       # the window: rates where the mean reaches this share of the best mean
LEARNED = 0.5            # a best mean under this: the mixer learned at no rate, no window
N_RESAMPLES = 2000
WIDTH_METHOD = f"percentile bootstrap over seeds (whole curves resampled, {N_RESAMPLES} resamples)"
LR, SEED, LAYERS = "config.trainer.lr", "config.seed", "config.model.n_layers"
# the settings a window belongs to beside the mixer's name: what the window sweep varies
KEY_OPTIONS = ("config.model.short_conv", "config.model.rule")


def window(rates, means) -> dict:
    """The window of one mean curve (rates ascending, the mean accuracy at each): best rate and
    mean, the window's edges (rates, interpolated), its width in decades and whether it is open
    at either end; edges NaN where the best mean is under LEARNED."""
    x = np.log10(np.asarray(rates, float))
    m = np.asarray(means, float)
    best = int(np.nanargmax(m))
    out = {"best_lr": float(10 ** x[best]), "best_mean": float(m[best]), "threshold": WINDOW_SHARE * float(m[best]),
           "window_low": math.nan, "window_high": math.nan, "width_decades": math.nan,
           "low_open": False, "high_open": False, "rates_in_window": 0}
    if not m[best] >= LEARNED:
        return out
    tau = out["threshold"]
    low_i, high_i = best, best
    while low_i > 0 and m[low_i - 1] >= tau:
        low_i -= 1
    while high_i < len(m) - 1 and m[high_i + 1] >= tau:
        high_i += 1
    low = x[low_i] if low_i == 0 else _crossing(x[low_i - 1], m[low_i - 1], x[low_i], m[low_i], tau)
    high = x[high_i] if high_i == len(m) - 1 else _crossing(x[high_i], m[high_i], x[high_i + 1], m[high_i + 1], tau)
    out.update(window_low=float(10 ** low), window_high=float(10 ** high), width_decades=float(high - low),
               low_open=low_i == 0, high_open=high_i == len(m) - 1, rates_in_window=high_i - low_i + 1)
    return out


def _crossing(x0: float, m0: float, x1: float, m1: float, tau: float) -> float:
    """Where the line from (x0, m0) to (x1, m1) reaches tau (one side below it, one at or above)."""
    return x0 + (tau - m0) * (x1 - x0) / (m1 - m0) if m1 != m0 else x1


def width_interval(curves: np.ndarray, rates, *, seed: int = stats.RESAMPLE_SEED) -> tuple[float, float]:
    """(low, high) of the window width over resamples of the seeds: ``curves`` is (seeds, rates),
    one seed's accuracy at each rate (NaN: not run). A resample with no learned window counts
    as width 0 (it learned nowhere)."""
    rng = np.random.default_rng(seed)
    n = curves.shape[0]
    widths = np.empty(N_RESAMPLES)
    for i in range(N_RESAMPLES):
        pick = curves[rng.integers(0, n, n)]
        with np.errstate(invalid="ignore"):
            means = np.nanmean(pick, axis=0)
        if np.isnan(means).all():
            widths[i] = math.nan
            continue
        width = window(rates, np.nan_to_num(means, nan=0.0))["width_decades"]
        widths[i] = 0.0 if math.isnan(width) else width
    widths = widths[np.isfinite(widths)]
    alpha = (1 - stats.CONFIDENCE) / 2
    return float(np.quantile(widths, alpha)), float(np.quantile(widths, 1 - alpha))


def setting_columns(rows: pd.DataFrame) -> list[str]:
    """The columns a window is keyed by beside the model: its depth and the options in KEY_OPTIONS
    the rows have."""
    return [c for c in (LAYERS, *KEY_OPTIONS) if c in rows.columns]


def windows_table(rows: pd.DataFrame, value: str = "summary.accuracy", label: str = "label") -> pd.DataFrame:
    """One row per mixer (``label``) and setting: its window (``window``), the seeds, the width's
    interval where there are at least five seeds, runs at max_steps among its runs."""
    keys = [label, "model", *setting_columns(rows)]
    out = []
    for key, grp in rows.groupby(keys, dropna=False, sort=True):
        curves = grp.pivot_table(index=SEED, columns=LR, values=value, aggfunc="mean")
        rates = curves.columns.to_numpy(float)
        means = curves.mean(axis=0).to_numpy(float)
        row = dict(zip(keys, key))
        row.update(window(rates, means))
        n = int(curves.notna().all(axis=1).sum())
        row.update(n_seeds=n, rates=len(rates), lowest_lr=float(rates.min()), highest_lr=float(rates.max()),
                   width_low=math.nan, width_high=math.nan, interval_method=stats.NO_INTERVAL)
        if n >= stats.MIN_SEEDS and row["best_mean"] >= LEARNED:
            row["width_low"], row["width_high"] = width_interval(curves.to_numpy(float), rates)
            row["interval_method"] = WIDTH_METHOD
        if "lower_bound" in grp.columns:
            row["runs_at_max_steps"] = int(grp["lower_bound"].sum())
            row["lower_bound"] = bool(grp["lower_bound"].any())
        row["measured_at"] = measured_at(grp.iloc[0])
        out.append(row)
    return pd.DataFrame(out)


def measured_at(run: pd.Series) -> str:
    """The setting a window was measured at, in words ("recall, seq_len 64, 8 pairs, d_model 64"):
    a figure that holds another task's rates against it says where it came from."""
    parts = [str(run["task"])] if pd.notna(run.get("task")) else []
    for column, unit in (("config.task.seq_len", "seq_len {}"), ("config.task.num_pairs", "{} pairs"),
                         ("config.model.d_model", "d_model {}")):
        if pd.notna(run.get(column)):
            parts.append(unit.format(int(run[column])))
    return ", ".join(parts)


def trained_runs(data: pd.DataFrame) -> pd.DataFrame:
    """The finished training runs of a long results frame (analysis.loader.load_all), one row each."""
    from analysis.plots.common import table

    runs = table(data, "runs", primary=True)
    return runs[runs["mode"] == "train"].reset_index(drop=True) if "mode" in runs.columns else runs


def window_runs(data: pd.DataFrame) -> pd.DataFrame:
    """The runs of a window sweep, labelled, with their stop flags (lower_bound)."""
    from analysis.plots.common import WIDTH, labelled, with_stop_flags

    # depth is a panel of the figure and a key of the window, not a variant of the mixer's name
    return with_stop_flags(labelled(trained_runs(data), exclude=(WIDTH, LAYERS)))


def measured_windows(data: pd.DataFrame) -> pd.DataFrame:
    """The windows of a window sweep's long frame (its lr_window.csv)."""
    return windows_table(window_runs(data))


def rate_check(runs: pd.DataFrame, windows: pd.DataFrame | None, label: str = "label") -> pd.DataFrame:
    """Per mixer of a figure's runs (``label``, its model and setting) and rate: the window of the
    same model and setting in ``windows`` (windows_table) and whether the rate lies in it
    (``in_window``: True, False, or empty where no window was measured or the mixer learned at
    no rate there; ``note`` says which)."""
    keys = [label, "model", *[c for c in setting_columns(runs) if windows is None or c in windows.columns]]
    if LR not in runs.columns:
        return pd.DataFrame()  # runs that record no rate: nothing to hold against a window
    runs = runs.dropna(subset=[LR])
    points = runs.groupby(keys + [LR], dropna=False).size().rename("runs").reset_index()
    match = [k for k in keys if k != label]
    rows = []
    for _, point in points.iterrows():
        found = _window_of(windows, point, match)
        lr = float(point[LR])
        row = {**{k: point[k] for k in keys}, "lr": lr, "runs": int(point["runs"]),
               "window_low": math.nan, "window_high": math.nan, "in_window": None}
        if found is None:
            row["note"] = "no window measured for this mixer and setting"
        elif not found["best_mean"] >= LEARNED:
            row["note"] = f"learned at no rate tried (best mean {found['best_mean']:.2f})"
        else:
            low, high = found["window_low"], found["window_high"]
            inside = bool(low * (1 - 1e-9) <= lr <= high * (1 + 1e-9))
            row.update(window_low=low, window_high=high, in_window=inside, measured_at=found.get("measured_at"),
                       note="inside" if inside else ("below" if lr < low else "above") + " its window")
            if inside and ((found["low_open"] and lr <= low) or (found["high_open"] and lr >= high)):
                row["note"] = "inside, at an open end of the rates tried"
        rows.append(row)
    return pd.DataFrame(rows).rename(columns={c: c.split(".")[-1] for c in keys if c.startswith("config.")})


def _window_of(windows: pd.DataFrame | None, point: pd.Series, match: list[str]):
    if windows is None or windows.empty:
        return None
    hit = windows
    for k in match:
        if k not in hit.columns:
            return None
        same = hit[k].isna() if pd.isna(point[k]) else hit[k].astype(object) == point[k]
        hit = hit[same]
    return None if hit.empty else hit.iloc[0]


def check_sentence(check: pd.DataFrame, label: str = "label") -> str:
    """One caption sentence of a rate_check: the mixers whose rates lie inside their windows,
    those with a rate outside one (the rates named), those with no window measured."""
    if check.empty:
        return ""
    groups = {"inside": [], "outside": [], "unmeasured": []}
    for name, grp in check.groupby(label, sort=False):
        measured = grp[grp["in_window"].notna()]
        outside = measured[~measured["in_window"].astype(bool)]
        if len(outside):
            groups["outside"].append(f"{name} ({', '.join(f'{r:.3g}' for r in outside['lr'])})")
        elif len(measured):
            groups["inside"].append(str(name) + ("" if len(measured) == len(grp) else " (where measured)"))
        else:
            groups["unmeasured"].append(str(name))
    parts = [f"inside for {', '.join(groups['inside'])}" if groups["inside"] else "",
             f"outside for {', '.join(groups['outside'])}" if groups["outside"] else "",
             f"no window measured for {', '.join(groups['unmeasured'])}" if groups["unmeasured"] else ""]
    where = sorted({str(w) for w in check.get("measured_at", pd.Series(dtype=object)).dropna()})
    source = f"lr_window, measured on {' and '.join(where)}" if where else "lr_window"
    return f"Each mixer's rate against its learning-rate window ({source}): " + "; ".join(p for p in parts if p)
