"""Theory drawn over the data: harness.measure.theory (predicted SNR and accuracy) and
harness.ops (state accounting), the same functions the runs themselves report with; and the
anchors' published numbers the figures are laid beside (Schlag et al.'s break points)."""
from __future__ import annotations

import functools
from dataclasses import dataclass

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


# The mixer whose colour each state-accounting curve is drawn in (the figure of the state against
# the KV cache): the KV cache and the N x N weights are softmax attention's, the d_k d_v + d_k
# state the linear maps' (elu+1's), m d + m FAVOR+'s.
STATE_CURVE_MIXERS = {"kv_cache": "softmax", "linear_state": "elu", "favor_state": "favor"}


def favor_features(d: int) -> int:
    """FAVOR+ default feature count m (about d ln d)."""
    return int(features.feature_dim("favor", d))


def length_accuracy_curve(lengths, *, num_pairs: int, d_key: float, value_dim: int, candidates: int,
                          log_decay: float = 0.0, distractor_rate: float = 0.0,
                          num_queries: int | None = None, power_a: float = 0.01) -> np.ndarray:
    """Predicted recall accuracy of the recall task against length, N fixed
    (theory.predicted_length_accuracy): an additive state of key dimension d_key, writes
    weighted by a constant per-step decay, distractor writes counted as crosstalk pairs.
    Curves are kept per argument set: at 16k tokens one costs seconds of integration, and a
    figure redrawn (a notebook, the figures command) asks for the same ones again."""
    return np.array(_length_curve(tuple(float(t) for t in np.atleast_1d(lengths)), int(num_pairs), float(d_key),
                                  int(value_dim), int(candidates), float(log_decay), float(distractor_rate),
                                  None if num_queries is None else int(num_queries), float(power_a)))


@functools.lru_cache(maxsize=256)
def _length_curve(lengths: tuple, num_pairs: int, d_key: float, value_dim: int, candidates: int,
                  log_decay: float, distractor_rate: float, num_queries: int | None, power_a: float) -> tuple:
    acc = theory.predicted_length_accuracy(
        np.asarray(lengths), num_pairs, d_key, value_dim, candidates, log_decay=log_decay,
        distractor_rate=distractor_rate, num_queries=num_queries, power_a=power_a)
    return tuple(np.asarray(acc, dtype=float).tolist())


# --- the anchors' own numbers ---------------------------------------------------------------

# Schlag, Irie & Schmidhuber (2021), "Linear Transformers Are Secretly Fast Weight Programmers",
# the capacity experiment: one model trained per number of stored keys, at d_key = 64; the
# number of keys at which each feature map's retrieval breaks down.
SCHLAG_D_KEY = 64


@dataclass(frozen=True)
class BreakPoint:
    name: str                  # the row as the paper names it
    model: str                 # the harness mixer it corresponds to
    options: dict              # model.* options that row fixes (dpfp_nu), beyond the name
    low: float | None          # keys at d_key = 64 (None: the paper gives no number)
    high: float | None
    note: str

    def scaled(self, d_key: float) -> tuple[float, float] | None:
        """(low, high) at another key dimension, in proportion (x d_key / 64); None without a number."""
        if self.low is None:
            return None
        f = float(d_key) / SCHLAG_D_KEY
        return self.low * f, self.high * f


SCHLAG_BREAKS = (
    BreakPoint("softmax", "softmax", {}, 500, 500, "holds to about 500"),
    BreakPoint("linear attention, elu+1", "elu", {}, 60, 80, "breaks at 60-80"),
    BreakPoint("DPFP ν=1", "dpfp", {"dpfp_nu": 1}, 120, 120, "about 120"),
    BreakPoint("DPFP ν=2", "dpfp", {"dpfp_nu": 2}, 280, 280, "about 280"),
    BreakPoint("DPFP ν=3", "dpfp", {"dpfp_nu": 3}, 400, 400, "about 400"),
    BreakPoint("FAVOR+", "favor", {}, None, None, "fails earliest of the maps, at every feature count"),
)
