"""Recall predicted at settings the model was never measured at, from the training setting's statistics.

harness.measure.trained_theory reads d_kernel and N_eff off the effective weights at the
setting it tests, so its read-out numbers (snr_readout_trained, acc_readout_trained) check
only the decoding step. Here the statistics are measured once, at the training setting (the
training N and length, on validation data: `TrainStats`, built by
trained_theory.train_statistics), and the SNR and top-1 accuracy at any other setting follow
from them and from where that setting's reads and answers sit (`Reads`, the task's layout:
no model) through harness.measure.theory. `predict_from_train(stats, reads)` cannot see a
model: it takes neither one nor anything computed from one at the setting it predicts.

What is carried from the training setting, per head of the retrieval read-out:
  kernel energies  K_t = mean kappa^2 on the answer span, K_o = mean kappa^2 on every other
                   write (trained_theory's kernel_target / kernel_other averaged over the
                   reads); d_kernel = sum K_t / sum K_o. Assumed: a property of the learned
                   maps, the same at every N and length (the kernel does not sharpen or blur
                   with the number of pairs, and a write of the filler or a query is as loud as
                   an average write of the training setting).
  decay            the mean log decay per step (per key dimension for a per-dimension gate;
                   0 without decay) and, for a mixer that scales its writes (mamba's dt), the
                   target write gain = mean squared write scale on the answer span over that
                   on all writes. Assumed: a constant decay per step, the same at every
                   setting. n_eff_law in the statistics is what this decay model gives at the
                   training setting itself, beside the n_eff measured there: where they
                   differ, the constant-decay picture does not hold even in sample.
  codebook         value_dim, the codebook's effective dimension (trained_theory), assumed
                   fixed; the candidates C are the target setting's (its distinct answers).

What follows at a read at position i of an answer at t (span t .. t+s-1):
  additive state (linear, elu, favor, taylor; softmax and sliding windows aside)
      N_eff(i) = sum_{j <= i, j not in span} g(i - j)^2 / (w sum_{j in span} g(i - j)^2),
      g(k)^2 = mean over key dimensions of exp(2 lambda k), w the target write gain:
      every earlier position is a write (keys, values, queries and filler alike), so without
      decay N_eff grows linearly in the position, with the number of pairs and with length;
      with a decay it saturates at the horizon 1 / (1 - exp(2 lambda)) (theory.state_pairs).
      SNR(i)^2 = sum_h K_t,h w g_t,h(i) / sum_h K_o,h g_o,h(i) (one head: d_kernel / N_eff(i)).
  softmax          the same law read as a kernel over an unbounded cache (no state): the
                   crosstalk still grows with every write, and the capacity it predicts,
                   ~ d_kernel d_v / (2 ln C), is set by how sharp the trained kernel is, not by
                   a state size. A window (swa) is not modelled: law "not applicable: window".
  delta rule (deltanet, gated_deltanet)
      theory.delta_read_energy (closed form: delta_read_energy_at) for a state whose every
      position is a beta = 1 write of a random unit key in R^d_delta, the target with
      t writes before and i - t after it, the constant decay above (gated_deltanet). The span
      is read as its first write. d_delta is the one number fitted, at the training setting:
      the key dimension with which this law gives the training read-out SNR
      (snr_readout_trained), as d_kernel is for the additive law. The law then carries the
      delta rule's own N-dependence: crosstalk from later writes only while N << d_delta, old
      pairs overwritten (signal ~ e^(-m / d_delta)) once the state is full. Assumed: the
      learned write strengths (beta per token) act on every setting as they did at training.

Accuracy, as trained_theory's read-out: the mean over reads of
theory.predicted_accuracy(SNR(i), C, value_dim, P), P the median over reads of the
crosstalk's participation (sum g^2)^2 / sum g^4 (the mean decay over key dimensions for a
per-dimension gate); the SNR of a setting is a ratio of sums over its reads, like the
measured one. A law that fails out of sample is reported, not tuned: nothing here is fitted
at a setting it predicts.

Baselines: a law earns its place by beating a naive extrapolation from the same training point,
so beside every prediction two are made from the same reads and the same accuracy map
(`predict_baselines`), both with every earlier write counted once (no decay, no learned kernel):
  nominal    the random-key law at the state's nominal key dimension d_key (model.d_key):
             SNR(i)^2 = d_key / N_flat(i), N_flat the other writes per target write;
  anchored   the training read-out SNR carried to the target setting with the random-key law's
             slope (the untrained probe's: SNR^2 proportional to 1 / N_flat):
             SNR(i)^2 = snr_readout^2 N_flat(training) / N_flat(i).

Known answer: random keys frozen in place of a trained projection, measured at one N, predict
the untrained probe's accuracy at 2x-8x that N (tests/test_out_of_sample.py).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import NamedTuple, Optional

import numpy as np
from scipy import optimize

from harness.measure import theory

LAWS = ("additive", "delta")  # anything else is "not applicable: <why>"
DELTA_DIM_RANGE = (2.0, 1e8)  # where d_delta is searched


@dataclass(frozen=True)
class TrainStats:
    """The statistics measured at the training setting (results.json `train_stats`)."""
    law: str                                  # "additive", "delta", or "not applicable: <why>"
    span: int                                 # positions whose v carries the written answer
    kernel_target: tuple[float, ...]          # per head of the read-out: mean kappa^2 on the span
    kernel_other: tuple[float, ...]           # per head: mean kappa^2 on the other writes
    log_decay: tuple[tuple[float, ...], ...]  # per head: mean log decay per step, per key dimension
    target_write_gain: tuple[float, ...]      # per head: mean write scale^2 on the span / on all writes
    value_dim: float
    candidates: int                           # at the training setting (a target setting has its own)
    d_kernel: float
    n_eff: float                              # measured at the training setting
    pairs: float
    snr_readout: float                        # snr_readout_trained at the training setting
    acc_readout: float
    seq_len: int
    num_pairs: Optional[int] = None
    d_delta: float = math.nan                 # the delta law's key dimension (fitted here)
    n_eff_law: float = math.nan               # the decay model's N_eff at the training setting
    layer: Optional[int] = None
    head: Optional[int] = None
    d_key: float = math.nan                   # the state's nominal key dimension (the nominal baseline)
    n_eff_flat: float = math.nan              # N_flat at the training setting (the anchored baseline)

    def as_dict(self) -> dict:
        """JSON-ready, with the derived numbers a reader wants beside them: n_eff_per_pair
        (N_eff's growth rate at the training setting) and decay_horizon (the saturation count
        1 / (1 - exp(2 lambda)) of the slowest head, inf without decay)."""
        out = dataclasses.asdict(self)
        for name in ("kernel_target", "kernel_other", "target_write_gain"):
            out[name] = list(getattr(self, name))
        out["log_decay"] = [list(x) for x in self.log_decay]
        out["n_eff_per_pair"] = self.n_eff / self.num_pairs if self.num_pairs else math.nan
        slowest = max(float(np.mean(x)) for x in self.log_decay) if self.log_decay else 0.0
        out["decay_horizon"] = math.inf if slowest >= 0 else 1.0 / -math.expm1(2.0 * slowest)
        return out

    @classmethod
    def from_record(cls, record: dict) -> "TrainStats":
        """The statistics back from results.json's ``train_stats`` (as_dict's output; the derived
        numbers and the status are dropped)."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        # JSON writes NaN as null: a float field that is null was NaN (an Optional one stays None)
        values = {k: (math.nan if v is None and fields[k].type == "float" else v)
                  for k, v in record.items() if k in fields}
        for name in ("kernel_target", "kernel_other", "target_write_gain"):
            values[name] = tuple(float(x) for x in values[name])
        values["log_decay"] = tuple(tuple(float(x) for x in head) for head in values["log_decay"])
        return cls(**values)

    def at_key_width(self, ratio: float) -> "TrainStats":
        """The statistics of the same mixer with its key side ``ratio`` times as wide, as the law
        carries them: the kernel's signal energy over its crosstalk (d_kernel) and the delta
        rule's key dimension in proportion, the nominal key dimension by definition. The
        read-out measured at the training setting (snr_readout, the anchored baseline's anchor)
        is a measurement of the width it was measured at, and stays."""
        return dataclasses.replace(self, kernel_target=tuple(k * ratio for k in self.kernel_target),
                                   d_kernel=self.d_kernel * ratio, d_delta=self.d_delta * ratio,
                                   d_key=self.d_key * ratio)

    @property
    def anchored_by_algebra(self) -> bool:
        """anchored_by_algebra of these statistics."""
        return anchored_by_algebra(self.law, self.kernel_target, self.log_decay, self.target_write_gain)


def anchored_by_algebra(law: str, kernel_target, log_decay, target_write_gain) -> bool:
    """Whether the law's out-of-sample prediction at the same key width is the anchored
    baseline's by construction: an additive state with one read-out head, no decay and every
    write at gain 1 scales the training read-out's SNR^2 by the ratio of earlier writes, which is
    what the anchored baseline does. A win of the law there is no evidence for it."""
    return (law == "additive" and len(kernel_target) == 1
            and all(float(x) == 0.0 for head in log_decay for x in head)
            and all(float(w) == 1.0 for w in target_write_gain))


class Reads(NamedTuple):
    """Where a setting reads: each read's position i and its answer's position t, (R,) each,
    and the setting's candidates C. Built from the task's layout alone (`reads_of`)."""
    position: np.ndarray
    target: np.ndarray
    candidates: int


def reads_of(batch, max_examples: Optional[int] = None) -> Reads:
    """The reads of a task batch (every labelled position with its target_pos) and the
    distinct answers over the whole batch; only the layout is read, never a model."""
    field = (lambda n: batch[n]) if isinstance(batch, dict) else (lambda n: getattr(batch, n))
    target_pos, targets = field("target_pos"), field("targets")
    candidates = int(np.unique(targets[target_pos >= 0].cpu().numpy()).size)
    tp = target_pos[:max_examples].cpu().numpy()
    _, position = np.nonzero(tp >= 0)
    return Reads(position=position.astype(np.float64), target=tp[tp >= 0].astype(np.float64),
                 candidates=candidates)


def _geometric(c: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """sum_{k = lo}^{hi} exp(c k), elementwise (0 where hi < lo); c <= 0."""
    n = np.maximum(hi - lo + 1.0, 0.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = np.where(c == 0, n, np.expm1(c * n) / np.where(c == 0, 1.0, np.expm1(c)))
    return np.exp(c * lo) * ratio


def survival_sums(reads: Reads, span: int, log_decay, write_gain: float = 1.0) -> dict[str, np.ndarray]:
    """The decay model's per-read gains of one head, (R,) each: gain_target = w sum_span g^2,
    gain_other = sum g^2 and gain_other_sq = sum g^4 over the other writes of the prefix.

    log_decay: the head's mean log decay per step, one per key dimension (g^2 is their mean of
    exp(2 lambda k)); g^4 uses the dimensions' mean decay (module docstring).
    """
    lam = np.atleast_1d(np.asarray(log_decay, dtype=np.float64))[:, None]  # (D, 1)
    i, t = reads.position[None, :], reads.target[None, :]  # (1, R)
    last = np.minimum(t + span - 1, i)  # the span's last write inside the prefix
    total = _geometric(2 * lam, 0.0 * i, i).mean(0)
    on = _geometric(2 * lam, i - last, i - t).mean(0)
    mean = np.full((1, 1), float(lam.mean()))
    total4, on4 = _geometric(4 * mean, 0.0 * i, i)[0], _geometric(4 * mean, i - last, i - t)[0]
    return {"gain_target": write_gain * on, "gain_other": np.maximum(total - on, 0.0),
            "gain_other_sq": np.maximum(total4 - on4, 0.0)}


def read_accuracy(snr: np.ndarray, candidates: int, value_dim: float, pairs: float) -> float:
    """Mean over reads of theory.predicted_accuracy(SNR_i, C, round(value_dim), P); NaN where
    the codebook or the candidates cannot define one."""
    if not (math.isfinite(value_dim) and candidates >= 2 and math.isfinite(pairs) and np.size(snr)):
        return math.nan
    d_v = max(2, int(round(value_dim)))
    return float(np.mean(theory.predicted_accuracy(np.asarray(snr, dtype=np.float64), candidates, d_v,
                                                   max(pairs, 1.0))))


def _additive_energies(stats: TrainStats, reads: Reads) -> tuple[np.ndarray, np.ndarray, dict]:
    """Per-read signal and crosstalk energies of the additive law (module docstring)."""
    signal = np.zeros(reads.position.shape)
    crosstalk = np.zeros(reads.position.shape)
    gains = {"gain_target": 0.0, "gain_other": 0.0, "gain_other_sq": 0.0}
    for kt, ko, lam, w in zip(stats.kernel_target, stats.kernel_other, stats.log_decay, stats.target_write_gain):
        g = survival_sums(reads, stats.span, lam, w)
        signal += kt * g["gain_target"]
        crosstalk += ko * g["gain_other"]
        gains = {k: gains[k] + g[k] for k in gains}
    return signal, crosstalk, gains


def _delta_energies(d: float, stats: TrainStats, reads: Reads) -> tuple[np.ndarray, np.ndarray]:
    """Per-read (E a_ii^2, E crosstalk^2) of the delta law with key dimension d."""
    lam = float(np.mean([np.mean(x) for x in stats.log_decay])) if stats.log_decay else 0.0
    return theory.delta_read_energy_at(d, reads.target, reads.position - reads.target, lam)


def fit_delta_dim(stats: TrainStats, reads: Reads) -> float:
    """d_delta: the key dimension with which the delta law gives the training read-out SNR at
    the training setting's reads (NaN when no d in DELTA_DIM_RANGE does)."""
    want = 2.0 * math.log(stats.snr_readout) if stats.snr_readout > 0 else math.nan
    if not math.isfinite(want) or reads.position.size == 0:
        return math.nan

    def gap(log_d: float) -> float:
        sig, xt = _delta_energies(math.exp(log_d), stats, reads)
        return math.log(sig.sum() / xt.sum()) - want

    lo, hi = (math.log(x) for x in DELTA_DIM_RANGE)
    if gap(lo) > 0 or gap(hi) < 0:
        return math.nan
    return math.exp(optimize.brentq(gap, lo, hi, xtol=1e-6))


def law_n_eff(stats: TrainStats, reads: Reads) -> float:
    """N_eff of the decay model at `reads`: sum over reads and heads of the other writes' gains
    over the targets' (the ratio of sums trained_theory measures)."""
    _, _, gains = _additive_energies(stats, reads)
    gt, go = float(np.sum(gains["gain_target"])), float(np.sum(gains["gain_other"]))
    return go / gt if gt > 0 else math.inf


PREDICTED = ("snr_predicted_from_train", "acc_predicted_from_train", "n_eff_from_train", "pairs_from_train")


def no_prediction() -> dict[str, float]:
    """`predict_from_train`'s keys, all NaN: a setting where no law applies."""
    return dict.fromkeys(PREDICTED, math.nan)


def predict_from_train(stats: TrainStats, reads: Reads) -> dict[str, float]:
    """The SNR and top-1 accuracy that the training setting's statistics predict at the
    setting whose reads are `reads` (module docstring): {snr_predicted_from_train,
    acc_predicted_from_train, n_eff_from_train, pairs_from_train}, NaN where the law does not
    apply (`no_prediction`)."""
    if stats.law not in LAWS or reads.position.size == 0:
        return no_prediction()
    signal, crosstalk, gains = _additive_energies(stats, reads)  # the gains give P for either law
    if stats.law == "delta":
        if not math.isfinite(stats.d_delta):
            return no_prediction()
        signal, crosstalk = _delta_energies(stats.d_delta, stats, reads)
    with np.errstate(divide="ignore", invalid="ignore"):
        snr_reads = np.sqrt(signal / crosstalk)  # inf: nothing else written; 0: the target has faded
        pairs_reads = gains["gain_other"] ** 2 / gains["gain_other_sq"]
    snr_reads = np.nan_to_num(snr_reads, nan=0.0)
    pairs = float(np.median(np.where(np.isfinite(pairs_reads), pairs_reads, 0.0)))
    total_signal, total_crosstalk = float(signal.sum()), float(crosstalk.sum())
    gt, go = float(np.sum(gains["gain_target"])), float(np.sum(gains["gain_other"]))
    return {"snr_predicted_from_train": math.sqrt(total_signal / total_crosstalk) if total_crosstalk > 0 else math.inf,
            "acc_predicted_from_train": read_accuracy(snr_reads, reads.candidates, stats.value_dim, pairs),
            "n_eff_from_train": go / gt if gt > 0 else math.inf, "pairs_from_train": pairs}


BASELINES = ("acc_baseline_nominal", "acc_baseline_anchored")


def flat_counts(reads: Reads, span: int) -> tuple[np.ndarray, np.ndarray]:
    """Per read (target gain, other writes' gain) with every earlier write counted once: the
    random-key law's count, no decay and no write scale."""
    g = survival_sums(reads, span, (0.0,))
    return g["gain_target"], g["gain_other"]


def flat_n_eff(reads: Reads, span: int) -> float:
    """N_flat of a setting: the other writes over the target writes, summed over its reads."""
    target, other = flat_counts(reads, span)
    total = float(np.sum(target))
    return float(np.sum(other)) / total if total > 0 else math.inf


def predict_baselines(stats: TrainStats, reads: Reads) -> dict[str, float]:
    """The two naive extrapolations of the module docstring at the setting of `reads`, through
    the same accuracy map as the law (read_accuracy with the training codebook and the
    target's candidates): {acc_baseline_nominal, acc_baseline_anchored}, NaN where a number
    they need is missing."""
    if reads.position.size == 0:
        return dict.fromkeys(BASELINES, math.nan)
    target, other = flat_counts(reads, stats.span)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_write = np.where(other > 0, target / other, np.inf)  # 1 / N_flat(i)
    pairs = float(np.median(np.where(other > 0, other, 0.0)))  # every write at gain 1: P = the count
    anchor = stats.snr_readout ** 2 * stats.n_eff_flat
    out = {}
    for name, scale in zip(BASELINES, (stats.d_key, anchor)):
        snr = np.sqrt(scale * per_write) if math.isfinite(scale) else None
        out[name] = read_accuracy(snr, reads.candidates, stats.value_dim, pairs) if snr is not None else math.nan
    return out
