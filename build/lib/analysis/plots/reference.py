"""Theory drawn over the data: harness.measure.theory (predicted SNR and accuracy) and
harness.ops (state accounting), the same functions the runs themselves report with."""
from __future__ import annotations

import numpy as np

from harness import features, ops
from harness.measure import theory


def snr_curve(d: float, n) -> np.ndarray:
    """Predicted SNR of a d-dimensional state holding n pairs.

    harness.measure.theory counts the pairs other than the one read (n_eff = N - 1); the
    spec's closed form sqrt(d/N) counts them all, the two agreeing for N >> 1.
    """
    n = np.asarray(n, dtype=float)
    return np.asarray(theory.predicted_snr(d, n - 1), dtype=float)


def accuracy_curve(d: float, n, *, candidates: int, value_dim: int) -> np.ndarray:
    """Predicted top-1 recall of n pairs in a d-dimensional state, values scored against
    ``candidates`` values of dimension ``value_dim`` (the Gaussian crosstalk model)."""
    snr = np.atleast_1d(snr_curve(d, n))
    return np.asarray(theory.predicted_accuracy(snr, int(candidates), int(value_dim)), dtype=float)


def state_sizes(d_k: int, d_v: int, n) -> dict:
    """Per-head elements over ``n`` tokens: the KV cache (N (d_k + d_v)), the N x N weights, the
    normalised linear state (d_k d_v + d_k) and the crossover (the longest N whose cache is no
    larger than the state)."""
    n = np.asarray(n, dtype=float)
    return {"kv_cache": np.array([float(ops.kv_cache_elements(int(k), d_k, d_v)) for k in n]),
            "attention_matrix": n * n,
            "linear_state": float(ops.state_elements(d_k, d_v)),
            "crossover": float(ops.kv_crossover(d_k, d_v))}


def favor_features(d: int) -> int:
    """FAVOR+ default feature count m (about d ln d)."""
    return int(features.feature_dim("favor", d))
