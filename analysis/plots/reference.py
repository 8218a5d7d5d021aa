"""Theory drawn over the data.

The curves come from ``harness.measure.theory`` (predicted SNR and accuracy) and ``harness.ops``
(state accounting), imported only when a figure needs them. Where a function is absent or
fails, the closed form stands in (SNR, state sizes) or the curve is left out (accuracy),
and the returned note says which, so that the figure can print it.
"""
from __future__ import annotations

import importlib
import math

import numpy as np


def _function(module: str, name: str):
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


def snr_curve(d: float, n) -> tuple[np.ndarray, str]:
    """Predicted SNR of a d-dimensional state holding n pairs, and where it came from.

    harness.measure.theory counts the pairs other than the one read (n_eff = N - 1); the closed
    form sqrt(d/N) of the spec counts them all, the two agreeing for N >> 1.
    """
    n = np.asarray(n, dtype=float)
    fn = _function("harness.measure.theory", "predicted_snr")
    if fn is not None:
        try:
            return np.asarray(fn(d, n - 1), dtype=float), "SNR: harness.measure.theory.predicted_snr"
        except Exception as err:  # a module under development falls back visibly
            return np.sqrt(d / n), f"SNR: closed form sqrt(d/N) (harness.measure.theory.predicted_snr failed: {err})"
    return np.sqrt(d / n), "SNR: closed form sqrt(d/N) (harness.measure.theory.predicted_snr not available)"


def accuracy_curve(d: float, n, *, candidates: int, value_dim: int) -> tuple[np.ndarray | None, str]:
    """Predicted top-1 recall of n pairs in a d-dimensional state, values scored against
    ``candidates`` values of dimension ``value_dim`` (harness.measure.theory's Gaussian crosstalk model).

    None when harness.measure.theory cannot give it: no closed form stands in for the integral.
    """
    snr, source = snr_curve(d, n)
    fn = _function("harness.measure.theory", "predicted_accuracy")
    if fn is None:
        return None, "predicted accuracy not drawn: harness.measure.theory.predicted_accuracy not available"
    try:
        acc = np.asarray(fn(np.atleast_1d(snr), int(candidates), int(value_dim)), dtype=float)
    except Exception as err:
        return None, f"predicted accuracy not drawn: harness.measure.theory.predicted_accuracy failed: {err}"
    return acc, "accuracy: harness.measure.theory.predicted_accuracy"


def state_sizes(d_k: int, d_v: int, n) -> dict:
    """Per-head elements: KV cache and N x N weights over ``n`` tokens, the normalised linear
    state, and the crossover.

    KV cache N*(d_k + d_v) (keys and values), linear state d_k*d_v + d_k (S and z), crossover
    the longest N whose cache is no larger than the state: from harness.ops when it provides
    the accounting, else from these formulas.
    """
    n = np.asarray(n, dtype=float)
    formulas = {
        "kv_cache": n * (d_k + d_v),
        "attention_matrix": n * n,
        "linear_state": float(d_k * d_v + d_k),
        "crossover": float((d_k * d_v + d_k) // (d_k + d_v)),
        "source": "state sizes: formulas KV = N(d_k + d_v), state = d_k d_v + d_k "
                  "(harness.ops accounting not available)",
    }
    ops = [_function("harness.ops", f) for f in ("state_elements", "kv_cache_elements", "kv_crossover")]
    if None in ops:
        return formulas
    state_elements, kv_cache_elements, kv_crossover = ops
    try:
        return {"kv_cache": np.array([float(kv_cache_elements(int(k), d_k, d_v)) for k in n]),
                "attention_matrix": n * n,
                "linear_state": float(state_elements(d_k, d_v)),
                "crossover": float(kv_crossover(d_k, d_v)),
                "source": "state sizes: harness.ops accounting"}
    except Exception as err:
        formulas["source"] = f"state sizes: formulas (harness.ops accounting failed: {err})"
        return formulas


def favor_features(d: int) -> int:
    """FAVOR+ default feature count m: harness.features.feature_dim, else about d ln d."""
    fn = _function("harness.features", "feature_dim")
    try:
        return int(fn("favor", d)) if fn is not None else round(d * math.log(d))
    except Exception:
        return round(d * math.log(d))


def length_accuracy_curve(lengths, *, num_pairs: int, d_key: float, value_dim: int, candidates: int,
                          log_decay: float = 0.0, distractor_rate: float = 0.0,
                          num_queries: int | None = None, power_a: float = 0.01) -> tuple[np.ndarray | None, str]:
    """Predicted recall accuracy of the recall task against length, N fixed
    (harness.measure.theory.predicted_length_accuracy): an additive state of key dimension
    d_key, writes weighted by a constant per-step decay, distractor writes as crosstalk pairs.
    None (and why) when harness.measure.theory cannot give it."""
    fn = _function("harness.measure.theory", "predicted_length_accuracy")
    if fn is None:
        return None, "predicted accuracy not drawn: harness.measure.theory.predicted_length_accuracy not available"
    try:
        acc = fn(np.asarray(lengths), int(num_pairs), float(d_key), int(value_dim), int(candidates),
                 log_decay=float(log_decay), distractor_rate=float(distractor_rate),
                 num_queries=None if num_queries is None else int(num_queries), power_a=float(power_a))
    except Exception as err:
        return None, f"predicted accuracy not drawn: harness.measure.theory.predicted_length_accuracy failed: {err}"
    return np.asarray(acc, dtype=float), "accuracy: harness.measure.theory.predicted_length_accuracy"
