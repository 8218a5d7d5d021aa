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


def length_accuracy_curve(lengths, *, num_pairs: int, d_key: float, value_dim: int, candidates: int,
                          log_decay: float = 0.0, distractor_rate: float = 0.0,
                          num_queries: int | None = None, power_a: float = 0.01) -> np.ndarray:
    """Predicted recall accuracy of the recall task against length, N fixed
    (theory.predicted_length_accuracy): an additive state of key dimension d_key, writes
    weighted by a constant per-step decay, distractor writes counted as crosstalk pairs."""
    acc = theory.predicted_length_accuracy(
        np.asarray(lengths), int(num_pairs), float(d_key), int(value_dim), int(candidates),
        log_decay=float(log_decay), distractor_rate=float(distractor_rate),
        num_queries=None if num_queries is None else int(num_queries), power_a=float(power_a))
    return np.asarray(acc, dtype=float)
