"""How a break point scales across settings, with intervals over seeds: the ratio of two
settings' means (N at 50% at d_key 16 over d_key 8) and the exponent of a power law through
several settings (N at 50% against d_key, which the crosstalk law puts at 1).

Both are studentized bootstraps over seeds (bootstrap-t), the method analysis.stats uses for a
mean and for the same reason: at five seeds a percentile interval reads a plug-in spread too
small and covers well under what it claims. Seeds are resampled within each setting (the
settings are fixed, their seeds independent); each resample's statistic is studentized by its
own standard error, and the interval is

    statistic - q(1 - a/2) SE,  statistic - q(a/2) SE,

q the quantiles of the resampled t. The ratio is taken on the log scale (log mean(a) -
log mean(b), delta-method SE) and returned exponentiated, so it stays positive; the exponent is
the least-squares slope of log value on log setting over every seed's point, with its OLS SE.
A seed whose value is not finite (a break that holds past every tested N) leaves no number:
the estimate is NaN and says why.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
N_RESAMPLES = 4000
RESAMPLE_SEED = 0
MIN_SEEDS = 2          # per setting: a spread to studentize by
RATIO_METHOD = "studentized bootstrap over seeds of log mean(a) - log mean(b), within each setting"
EXPONENT_METHOD = "studentized bootstrap over seeds (within each setting) of the log-log least-squares slope"


@dataclass(frozen=True)
class Scaled:
    """A ratio or an exponent: the value, its interval, the method, and the seeds it rests on."""
    value: float
    low: float
    high: float
    method: str
    seeds: int

    def as_row(self, prefix: str) -> dict:
        return {prefix: self.value, f"{prefix}_low": self.low, f"{prefix}_high": self.high,
                f"{prefix}_method": self.method, f"{prefix}_seeds": self.seeds}


def _none(why: str, seeds: int = 0) -> Scaled:
    return Scaled(math.nan, math.nan, math.nan, why, seeds)


def _usable(groups) -> tuple[list[np.ndarray], str | None]:
    arrays = [np.asarray(g, dtype=float) for g in groups]
    if any(not np.isfinite(a).all() for a in arrays):
        return arrays, "none: a seed holds past the tested N (its value is a lower bound)"
    if any(a.size < MIN_SEEDS for a in arrays):
        return arrays, f"none: fewer than {MIN_SEEDS} seeds in a setting"
    if any((a <= 0).any() for a in arrays):
        return arrays, "none: a value is not positive (no log)"
    return arrays, None


def _resample(rng: np.random.Generator, values: np.ndarray) -> np.ndarray:
    """(N_RESAMPLES, n): each row a resample of ``values`` with replacement."""
    return values[rng.integers(0, values.size, size=(N_RESAMPLES, values.size))]


def _interval(stat: float, se: float, t_star: np.ndarray, confidence: float) -> tuple[float, float]:
    t_star = t_star[np.isfinite(t_star)]
    if not (se > 0) or t_star.size == 0:
        return stat, stat
    alpha = 1.0 - confidence
    lo_q, hi_q = np.quantile(t_star, [alpha / 2, 1 - alpha / 2])
    return stat - hi_q * se, stat - lo_q * se


def _log_ratio(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log mean(a) - log mean(b) and its delta-method SE, over the last axis."""
    ma, mb = a.mean(-1), b.mean(-1)
    var = a.var(-1, ddof=1) / (a.shape[-1] * ma ** 2) + b.var(-1, ddof=1) / (b.shape[-1] * mb ** 2)
    return np.log(ma) - np.log(mb), np.sqrt(var)


def ratio(a, b, *, confidence: float = CONFIDENCE, seed: int = RESAMPLE_SEED) -> Scaled:
    """mean(a) / mean(b) of two settings' seeds, with a studentized bootstrap interval."""
    (a, b), why = _usable((a, b))
    if why:
        return _none(why, min(a.size, b.size))
    stat, se = _log_ratio(a, b)
    rng = np.random.default_rng(seed)
    star, se_star = _log_ratio(_resample(rng, a), _resample(rng, b))
    with np.errstate(divide="ignore", invalid="ignore"):
        t_star = (star - stat) / se_star
    low, high = _interval(float(stat), float(se), t_star, confidence)
    return Scaled(math.exp(stat), math.exp(low), math.exp(high), RATIO_METHOD, a.size + b.size)


def _slope(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares slope of y on x over the last axis, and its OLS standard error."""
    xc = x - x.mean()
    sxx = float((xc ** 2).sum())
    slope = (y * xc).sum(-1) / sxx
    resid = y - y.mean(-1, keepdims=True) - slope[..., None] * xc
    dof = x.size - 2
    se = np.sqrt((resid ** 2).sum(-1) / dof / sxx) if dof > 0 else np.full(np.shape(slope), np.nan)
    return slope, se


def exponent(settings, values, *, confidence: float = CONFIDENCE, seed: int = RESAMPLE_SEED) -> Scaled:
    """b in value ~ setting^b: the log-log slope through every seed's value at each setting
    (``values``: one sequence of seeds per entry of ``settings``), with a studentized bootstrap
    interval resampling seeds within each setting. Needs two settings or more."""
    settings = [float(s) for s in settings]
    groups, why = _usable(values)
    if len(set(settings)) < 2:
        return _none("none: fewer than two settings")
    if why:
        return _none(why, sum(g.size for g in groups))
    x = np.concatenate([np.full(g.size, math.log(s)) for s, g in zip(settings, groups)])
    y = np.concatenate([np.log(g) for g in groups])
    stat, se = _slope(x, y)
    rng = np.random.default_rng(seed)
    star_y = np.concatenate([np.log(_resample(rng, g)) for g in groups], axis=-1)  # (R, n)
    star, se_star = _slope(x, star_y)
    with np.errstate(divide="ignore", invalid="ignore"):
        t_star = (star - stat) / se_star
    low, high = _interval(float(stat), float(se), t_star, confidence)
    return Scaled(float(stat), low, high, EXPONENT_METHOD, int(x.size))
