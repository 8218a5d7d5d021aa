"""Sharpness and signal-to-noise of trained models, read through the model's hook points.

Nothing here re-implements a mixer. One forward pass under `capture` records, per layer, the
q, k, v (and log_decay) exactly as they were fed to the op; the mixer's own
`effective_weights` turns them into a_ij with the matching ops.*_weights function:

  softmax       a_ij = softmax_j(q_i.k_j / sqrt(d))
  kernel        a_ij = phi(q_i).phi(k_j) / sum_l phi(q_i).phi(k_l)     (normalised; linear: undivided)
  retnet/mamba  a_ij = q_i . (prod_{j<s<=i} a_s) k_j                    (decay-weighted, unnormalised)

so that o_i = sum_j a_ij v_j reproduces the op's read-out (hook_out).

The answer span. With the short convolution on v (width w), the value written at position t
also reaches v_{t+1} ... v_{t+w-1}: a head may read the answer from any of them. So the
"correct key" of a query is the span t ... t+w-1 (w = model.conv_size with model.short_conv,
else 1): target_weight sums p over it, its rank is that of its largest weight, the signal is
sum over the span of a_ij v_j, and the span's writes are the target's in N_eff.

Sharpness is measured on the normalised magnitudes p_ij = |a_ij| / sum_{l<=i} |a_il| over the
causal prefix (for softmax and positive feature maps p = a).

SNR, measured: at a query position i with answer position t, signal = a_it v_t and noise =
o_i - signal; per (layer, head, slice) SNR = sqrt(sum_i |signal_i|^2 / sum_i |noise_i|^2).

SNR, predicted (harness.measure.theory.predicted_snr): sqrt(d_eff / N_eff) with d_eff = the state's key
dimension (model.d_key: d_head, m for favor, 1 + d + d^2 for taylor) and N_eff the crosstalk
count of theory.crosstalk_pairs: for a read at i of target t,

    N_eff_i = sum_{j<=i, j!=t} g_ij^2 / g_it^2

where g_ij is the survival weight of position j's write at the time of the read: 1 for softmax
and kernel mixers, gamma^(i-j) for retnet, dt_j exp(sum_{j<s<=i} dt_s A) for mamba (the write
scale dt_j included, as SSD writes k (dt v)^T); for the per-dimension gate the squared decay is
averaged over key dimensions. The state holds one write per earlier position (keys, values and
queries alike), not one per pair, so for undecayed mixers N_eff is the number of other
positions in the prefix. Like the measured SNR, a group's prediction is a ratio of sums:
N_eff = sum_i sum_{j!=t} g_ij^2 / sum_i g_it^2 (theory.aggregate_pairs). For softmax it is the
prediction for a linear state of the same key dimension: the reference that softmax's measured
SNR is compared against, not a law softmax obeys.

Cost: forward passes of MEASURE_TOKENS tokens at a time (`trainer.measure_examples` examples,
64 by default), each reduced at once to per-row statistics: per example and layer the
(H, R, T) weights of its R query rows, never a (T, T) matrix, so memory is O(Q T) at any length.
"""

from __future__ import annotations

import math
from typing import Optional

import scipy.stats
import torch

from harness.hooks import capture
from harness.layers.preflight import ignored as protocol_ignored
from harness.layers.preflight import member
from harness.layers.preflight import skipped as protocol_skipped
from harness.measure.jacobian import JACOBIAN_EXAMPLES, LABEL as JACOBIAN_LABEL, jacobian_weights
from harness.layers.protocol import lacks, mixer_hooks
from harness.measure.theory import predicted_snr
from harness.tasks.base import batch_field

METRICS = ("entropy", "norm_entropy", "eff_support", "max_weight", "target_weight", "target_rank", "monotonicity")


# --------------------------------------------------------------------------------------------
# Sharpness of any (..., T, T) weight tensor, or of selected rows of one.


def _prefix_mask(positions: torch.Tensor, T: int) -> torch.Tensor:
    """(..., R, T) bool: j <= position of row r (the causal prefix each row reads)."""
    return torch.arange(T, device=positions.device) <= positions.unsqueeze(-1)


def span_mask(target_pos: torch.Tensor, T: int, span: int = 1) -> torch.Tensor:
    """(..., R, T) bool: j in [t, t + span - 1] for each row's target t (all False for t = -1)."""
    j = torch.arange(T, device=target_pos.device)
    t = target_pos.long().unsqueeze(-1)
    return (t >= 0) & (j >= t) & (j < t + span)


def _midranks(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Ranks of x along the last dim among the valid entries, ties given their mean rank
    (scipy.stats.rankdata); invalid entries rank above every valid one."""
    x = torch.where(valid, x, torch.full_like(x, math.inf)).detach().cpu().numpy()
    return torch.from_numpy(scipy.stats.rankdata(x, axis=-1, method="average") - 1.0).to(valid.device)


def spearman_rows(a: torch.Tensor, b: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Spearman correlation of a and b along the last dim over the valid entries of each row.

    NaN where a row has fewer than two valid entries or either side is constant.
    """
    a, b = a.to(torch.float64), b.to(torch.float64)
    n = valid.sum(-1, keepdim=True).to(torch.float64)
    ra = torch.where(valid, _midranks(a, valid), torch.zeros_like(a))
    rb = torch.where(valid, _midranks(b, valid), torch.zeros_like(b))
    ra = torch.where(valid, ra - ra.sum(-1, keepdim=True) / n, ra)
    rb = torch.where(valid, rb - rb.sum(-1, keepdim=True) / n, rb)
    cov = (ra * rb).sum(-1)
    var = ra.pow(2).sum(-1) * rb.pow(2).sum(-1)
    return torch.where(var > 0, cov / var.clamp_min(1e-300).sqrt(), torch.full_like(cov, math.nan))


def sharpness(
    weights: torch.Tensor,
    target_pos: Optional[torch.Tensor] = None,
    *,
    scores: Optional[torch.Tensor] = None,
    positions: Optional[torch.Tensor] = None,
    span: int = 1,
) -> dict[str, torch.Tensor]:
    """Per-row sharpness of causal attention weights.

    weights: (..., T, T), row i = the weights query i puts on positions j <= i (entries above
        the diagonal are ignored); or (..., R, T) selected rows with their query `positions`
        ((R,) or (..., R) long). Signed or unnormalised weights are allowed: the distribution
        is p_ij = |a_ij| / sum_{l<=i} |a_il|.
    target_pos: (..., R) long, broadcastable to weights.shape[:-1]; the correct position of each
        row, -1 for rows without one (then target_weight / target_rank are NaN). With span > 1
        the target is the span t ... t+span-1 (see the module docstring).
    scores: (..., R, T) softmax-style scores q_i.k_j / sqrt(d) of the q and k before any feature
        map (hook_q_raw, hook_k_raw); gives monotonicity, Hedgehog's (Zhang et al. 2024): the
        Spearman correlation of the signed a_ij with the score over the prefix, i.e. how well
        the mixer's weights keep the order softmax would give the same keys on the same inputs
        (1: exactly that order). Softmax (the exponential of the score) and the identity map
        (the score itself) have 1 by construction: for them it is no finding.

    Returns tensors of shape (..., R), in float64:
      entropy        H_i = -sum_j p_ij log p_ij           (uniform over n: log n; one-hot: 0)
      norm_entropy   H_i / log(i + 1)                      (NaN at i = 0)
      eff_support    exp(H_i)
      max_weight     max_j p_ij
      target_weight  p_i,target (summed over the span)
      target_rank    1 + #{j: p_ij > p_it} + #{j != t: p_ij = p_it} / 2    (1 = the top weight;
                     p_it the span's largest weight, j outside the span)
      monotonicity   only when scores is given
    """
    R, T = weights.shape[-2:]
    w = weights.to(torch.float64)
    if positions is None:
        if R != T:
            raise ValueError(f"weights must be (..., T, T) unless positions are given, got {tuple(weights.shape)}")
        positions = torch.arange(T, device=w.device)
    positions = positions.to(w.device).long().expand(w.shape[:-1])  # (..., R)
    prefix = _prefix_mask(positions, T)  # (..., R, T)
    mag = torch.where(prefix, w.abs(), torch.zeros_like(w))
    p = mag / mag.sum(-1, keepdim=True)  # NaN rows where all weights are zero
    entropy = -torch.where(p > 0, p * torch.log(p), torch.zeros_like(p)).sum(-1)
    nan = torch.full_like(entropy, math.nan)
    log_n = torch.log1p(positions.to(torch.float64))
    out = {
        "entropy": entropy,
        "norm_entropy": torch.where(positions > 0, entropy / log_n.clamp_min(1e-300), nan),
        "eff_support": torch.exp(entropy),
        "max_weight": p.amax(-1),
    }
    if target_pos is not None:
        tp = target_pos.to(w.device).long().expand(w.shape[:-1])  # (..., R)
        valid = (tp >= 0) & (tp <= positions)
        in_span = span_mask(tp, T, span) & prefix  # (..., R, T)
        p0 = torch.nan_to_num(p, nan=0.0)
        pt = torch.where(in_span, p0, torch.zeros_like(p0)).amax(-1, keepdim=True)  # (..., R, 1)
        outside = prefix & ~in_span
        greater = ((p > pt) & outside).sum(-1)
        ties = ((p == pt) & outside).sum(-1)
        rank = 1.0 + greater.to(torch.float64) + ties.to(torch.float64) / 2
        weight = torch.where(in_span, p, torch.zeros_like(p)).sum(-1)
        out["target_weight"] = torch.where(valid, weight, nan)
        out["target_rank"] = torch.where(valid, rank, nan)
    if scores is not None:
        s = scores.to(device=w.device, dtype=torch.float64).expand(w.shape)
        out["monotonicity"] = spearman_rows(w, s, prefix)
    return out


# --------------------------------------------------------------------------------------------
# Signal / crosstalk decomposition.


def decay_gain_sq(
    log_decay: Optional[torch.Tensor],
    T: int,
    *,
    per_dim: bool = False,
    positions: Optional[torch.Tensor] = None,
    write_scale: Optional[torch.Tensor] = None,
    device=None,
) -> torch.Tensor:
    """g_ij^2: squared survival weight of position j's write when read at i, (..., R, T).

    g_ij = write_scale_j * prod_{j<s<=i} a_s (theory.decay_pair_weights). log_decay: None (no
    decay: 1 on the prefix), (..., T) scalar per step, or with per_dim=True (..., T, Dk) per key
    dimension (then the mean over Dk of the squared per-dimension decay). write_scale: (..., T)
    or None (1); mamba's dt. positions: (R,) the reading positions i (default all T).
    Returned in float64.
    """
    if log_decay is not None:
        device = log_decay.device
    if positions is None:
        positions = torch.arange(T, device=device)
    positions = positions.to(device).long()
    prefix = _prefix_mask(positions, T)  # (R, T)
    if log_decay is None:
        g2 = prefix.to(torch.float64)
    elif per_dim:  # (..., T, Dk)
        cum = log_decay.to(torch.float64).cumsum(-2)  # (..., T, Dk)
        diff = cum[..., positions, :].unsqueeze(-2) - cum.unsqueeze(-3)  # (..., R, T, Dk)
        g2 = torch.exp(2 * diff.masked_fill(~prefix.unsqueeze(-1), -math.inf)).mean(-1)
    else:
        cum = log_decay.to(torch.float64).cumsum(-1)  # (..., T)
        diff = cum[..., positions].unsqueeze(-1) - cum.unsqueeze(-2)  # (..., R, T)
        g2 = torch.exp(2 * diff.masked_fill(~prefix, -math.inf))
    if write_scale is not None:
        g2 = g2 * write_scale.to(device=g2.device, dtype=torch.float64).pow(2).unsqueeze(-2)
    return g2


def signal_noise(weights: torch.Tensor, v: torch.Tensor, target_pos: torch.Tensor, span: int = 1):
    """Split o_i = sum_j a_ij v_j into the target's term(s) and the crosstalk.

    weights (..., R, T) rows of causal effective weights (all T rows or selected ones), v
    (..., T, Dv), target_pos (..., R) (rows with -1 are returned as 0); the target's terms are
    those of its span t ... t+span-1. Returns (|signal|^2, |noise|^2), each (..., R).
    """
    w, v = weights.to(torch.float64), v.to(torch.float64)
    tp = target_pos.long().expand(w.shape[:-1])  # (..., R)
    on_target = torch.where(span_mask(tp, w.shape[-1], span), w, torch.zeros_like(w))
    signal = on_target @ v  # (..., R, Dv)
    noise = w @ v - signal  # (..., R, Dv)
    keep = (tp >= 0).to(torch.float64)
    return signal.pow(2).sum(-1) * keep, noise.pow(2).sum(-1) * keep


def crosstalk_mass(gain_sq: torch.Tensor, target_pos: torch.Tensor, span: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum_{j<=i, j!=t} g_ij^2, g_it^2), each (..., R); zeros for rows without a target. With
    span > 1, t stands for the target's span (gain_sq must be zero above the diagonal).

    Their ratio is one read's N_eff (theory.crosstalk_pairs); the ratio of their sums over many
    reads is the N_eff of the ratio-of-means SNR (theory.aggregate_pairs).
    """
    tp = target_pos.long().expand(gain_sq.shape[:-1])
    g_t = torch.where(span_mask(tp, gain_sq.shape[-1], span), gain_sq, torch.zeros_like(gain_sq)).sum(-1)
    keep = tp >= 0
    zero = torch.zeros_like(g_t)
    return torch.where(keep, gain_sq.sum(-1) - g_t, zero), torch.where(keep, g_t, zero)


def effective_count(gain_sq: torch.Tensor, target_pos: torch.Tensor) -> torch.Tensor:
    """N_eff_i = sum_{j<=i, j!=t} g_ij^2 / g_it^2, (..., R); NaN for rows without a target."""
    other, target = crosstalk_mass(gain_sq, target_pos)
    n = other / target
    return torch.where(target_pos.long().expand(n.shape) >= 0, n, torch.full_like(n, math.nan))


# --------------------------------------------------------------------------------------------
# Whole-model measurement.


def _layer_rows(mixer, hooks: dict, target_pos: torch.Tensor, query: torch.Tensor, span: int,
                with_snr: bool) -> Optional[dict]:
    """Statistics of one layer at the query rows of a few examples: each (H, R) float64 on the
    CPU, R the query rows of all the examples in order (NaN / 0 where a statistic is undefined).

    hooks: the layer's captured tensors by short name (harness.layers.protocol.mixer_hooks) for
    these examples. The read-out split needs hooks["v"] (with_snr); monotonicity needs q_raw and
    k_raw. Weights are built for the query rows only (effective_weights(hooks, rows)), one
    example at a time, so the temporaries are O(H R T), never (T, T).
    """
    log_decay, dt = hooks.get("log_decay"), hooks.get("dt")
    q_raw, k_raw = hooks.get("q_raw"), hooks.get("k_raw")
    B, T = query.shape
    parts: dict[str, list[torch.Tensor]] = {}
    for b in range(B):
        pos = query[b].nonzero().squeeze(-1)  # (R,) query positions
        if pos.numel() == 0:
            continue
        a = mixer.effective_weights({k: v[b:b + 1] for k, v in hooks.items()}, rows=pos)[0]  # (H, R, T)
        H, dev = a.shape[0], pos.to(a.device)
        tp = target_pos[b, pos].to(a.device).expand(H, -1)  # (H, R)
        scores = None
        if q_raw is not None and k_raw is not None:  # softmax's score on this mixer's own q and k
            scores = q_raw[b][:, dev].to(torch.float64) @ k_raw[b].to(torch.float64).transpose(-1, -2) \
                / math.sqrt(q_raw.shape[-1])  # (H, R, T)
        found = sharpness(a, tp, scores=scores, positions=dev, span=span)
        if with_snr:
            found["sig2"], found["noise2"] = signal_noise(a, hooks["v"][b], tp, span)
        ld = None if log_decay is None else log_decay[b]  # (H, T) or (H, T, Dk)
        g2 = decay_gain_sq(ld, T, per_dim=ld is not None and ld.dim() == 3, positions=dev,
                           write_scale=None if dt is None else dt[b], device=a.device)  # (H, R, T)
        found["other2"], found["target2"] = crosstalk_mass(g2.expand(H, -1, -1), tp, span)
        if ld is not None:  # the mean log decay per step over the example, per head
            mean = ld.to(torch.float64).flatten(1).mean(-1)  # (H,)
            found["log_decay"] = mean[:, None].expand(H, pos.numel())
        for name, value in found.items():
            parts.setdefault(name, []).append(value.detach().cpu())
    return {name: torch.cat(values, dim=1) for name, values in parts.items()} if parts else None


def _jacobian_rows(mixer, x: torch.Tensor, target_pos: torch.Tensor, query: torch.Tensor, span: int,
                   examples: int) -> Optional[dict]:
    """Sharpness statistics of one layer from the Jacobian estimate (harness.measure.jacobian)
    on the first `examples` examples of this pass (x: the mixer's inputs (B, T, C)), as
    _layer_rows; no read-out split, no monotonicity (it has no scores)."""
    parts: dict[str, list[torch.Tensor]] = {}
    for b in range(min(examples, query.shape[0])):
        pos = query[b].nonzero().squeeze(-1)  # (R,) query positions
        if pos.numel() == 0:
            continue
        a = jacobian_weights(mixer, x[b:b + 1], pos)  # (1, R, T)
        tp = target_pos[b, pos].to(a.device)[None]  # (1, R)
        found = sharpness(a, tp, positions=pos.to(a.device), span=span)
        found.setdefault("monotonicity", torch.full_like(found["entropy"], math.nan))  # no scores
        found["sig2"] = found["noise2"] = torch.zeros_like(found["entropy"])  # no read-out split
        T = x.shape[1]
        g2 = decay_gain_sq(None, T, per_dim=False, positions=pos.to(a.device), write_scale=None, device=a.device)
        found["other2"], found["target2"] = crosstalk_mass(g2.expand(1, -1, -1), tp, span)
        for name, value in found.items():
            parts.setdefault(name, []).append(value.detach().cpu())
    return {name: torch.cat(values, dim=1) for name, values in parts.items()} if parts else None


def _aggregate(stats: dict, h: int, sel: torch.Tensor, d_key: Optional[int], with_snr: bool) -> dict:
    """Means over the selected query rows (sel: (R,) bool) of head h; SNRs as ratios of sums
    (theory.aggregate_pairs); the mean log decay per step where the mixer has one."""
    out = {m: float(torch.nanmean(stats[m][h][sel])) for m in METRICS}
    total = lambda name: float(stats[name][h][sel].sum())  # noqa: E731
    noise, target = total("noise2"), total("target2")
    if with_snr:
        out["snr_measured"] = math.sqrt(total("sig2") / noise) if noise > 0 else math.inf
    if d_key:
        out["snr_predicted"] = float(predicted_snr(d_key, total("other2") / target)) if target > 0 else 0.0
    if "log_decay" in stats:
        out["log_decay"] = float(stats["log_decay"][h][sel].mean())
    return out


def answer_span(model) -> int:
    """Positions whose v carries a written value: the short convolution's width, else 1."""
    cfg = model.cfg
    return int(cfg.conv_size) if cfg.short_conv else 1


def _skip_reasons(mixer, hooks: dict) -> dict[str, str]:
    """Which measurements this mixer supports: "ok", or "skipped: <what it lacks>"."""
    sharp = lacks(mixer, "effective_weights")
    snr = sharp or (None if "v" in hooks else "skipped: no hook_v")
    theory = lacks(mixer, "d_key")
    return {"sharpness": sharp or "ok", "snr": snr or "ok", "snr_predicted": theory or "ok",
            **protocol_skipped(mixer),  # members the pre-flight found failing (state_size, ...)
            **protocol_ignored(mixer)}  # attributes that are the mixer's own (H3's kernel), not members


MEASURE_TOKENS = 1 << 14  # tokens per forward pass of the measurement (examples per pass = this // T)


@torch.no_grad()
def measure_model(model, batch, *, max_examples: Optional[int] = None, tokens: int = MEASURE_TOKENS,
                  weights: str = "auto") -> dict:
    """Sharpness and SNR of every layer and head of `model` on a task batch.

    batch: a task Batch (inputs, target_pos, slice_value, slice_name; a dict with those keys
    works too). The first `max_examples` examples are used (None: all of them); rows are
    averaged over query positions (target_pos >= 0), one row per (layer, head, slice value).
    The model runs in eval mode under `capture`, streamed over the examples: `tokens` tokens per
    forward pass (at least one example), each pass's hooks reduced to statistics of its query
    rows before the next, so memory is O(tokens + Q T) whatever the length T. Its mode is restored.

    Returns {"summary": {...}, "heads": [rows as in results.json], "measure": {...}}. The
    summary reports the examples used (measure_examples) and the retrieval head, the (layer,
    head) with the highest mean target weight over all query positions: target_weight,
    entropy, norm_entropy, snr_measured, snr_predicted, retrieval_layer, retrieval_head (NaN /
    None when the batch has no query positions), and log_decay (its mean log decay per step)
    for a decay mixer. "measure" says for each measurement "ok" or why it was skipped (a mixer
    that declares no effective_weights, no hook_v, no d_key).
    """
    inputs = batch_field(batch, "inputs")[:max_examples]
    target_pos = batch_field(batch, "target_pos")[:max_examples].cpu()
    slice_value = batch_field(batch, "slice_value")[:max_examples].cpu()
    slice_name = batch_field(batch, "slice_name")
    query = target_pos >= 0  # (B, T)
    device = next(model.parameters()).device
    B, T = query.shape
    group = max(1, tokens // max(1, T))  # examples per forward pass

    mixers = model.mixers()
    status: dict[str, str] = {}
    rows: list[dict[str, list]] = [{} for _ in mixers]  # per layer: statistic -> (H, R) parts
    # per layer: (with_snr, d_key, monotone_in_score), None = skipped
    setup: list[Optional[tuple]] = [None] * len(mixers)
    span = answer_span(model)
    was_training = model.training
    model.eval()
    estimated = [False] * len(mixers)  # per layer: weights by the Jacobian estimate
    seen = {}  # per layer: the mixer's input of this pass (for the Jacobian estimate)
    grabs = [m.register_forward_pre_hook(lambda mod, args, i=i: seen.__setitem__(i, args[0]))
             for i, m in enumerate(mixers)]
    try:
        for start in range(0, B, group):
            part = slice(start, start + group)
            with capture(model, names=lambda name: ".mixer.hook_" in name) as cache:
                model(inputs[part].to(device))
            for layer, mixer in enumerate(mixers):
                hooks = mixer_hooks(mixer, cache, f"layers.{layer}.mixer.")
                if start == 0:
                    reasons = _skip_reasons(mixer, hooks)
                    if weights == "jacobian" or reasons["sharpness"] == "skipped: no effective_weights":
                        estimated[layer] = True
                        reasons["sharpness"] = JACOBIAN_LABEL
                        reasons["snr"] = reasons["snr"] if reasons["snr"] != "ok" else \
                            "skipped: jacobian estimate (no read-out split)"
                    for what, why in reasons.items():
                        status[what] = why if status.get(what, "ok") == "ok" else status[what]
                    if reasons["sharpness"] in ("ok", JACOBIAN_LABEL):
                        setup[layer] = (reasons["snr"] == "ok" and not estimated[layer], getattr(mixer, "d_key", None),
                                        bool(member(mixer, "monotone_in_score")))
                if setup[layer] is None:
                    continue
                if estimated[layer]:
                    found = _jacobian_rows(mixer, seen[layer], target_pos[part], query[part], span,
                                           JACOBIAN_EXAMPLES - start)
                else:
                    found = _layer_rows(mixer, hooks, target_pos[part], query[part], span, setup[layer][0])
                for name, value in (found or {}).items():
                    rows[layer].setdefault(name, []).append(value)
            del cache
            seen.clear()
    finally:
        for grab in grabs:
            grab.remove()
        model.train(was_training)

    return _summarize(rows, setup, estimated, status, query, slice_value, slice_name)


def _summarize(rows: list[dict[str, list]], setup: list[Optional[tuple]], estimated: list[bool],
               status: dict[str, str], query: torch.Tensor, slice_value: torch.Tensor, slice_name) -> dict:
    """measure_model's result from the statistics its passes gathered: a row per (layer, head,
    slice value), and the summary of the retrieval head."""
    B, T = query.shape
    row_values = slice_value[query]  # (R,) the slice value of every query row, in row order
    # an estimated layer has rows for its first JACOBIAN_EXAMPLES examples only
    first = min(int(B), JACOBIAN_EXAMPLES)
    estimated_rows = slice_value[:first][query[:first]]
    heads, best = [], None
    for layer, found in enumerate(rows):
        if setup[layer] is None or not found:
            continue
        with_snr, d_key, monotone = setup[layer]
        layer_rows = estimated_rows if estimated[layer] else row_values
        values = sorted(int(x) for x in torch.unique(layer_rows).tolist())
        stats = {name: torch.cat(parts, dim=1) for name, parts in found.items()}  # (H, R)
        for h in range(stats["entropy"].shape[0]):
            for value in values:
                agg = _aggregate(stats, h, layer_rows == value, d_key, with_snr)
                # the Jacobian estimate merges a layer's heads into one row: no head to name
                head = None if estimated[layer] else h
                heads.append({"layer": layer, "head": head, "slice": slice_name, "value": value, "seq_len": T,
                              **({"heads_merged": True} if estimated[layer] else {}), **agg,
                              "monotone_in_score": monotone})
            pooled = _aggregate(stats, h, torch.ones_like(layer_rows, dtype=torch.bool), d_key, with_snr)
            if best is None or pooled["target_weight"] > best["target_weight"]:
                best = {**pooled, "retrieval_layer": layer, "retrieval_head": None if estimated[layer] else h}
    keys = ("target_weight", "entropy", "norm_entropy", "snr_measured", "snr_predicted")
    summary = {"measure_examples": int(B)}
    if any(estimated):
        summary.update(weights=JACOBIAN_LABEL, jacobian_examples=first)
    if best is not None:
        summary.update({k: best[k] for k in (*keys, "retrieval_layer", "retrieval_head", "log_decay") if k in best})
    elif status.get("sharpness") == "ok":
        summary.update({**{k: math.nan for k in keys}, "retrieval_layer": None, "retrieval_head": None})
    return {"summary": summary, "heads": heads, "measure": status}
