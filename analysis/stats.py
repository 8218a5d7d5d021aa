"""Uncertainty over seeds, named: what every trained figure and table reports per point.

Per point (a mixer at one setting): the number of seeds n, the mean over seeds, each seed's
value, and an interval only where there are at least ``MIN_SEEDS`` seeds. With fewer, the
seeds are shown and no interval is claimed: an interval over two seeds is their range, which
covers the median about half the time, not 95%.

The interval (``METHOD``) is Student's t over seeds: mean -/+ t(0.975; n - 1) x SD / sqrt(n),
the SD of the seeds' own values. A seed's accuracy is measured on its test queries, so the
query-level noise is already in the spread of the seeds. Why this one, at five seeds
(`python -m analysis.stats` measures each method tried on draws with a known mean, and the
widths): scipy's percentile and BCa bootstraps cover 0.77-0.84 where 0.95 is claimed (they
read a normal-like quantile of a plug-in variance, (n - 1)/n too small, and miss the t(4)
tail); the studentized (percentile-t) bootstrap covers 0.94-0.96, but only by intervals that
run far past the seeds: one seed apart from four gives resamples without it a tiny SE, and
the bounds reached [0.00, 0.95] for five seeds all at least 0.45, and [-45.7, 11.8] for an N
at 50%. The t interval covers 0.94-0.95 where the seeds are symmetric, 0.87-0.90 near the
ceiling where accuracy is skewed (the coverage check prints both), always spans the seeds'
mean by a multiple of their SD, and is what a reader checks by hand. Where seeds tie (all at
accuracy 1.0) there is no spread to scale t by: a fraction of queries then takes the Wilson
score interval of the pooled queries (``FALLBACK``, named), other values the value itself.
Intervals of a fraction of queries (``counts`` given) are cut to [0, 1], and a quantity with
its own range (an entropy over its maximum, a rank correlation: ``bounds``) to that range,
the method saying so.

Comparisons across widths use a paired test across seeds (``paired_test``); a ranking of two
mixers is called only where their intervals separate (``separated``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd
from scipy import stats

MIN_SEEDS = 5            # fewer seeds: no interval
CONFIDENCE = 0.95
N_RESAMPLES = 2000
RESAMPLE_SEED = 0        # a figure redraws identically
SEED = "config.seed"

METHOD = "Student t over seeds (mean -/+ t(n-1) SD/sqrt(n)), within [0, 1]"
METHOD_SEEDS = "Student t over seeds (mean -/+ t(n-1) SD/sqrt(n))"
# Where seeds tie (accuracy at the ceiling) there is no SD to scale t by: a fraction of queries
# takes the Wilson score interval of all its seeds' queries pooled; a value without queries has
# nothing to widen it, and its interval is the value.
FALLBACK = "Wilson score interval of the pooled queries (seeds tie: no SD for t), within [0, 1]"
FALLBACK_SEEDS = "the value itself (seeds tie, no queries: no SD for t)"
NO_INTERVAL = f"none (n < {MIN_SEEDS}: seeds only)"
PAIRED_TEST = "paired t-test across seeds (scipy.stats.ttest_rel)"
STAT_COLUMNS = ("n", "mean", "interval_method", "low", "high")  # then seed_<id> columns


@dataclass(frozen=True)
class Estimate:
    """One point: its seeds' values, their mean, and an interval (NaN when n < MIN_SEEDS)."""
    n: int
    mean: float
    values: tuple[float, ...]
    low: float
    high: float
    method: str

    @property
    def has_interval(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)


def _redraw(rng: np.random.Generator, accuracy, count):
    """Each seed's accuracy redrawn from its queries: Binomial(count, accuracy) / count."""
    count = np.asarray(count)
    return rng.binomial(count.astype(np.int64), np.clip(accuracy, 0.0, 1.0)) / count


def _broadcast_to_points(per_point: np.ndarray, like: np.ndarray) -> np.ndarray:
    """A per-point array (leading axes) shaped to broadcast against ``like``, which may have an
    extra resample axis before the seed axis reduced away (scipy passes (..., resamples, n))."""
    return per_point.reshape(per_point.shape + (1,) * (like.ndim - per_point.ndim))


def _studentized_mean(rng: np.random.Generator, center: np.ndarray, with_counts: bool) -> Callable:
    """Statistic for scipy.stats.bootstrap: a resample's mean over seeds minus the observed mean,
    over the resample's standard error (t*); with counts, each seed redrawn from its queries first."""

    def statistic(*data, axis=-1):
        values = _redraw(rng, data[0], data[1]) if with_counts else np.asarray(data[0], dtype=float)
        n = values.shape[axis]
        mean = values.mean(axis=axis)
        se = values.std(axis=axis, ddof=1) / math.sqrt(n)
        diff = mean - _broadcast_to_points(center, mean)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = diff / se
            # a resample with no spread: t is 0 when it sits on the mean, else beyond every other
            return np.where(se > 0, t, np.where(diff == 0, 0.0, np.sign(diff) * np.inf))

    return statistic


def _plain_mean(values, axis=-1):
    return np.mean(values, axis=axis)


def _mean_of_redraws(rng: np.random.Generator) -> Callable:
    def statistic(accuracy, count, axis=-1):
        return _redraw(rng, accuracy, count).mean(axis=axis)

    return statistic


def bootstrap(values, counts=None, *, method: str = "percentile", confidence: float = CONFIDENCE,
              n_resamples: int = N_RESAMPLES, seed: int = RESAMPLE_SEED):
    """scipy.stats.bootstrap of the mean over the last axis of ``values`` (seeds), hierarchical
    when ``counts`` (queries per seed) are given; leading axes are independent points, resampled
    in one call. ``method`` is scipy's ("percentile", "basic", "BCa"). Returns scipy's result."""
    rng = np.random.default_rng(seed)
    values = np.asarray(values, dtype=float)
    if counts is None:
        data, statistic = (values,), _plain_mean
    else:
        data, statistic = (values, np.broadcast_to(np.asarray(counts, dtype=float), values.shape)), _mean_of_redraws(rng)
    return stats.bootstrap(data, statistic, paired=counts is not None, vectorized=True, axis=-1,
                           n_resamples=n_resamples, confidence_level=confidence, method=method, rng=rng)


def studentized_interval(values, counts=None, *, confidence: float = CONFIDENCE,
                         n_resamples: int = N_RESAMPLES, seed: int = RESAMPLE_SEED):
    """(low, high) of the studentized hierarchical bootstrap over the last axis of ``values``
    (seeds), one pair per leading index: a method tried and measured by the coverage check (the
    figures' default before the t interval; module doc).

    scipy.stats.bootstrap resamples the seeds (with their counts, paired) and returns the
    percentiles of t* = (mean* - mean) / SE*; the interval is mean - t*_hi SE, mean - t*_lo SE."""
    rng = np.random.default_rng(seed)
    values = np.asarray(values, dtype=float)
    n = values.shape[-1]
    mean = values.mean(axis=-1)
    se = values.std(axis=-1, ddof=1) / math.sqrt(n)
    data = (values,) if counts is None else (values, np.broadcast_to(np.asarray(counts, dtype=float), values.shape))
    with np.errstate(invalid="ignore"):  # scipy's standard error of t*, unused, meets the infinite ones
        res = stats.bootstrap(data, _studentized_mean(rng, np.asarray(mean), counts is not None), paired=True,
                              vectorized=True, axis=-1, n_resamples=n_resamples, confidence_level=confidence,
                              method="percentile", rng=rng)
    t_low, t_high = res.confidence_interval
    with np.errstate(invalid="ignore"):  # no spread at all: the interval is the mean itself
        low = np.where(se > 0, mean - t_high * se, mean)
        high = np.where(se > 0, mean - t_low * se, mean)
    return low, high


def t_interval(values, *, confidence: float = CONFIDENCE) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) of METHOD over the last axis of ``values`` (seeds): mean -/+ t(n-1) SD/sqrt(n)."""
    values = np.asarray(values, dtype=float)
    n = values.shape[-1]
    mean = values.mean(axis=-1)
    half = stats.t.ppf(0.5 + confidence / 2, n - 1) * values.std(axis=-1, ddof=1) / math.sqrt(n)
    return mean - half, mean + half


def wilson_interval(values, counts, *, confidence: float = CONFIDENCE) -> tuple[np.ndarray, np.ndarray]:
    """(low, high): the Wilson score interval of all the seeds' queries pooled (hits = accuracy x
    count), per leading index (FALLBACK, for seeds that tie)."""
    values = np.asarray(values, dtype=float)
    counts = np.broadcast_to(np.asarray(counts, dtype=float), values.shape)
    hits, total = (values * counts).sum(axis=-1), counts.sum(axis=-1)
    p, z = hits / total, stats.norm.ppf(0.5 + confidence / 2)
    center = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * np.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    # at p = 0 or 1 the score interval ends exactly at p; the arithmetic above lands a rounding
    # step inside it, which would leave the mean outside its own interval
    return np.minimum(center - half, p), np.maximum(center + half, p)


def interval(values, counts=None, *, confidence: float = CONFIDENCE, bounds: tuple[float, float] | None = None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(low, high, method) per leading index of ``values`` (seeds on the last axis): METHOD, or
    the named fallback where the seeds tie (module doc). ``bounds``: the range the quantity can
    take (an entropy over its maximum, a rank correlation), where the interval is cut and the
    method says so; a fraction of queries (``counts``) is cut to [0, 1]."""
    values = np.asarray(values, dtype=float)
    flat = values.reshape(-1, values.shape[-1])
    low, high = (np.atleast_1d(v).astype(float).reshape(-1) for v in t_interval(flat, confidence=confidence))
    hierarchical = counts is not None
    method = np.full(low.shape, METHOD if hierarchical else METHOD_SEEDS, dtype=object)
    tie = np.ptp(flat, axis=-1) == 0  # no SD: t has nothing to scale
    if tie.any():
        if hierarchical:
            c = np.broadcast_to(np.asarray(counts, dtype=float), values.shape).reshape(flat.shape)
            low[tie], high[tie] = wilson_interval(flat[tie], c[tie], confidence=confidence)
            method[tie] = FALLBACK
        else:
            low[tie] = high[tie] = flat[tie].mean(axis=-1)  # the mean as summarize computes it, to the last bit
            method[tie] = FALLBACK_SEEDS
    if hierarchical:  # a fraction of queries: the true mean lies in [0, 1], so cutting there loses no coverage
        low, high = np.clip(low, 0.0, 1.0), np.clip(high, 0.0, 1.0)
    elif bounds is not None:
        low, high = np.clip(low, *bounds), np.clip(high, *bounds)
        method = np.array([f"{m}, within [{bounds[0]:g}, {bounds[1]:g}]" for m in method], dtype=object)
    shape = values.shape[:-1]
    return low.reshape(shape) if shape else low, high.reshape(shape) if shape else high, \
        method.reshape(shape) if shape else method


def t_bootstrap_interval(values, counts=None, *, confidence: float = CONFIDENCE,
                         n_resamples: int = N_RESAMPLES, seed: int = RESAMPLE_SEED):
    """(low, high): mean -/+ t(n-1) x hierarchical bootstrap SE x sqrt(n/(n-1)) (a method
    tried and measured by the coverage check; not the one the figures use)."""
    values = np.asarray(values, dtype=float)
    n = values.shape[-1]
    se = bootstrap(values, counts, method="percentile", confidence=confidence, n_resamples=n_resamples,
                   seed=seed).standard_error * math.sqrt(n / (n - 1))
    half = stats.t.ppf(0.5 + confidence / 2, n - 1) * se
    mean = values.mean(axis=-1)
    return mean - half, mean + half


def estimate(values, counts=None, *, confidence: float = CONFIDENCE) -> Estimate:
    """The seeds' values (NaN dropped), their mean, and METHOD's interval when n >= MIN_SEEDS."""
    x = np.asarray(pd.Series(values, dtype=float), dtype=float)
    c = None if counts is None else np.asarray(pd.Series(counts, dtype=float), dtype=float)
    keep = np.isfinite(x) & (True if c is None else np.isfinite(c) & (c > 0))
    x = x[keep]
    c = None if c is None else c[keep]
    n = int(x.size)
    mean = float(x.mean()) if n else math.nan
    if n < MIN_SEEDS:
        return Estimate(n, mean, tuple(x.tolist()), math.nan, math.nan, NO_INTERVAL)
    low, high, method = interval(x, c, confidence=confidence)
    return Estimate(n, mean, tuple(x.tolist()), float(low[0]), float(high[0]), str(method[0]))


def per_seed(rows: pd.DataFrame, by: list[str], value: str, *, count: str | None = None,
             seed: str = SEED) -> pd.DataFrame:
    """One row per point and seed: ``value`` pooled over the seed's rows (weighted by ``count``,
    whose sum it keeps, when given; else their plain mean). A frame without a seed column takes
    each row as its own seed."""
    rows = rows.copy()
    if seed not in rows.columns:
        rows[seed] = rows.groupby(by, dropna=False).cumcount()
    rows[seed] = rows[seed].fillna(-1)
    rows = rows.dropna(subset=[value])
    keys = list(by) + [seed]
    if count is not None and count in rows.columns and rows[count].notna().all():
        weighted = rows.assign(_w=rows[value] * rows[count])
        out = weighted.groupby(keys, dropna=False).agg(_w=("_w", "sum"), _c=(count, "sum")).reset_index()
        return out.assign(**{value: out["_w"] / out["_c"], count: out["_c"]}).drop(columns=["_w", "_c"])
    return rows.groupby(keys, dropna=False)[value].mean().reset_index()


def summarize(rows: pd.DataFrame, by: list[str], value: str, *, count: str | None = None,
              seed: str = SEED, confidence: float = CONFIDENCE,
              bounds: tuple[float, float] | None = None) -> pd.DataFrame:
    """Per point of ``by``: n, mean, interval_method, low, high, then seed_<id> per seed.

    Points with the same n are bootstrapped together in one scipy.stats.bootstrap call."""
    by = list(by)
    if rows.empty:
        return pd.DataFrame(columns=by + list(STAT_COLUMNS))
    pooled = per_seed(rows, by, value, count=count, seed=seed)
    if pooled.empty:
        return pd.DataFrame(columns=by + list(STAT_COLUMNS))
    use_count = count is not None and count in pooled.columns
    keys = pooled[by].astype(object).where(pooled[by].notna(), None)
    point = pd.MultiIndex.from_frame(keys).to_flat_index() if len(by) > 1 else pd.Index(keys[by[0]])
    pooled = pooled.assign(_point=list(point))
    wide = pooled.pivot_table(index="_point", columns=seed, values=value, aggfunc="first", dropna=False)
    wide = wide.loc[pd.unique(pooled["_point"])] if len(by) else wide
    weights = pooled.pivot_table(index="_point", columns=seed, values=count, aggfunc="first",
                                 dropna=False).reindex_like(wide) if use_count else None
    values = wide.to_numpy(float)
    present = np.isfinite(values)
    n = present.sum(axis=1)
    with np.errstate(invalid="ignore"):
        mean = np.nansum(values, axis=1) / np.where(n > 0, n, np.nan)
    frame = pd.DataFrame([p if isinstance(p, tuple) else (p,) for p in wide.index], columns=by)
    frame["n"], frame["mean"] = n, mean
    frame["interval_method"], frame["low"], frame["high"] = NO_INTERVAL, np.nan, np.nan
    for size in sorted(set(n[n >= MIN_SEEDS])):
        idx = np.nonzero(n == size)[0]
        batch = np.stack([values[i][present[i]] for i in idx])
        counts = np.stack([weights.to_numpy(float)[i][present[i]] for i in idx]) if use_count else None
        low, high, method = interval(batch, counts, confidence=confidence, bounds=bounds)
        frame.loc[idx, "low"], frame.loc[idx, "high"], frame.loc[idx, "interval_method"] = low, high, method
    seeds = pd.DataFrame(values, columns=[seed_column(c) for c in wide.columns])
    seeds = seeds[sorted(seeds.columns, key=seed_order)]
    out = pd.concat([frame, seeds], axis=1)
    return out.sort_values(by, kind="stable").reset_index(drop=True) if by else out


def seed_column(seed) -> str:
    """The column a seed's value takes in a summary: seed_<id>."""
    return f"seed_{int(seed)}" if isinstance(seed, (int, float, np.number)) and float(seed).is_integer() \
        else f"seed_{seed}"


def seed_order(column: str):
    """Sort key of a seed_<id> column: numeric ids in order, then any other."""
    tail = column[len("seed_"):]
    return (0, int(tail), "") if tail.lstrip("-").isdigit() else (1, 0, tail)


def seed_values(summary_row: pd.Series) -> np.ndarray:
    """The seed_<id> values of one summarize() row, NaN (absent seeds) dropped."""
    values = np.array([v for k, v in summary_row.items() if str(k).startswith("seed_")], dtype=float)
    return values[np.isfinite(values)]


def separated(a: pd.Series, b: pd.Series) -> bool:
    """Whether two summarize() rows' intervals are disjoint (False when either has none)."""
    if not all(np.isfinite([a["low"], a["high"], b["low"], b["high"]])):
        return False
    return bool(a["high"] < b["low"] or b["high"] < a["low"])


def ranking(summary: pd.DataFrame, label: str = "label", within: list[str] | None = None) -> pd.DataFrame:
    """Every pair of points within ``within`` (e.g. a setting): which is higher, called only
    where the intervals separate ("not separated" otherwise; "no interval" below MIN_SEEDS)."""
    rows = []
    groups = summary.groupby(within, dropna=False) if within else [((), summary)]
    for key, grp in groups:
        key = key if isinstance(key, tuple) else (key,)
        ordered = grp.sort_values("mean", ascending=False).to_dict("records")
        for i, a in enumerate(ordered):
            for b in ordered[i + 1:]:
                if not (np.isfinite(a["low"]) and np.isfinite(b["low"])):
                    verdict = f"no interval (n < {MIN_SEEDS})"
                elif separated(pd.Series(a), pd.Series(b)):
                    verdict = f"{a[label]} above {b[label]}"
                else:
                    verdict = "not separated (intervals overlap)"
                rows.append({**dict(zip(within or [], key)), "a": a[label], "b": b[label],
                             "mean_a": a["mean"], "mean_b": b["mean"], "n_a": a["n"], "n_b": b["n"],
                             "separated": verdict.endswith(f"above {b[label]}"), "verdict": verdict})
    return pd.DataFrame(rows)


def paired_test(a: pd.Series, b: pd.Series) -> dict:
    """Paired t-test of b - a across the seeds both have (Series indexed by seed): n_paired,
    the mean difference, the statistic and its p-value (NaN with < 2 pairs; differences that do
    not vary at all give p = 0 when they are not zero, NaN when they are)."""
    both = pd.concat([a.rename("a"), b.rename("b")], axis=1).dropna()
    d = (both["b"] - both["a"]).to_numpy(float)
    diff = float(d.mean()) if d.size else math.nan
    out = {"n_paired": int(d.size), "diff": diff, "statistic": math.nan, "p_value": math.nan, "test": PAIRED_TEST}
    if d.size < 2:
        return out
    if np.ptp(d) <= 1e-12 * max(1.0, abs(diff)):  # no spread: scipy would lose its precision
        if diff != 0:
            out.update(statistic=math.copysign(math.inf, diff), p_value=0.0)
        return out
    res = stats.ttest_rel(both["b"], both["a"])
    out.update(statistic=float(res.statistic), p_value=float(res.pvalue))
    return out


DIFFERENCE = "Welch t interval of the difference of means (scipy.stats.ttest_ind, unequal variances)"
SPEARMAN = "percentile bootstrap over seeds (every run of a resampled seed kept together)"


def difference(a, b, *, confidence: float = CONFIDENCE) -> dict:
    """Mean of ``b`` minus mean of ``a`` (two independent sets of seeds, NaN dropped), with its
    interval (DIFFERENCE) where each side has at least MIN_SEEDS seeds."""
    a, b = (np.asarray(pd.Series(v, dtype=float).dropna(), dtype=float) for v in (a, b))
    out = {"n_a": int(a.size), "n_b": int(b.size), "diff": float(b.mean() - a.mean()) if a.size and b.size else math.nan,
           "low": math.nan, "high": math.nan, "interval_method": NO_INTERVAL}
    if min(a.size, b.size) < MIN_SEEDS:
        return out
    if np.ptp(np.concatenate([a, b])) == 0:  # every seed alike: no spread to scale by
        out.update(low=out["diff"], high=out["diff"], interval_method=f"{DIFFERENCE}; every seed alike")
        return out
    ci = stats.ttest_ind(b, a, equal_var=False).confidence_interval(confidence)
    out.update(low=float(ci.low), high=float(ci.high), interval_method=DIFFERENCE)
    return out


def spearman(x, y, seeds, *, confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES,
             seed: int = RESAMPLE_SEED) -> dict:
    """Spearman's rank correlation of ``y`` with ``x`` over all runs (scipy.stats.spearmanr), and
    its interval (SPEARMAN): the seeds are resampled, each seed's runs together, where there are
    at least MIN_SEEDS seeds; NaN where x or y does not vary."""
    frame = pd.DataFrame({"x": x, "y": y, "seed": seeds}).dropna()
    rho = float(stats.spearmanr(frame["x"], frame["y"]).statistic) if len(frame) > 2 else math.nan
    ids = pd.unique(frame["seed"])
    out = {"n_seeds": int(ids.size), "runs": int(len(frame)), "rho": rho, "low": math.nan, "high": math.nan,
           "interval_method": NO_INTERVAL}
    if ids.size < MIN_SEEDS or not math.isfinite(rho):
        return out
    groups = [frame[frame["seed"] == i] for i in ids]

    def statistic(picked):
        sample = pd.concat([groups[int(k)] for k in picked])
        with np.errstate(invalid="ignore"):
            return stats.spearmanr(sample["x"], sample["y"]).statistic

    with np.errstate(invalid="ignore"):
        res = stats.bootstrap((np.arange(ids.size),), statistic, vectorized=False, n_resamples=n_resamples,
                              confidence_level=confidence, method="percentile", rng=np.random.default_rng(seed))
    out.update(low=float(res.confidence_interval.low), high=float(res.confidence_interval.high),
               interval_method=f"{SPEARMAN}, {n_resamples} resamples")
    return out


def caption(summary: pd.DataFrame | None = None, *, n: int | None = None) -> str:
    """The line a figure's caption carries about its points: n per point and the method."""
    if summary is not None and len(summary):
        ns = sorted({int(v) for v in summary["n"]})
        methods = sorted(set(summary["interval_method"]) - {NO_INTERVAL})
    else:
        ns, methods = ([n] if n is not None else []), []
    counts = "n = " + ("-".join(str(v) for v in (ns[0], ns[-1])) if len(ns) > 1 else str(ns[0] if ns else "?"))
    if not methods:
        return f"{counts} seeds per point: each seed drawn, mean line; no interval (n < {MIN_SEEDS})"
    what = "; ".join(methods)
    short = f" (points with n < {MIN_SEEDS}: seeds only)" if ns and ns[0] < MIN_SEEDS else ""
    return f"{counts} seeds per point: each seed drawn, mean line, 95% interval = {what}{short}"


# --- coverage: how often each method's 95% interval covers a known mean ---------------------

def hierarchical_draws(rng: np.random.Generator, repetitions: int, n: int, *, mean: float = 0.8,
                       concentration: float = 12.0, count: int = 256) -> tuple[np.ndarray, np.ndarray, float]:
    """(accuracy (repetitions, n), counts, true mean): each seed's accuracy p ~ Beta with the
    given mean and a + b = concentration (seed SD about 0.11 at 0.8), then its test accuracy
    Binomial(count, p) / count, as a trained run's accuracy is drawn."""
    a, b = mean * concentration, (1 - mean) * concentration
    p = rng.beta(a, b, size=(repetitions, n))
    return rng.binomial(count, p) / count, np.full((repetitions, n), float(count)), mean


def method_interval(method: str, values: np.ndarray, counts: np.ndarray | None, *,
                    n_resamples: int = N_RESAMPLES, seed: int = RESAMPLE_SEED) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) per row of ``values`` by a method tried: "figures" (``interval``: METHOD with
    its fallback), "studentized" (studentized_interval), "t-bootstrap" (t_bootstrap_interval), "t"
    (Student t on the seed values alone, uncut), or a scipy.stats.bootstrap method ("percentile",
    "basic", "BCa") of the hierarchical resample."""
    if method == "figures":
        low, high, _ = interval(values, counts)
    elif method == "studentized":
        low, high = studentized_interval(values, counts, n_resamples=n_resamples, seed=seed)
    elif method == "t-bootstrap":
        low, high = t_bootstrap_interval(values, counts, n_resamples=n_resamples, seed=seed)
    elif method == "t":
        low, high = t_interval(values)
    else:
        ci = bootstrap(values, counts, method=method, n_resamples=n_resamples, seed=seed).confidence_interval
        low, high = ci.low, ci.high
    return np.asarray(low, float), np.asarray(high, float)


def coverage(method: str, values: np.ndarray, counts: np.ndarray | None, truth: float,
             *, n_resamples: int = N_RESAMPLES, seed: int = RESAMPLE_SEED) -> float:
    """Fraction of rows of ``values`` whose 95% interval by ``method`` (method_interval) covers
    ``truth``."""
    low, high = method_interval(method, values, counts, n_resamples=n_resamples, seed=seed)
    return float(np.mean((low <= truth) & (truth <= high)))


def overreach(method: str, values: np.ndarray, counts: np.ndarray | None, *,
              n_resamples: int = N_RESAMPLES, seed: int = RESAMPLE_SEED) -> float:
    """How far an interval runs past its seeds, at its worst over the rows: the largest distance
    from a bound to the nearest seed beyond it, in units of the seeds' range (0: the interval
    stays within the seeds; the t interval's half-width at n = 5 is about 1.2 SD, so a few
    tenths of the range)."""
    low, high = method_interval(method, values, counts, n_resamples=n_resamples, seed=seed)
    spread = np.ptp(values, axis=-1)
    past = np.maximum(values.min(axis=-1) - low, high - values.max(axis=-1))
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.nanmax(np.where(spread > 0, past / spread, np.nan)))


def one_seed_fails(rng: np.random.Generator, repetitions: int, n: int, *, mean: float = 0.85,
                   failure: float = 0.15, count: int = 256) -> tuple[np.ndarray, np.ndarray, float]:
    """hierarchical_draws' layout for a mixer that sometimes does not learn: each seed fails
    (accuracy about 0.05) with probability ``failure``, else learns to p ~ Beta(mean, a + b = 12)."""
    ok = rng.random((repetitions, n)) >= failure
    p = np.where(ok, rng.beta(mean * 12, (1 - mean) * 12, size=(repetitions, n)), 0.05)
    truth = (1 - failure) * mean + failure * 0.05
    return rng.binomial(count, p) / count, np.full((repetitions, n), float(count)), truth


METHODS_TRIED = ("percentile", "basic", "BCa", "studentized", "t-bootstrap", "t", "figures")


def main() -> None:
    """Print, per method tried, the coverage of its 95% interval at n = 5 and 10 seeds over 200
    repetitions, and how far its intervals run past their seeds at worst (overreach)."""
    cases = {"beta(mean 0.8, seed SD 0.11), 256 queries": {},
             "beta(mean 0.5, seed SD 0.14), 2000 queries": {"mean": 0.5, "count": 2000},
             "beta(mean 0.95, seed SD 0.05), 256 queries": {"mean": 0.95, "concentration": 20.0},
             "beta(mean 0.9, seed SD 0.12, skewed), 256 queries": {"mean": 0.9, "concentration": 5.0},
             "one seed in seven does not learn": None}
    print("coverage of the 95% interval over 200 repetitions (target 0.90-0.99); overreach: the "
          "furthest a bound lies past the seeds, in seed ranges")
    for name, kw in cases.items():
        for n in (5, 10):
            rng = np.random.default_rng(1)
            values, counts, truth = (hierarchical_draws(rng, 200, n, **kw) if kw is not None
                                     else one_seed_fails(rng, 200, n))
            row = {m: (coverage(m, values, counts, truth), overreach(m, values, counts)) for m in METHODS_TRIED}
            print(f"{name}, n = {n}: " + ", ".join(f"{m} {c:.3f} ({o:.1f})" for m, (c, o) in row.items()))


if __name__ == "__main__":
    main()
