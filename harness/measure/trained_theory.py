"""The crosstalk law evaluated with a trained model's own statistics.

`harness.measure.trained` predicts a trained head's SNR as sqrt(d_key / N_eff) with d_key the
state's nominal key dimension, the number random keys would give. This module measures instead
what the law needs from the model's own keys and queries, at the reads the task scores (the
query positions, target = the answer span, as in harness.measure.trained), and evaluates the
law and the accuracy model of harness.measure.theory with them:

  kernel        kappa_ij = phi(q_i).phi(k_j), the similarity the mixer scores position j with
                (q_i.k_j for retnet and mamba, exp(q.k / sqrt(d)) for softmax). Read off the
                effective weights: a_ij g_j = kappa_ij g_ij / den_i, where g_ij is the survival
                weight of write j at read i (trained.decay_gain_sq: 1 without decay, the decay
                product for retnet, times the write scale dt_j for mamba, whose hooked v is
                already dt-scaled) and den_i a per-read normaliser that cancels below.
  d_kernel      the kernel's effective dimension, the trained analogue of
                theory.kernel_effective_dim's kappa(k,k)^2 / E kappa(k,k')^2 with the model's
                own query in place of the stored key: the decay-weighted mean of kappa^2 on the
                answer span over that on the other writes,
                  d_kernel = sum_i [sum_{j in span} a_ij^2 / sum_{j in span} g_ij^2]
                           / sum_i [sum_{j not in span} a_ij^2 / sum_{j not in span} g_ij^2].
                Random keys through the identity map give d; elu+1 about 2 (the untrained
                probe's numbers); a sharp trained kernel gives more.
  N_eff         the decay-weighted count of other writes, per read
                sum_{j not in span} g_ij^2 / sum_{j in span} g_ij^2 (as in trained.py); its
                participation P = (sum g^2)^2 / sum g^4 over the other writes.
  codebook      the values the task can answer with: candidates C = the distinct target
                tokens of the batch; the value vectors of the written answers (hooked v at the
                answer position, divided by dt for mamba), averaged per target token, are the
                codebook, and value_dim is its effective dimension, the participation ratio
                (tr S)^2 / tr S^2 of its covariance corrected for the finite number of entries
                ((tr S)^2 / (tr S^2 - (tr S)^2 / C): C random directions in R^d give d, not
                d / (1 + d / C)), capped at the head's value width.
  read-out      snr_readout_trained = sqrt(d_kernel / N_eff) (theory.predicted_snr, N_eff
                pooled as a ratio of sums, like the measured SNR); acc_readout_trained = the
                mean over reads of theory.predicted_accuracy(sqrt(d_kernel / N_eff_i), C,
                value_dim, P) with P the median over reads (as the untrained probe does).
                Both are read off the weights at the setting they describe: an analysis of
                the read-out there, not a prediction of it.

Heads read out together. A mixer whose read-out concatenates several heads of its effective
weights (`heads_per_readout`: mamba's decay heads of one q/k group, each a slice of v with its
own decay) is predicted per read-out: the group's sums are pooled (sum_h sum_span a_h^2 over
sum_h sum_span g_h^2, and so on) and its codebook is the concatenation of the heads' values,
so that d_kernel / N_eff is the group's sum_span a^2 / sum_other a^2. Every head of the group
carries the group's numbers.

Per read, d_kernel / N_eff_i is exactly sum_span a^2 / sum_other a^2: the SNR the weights give
if the values were random directions. Where the measured SNR differs, the trained values are
not (the values of other pairs share components with the answer's, or the crosstalk has
structure the law ignores); where acc_readout_trained differs from the measured accuracy,
the read-out is decoded by more than a nearest-codebook match of this one head.

Out of sample (`train_statistics`, `add_out_of_sample`). The same statistics, measured once at
the training setting on validation data for the retrieval head chosen there, are what
harness.measure.out_of_sample carries to every other N and length: per head of the read-out
the mean kappa^2 on the answer and on the other writes, the mean log decay per step, the
target write gain, and the codebook's value_dim (results.json `train_stats`); the
predictions (snr_predicted_from_train, acc_predicted_from_train) come from them and the
setting's layout alone. `law_of` says which law a mixer's read-out follows.

Known answer: random keys on the sphere, each query equal to its stored key, written into the
model's state in place of what its projection computes, give the untrained probe's d_kernel,
snr_kernel and acc_kernel (harness.measure.probe; tests/test_trained_theory.py).

Cost: one forward pass under `capture`, then per example and layer the (H, R, T) effective
weights of its R query rows, on the first `max_examples` examples (trainer.measure_examples).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np
import torch

from harness.hooks import capture
from harness.layers.protocol import lacks, mixer_hooks
from harness.measure import theory
from harness.measure.out_of_sample import (BASELINES, TrainStats, fit_delta_dim, flat_n_eff, law_n_eff,
                                           no_prediction, predict_baselines, predict_from_train, read_accuracy,
                                           reads_of)
from harness.measure.trained import answer_span, decay_gain_sq, span_mask
from harness.tasks.base import batch_field

COLUMNS = ("d_kernel", "n_eff", "pairs", "value_dim", "candidates", "snr_readout_trained",
           "acc_readout_trained")
SUMS = ("kernel_target", "kernel_other", "gain_target", "gain_other", "gain_other_sq")


def read_sums(a: torch.Tensor, g2: torch.Tensor, target_pos: torch.Tensor, positions: torch.Tensor,
              span: int) -> dict[str, torch.Tensor]:
    """Per-read sums the law needs, each (..., R) float64.

    a: (..., R, T) effective weights on unit-scale values (a_ij times the write scale);
    g2: (..., R, T) squared survival weights g_ij^2 (zero above each read's position);
    target_pos: (..., R), -1 for rows without a target; positions: (R,) the reads' positions.

      kernel_target  sum_{j in span} a_ij^2 / sum_{j in span} g_ij^2   (mean kappa^2 on the answer)
      kernel_other   sum_{j not in span} a_ij^2 / sum_{j not in span} g_ij^2   (... on the rest)
      gain_target, gain_other, gain_other_sq   sum g^2 on the span, sum g^2 and sum g^4 off it
    Rows without a target, or whose span or crosstalk holds no surviving write, are 0.
    """
    a2, g2 = a.to(torch.float64).square(), g2.to(torch.float64)
    T = a.shape[-1]
    prefix = torch.arange(T, device=a.device) <= positions.to(a.device).unsqueeze(-1)  # (R, T)
    on = span_mask(target_pos.to(a.device), T, span) & prefix  # (..., R, T)
    off = prefix & ~on
    zero = torch.zeros((), dtype=torch.float64, device=a.device)

    def total(x, mask):
        return torch.where(mask, x, zero).sum(-1)

    gt, go = total(g2, on), total(g2, off)
    keep = (target_pos.to(a.device) >= 0) & (gt > 0) & (go > 0)
    safe = lambda x: torch.where(keep, x, torch.ones_like(x))  # noqa: E731
    out = {
        "kernel_target": total(a2, on) / safe(gt),
        "kernel_other": total(a2, off) / safe(go),
        "gain_target": gt,
        "gain_other": go,
        "gain_other_sq": total(g2.square(), off),
    }
    return {k: torch.where(keep, v, zero) for k, v in out.items()}


def pool_heads(sums: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`read_sums` of heads read out together, (B, g, T) each -> the group's (B, T): the sums of
    a^2 and g^2 add over the heads, the kernel means are re-formed from them."""
    gt, go = sums["gain_target"].sum(1), sums["gain_other"].sum(1)
    st = (sums["kernel_target"] * sums["gain_target"]).sum(1)  # sum_h sum_span a^2
    so = (sums["kernel_other"] * sums["gain_other"]).sum(1)
    safe = lambda x: torch.where(x > 0, x, torch.ones_like(x))  # noqa: E731
    return {"kernel_target": torch.where(gt > 0, st / safe(gt), 0.0),
            "kernel_other": torch.where(go > 0, so / safe(go), 0.0),
            "gain_target": gt, "gain_other": go, "gain_other_sq": sums["gain_other_sq"].sum(1)}


def codebook_dimension(vectors: torch.Tensor, labels: torch.Tensor) -> tuple[float, int]:
    """(effective dimension, entries) of the codebook: `vectors` (n, D) averaged per label.

    The participation ratio of the entries' covariance, (tr S)^2 / tr S^2, with the finite-C
    correction tr S^2 - (tr S)^2 / C (module docstring), capped at D; NaN with < 3 entries.
    """
    labels = labels.long()
    uniq, inverse = torch.unique(labels, return_inverse=True)
    C, D = uniq.numel(), vectors.shape[-1]
    if C < 3:
        return math.nan, C
    v = vectors.to(torch.float64)
    sums = torch.zeros(C, D, dtype=torch.float64).index_add_(0, inverse, v)
    counts = torch.zeros(C, dtype=torch.float64).index_add_(0, inverse, torch.ones_like(inverse, dtype=torch.float64))
    book = sums / counts[:, None]
    book = book - book.mean(0, keepdim=True)
    cov = book.T @ book / C  # (D, D)
    tr, tr2 = float(torch.trace(cov)), float((cov * cov).sum())
    excess = tr2 - tr * tr / C
    if tr <= 0:
        return math.nan, C
    dim = tr * tr / excess if excess > 0 else float(D)
    return float(min(dim, D)), C


def predict(sums: dict[str, np.ndarray], value_dim: float, candidates: int) -> dict[str, float]:
    """d_kernel, N_eff, P and the predicted SNR and accuracy from per-read sums (1-D arrays of
    the reads of one group, rows without a target already dropped)."""
    kt, ko = sums["kernel_target"], sums["kernel_other"]
    gt, go, go2 = sums["gain_target"], sums["gain_other"], sums["gain_other_sq"]
    nan = {c: math.nan for c in COLUMNS}
    if kt.size == 0 or ko.sum() <= 0 or gt.sum() <= 0:
        return {**nan, "value_dim": value_dim, "candidates": candidates}
    d_kernel = float(kt.sum() / ko.sum())
    n_eff = float(go.sum() / gt.sum())
    with np.errstate(divide="ignore", over="ignore"):  # a target decayed to nothing: N_read = inf, chance
        n_read = go / gt
    pairs = float(np.median(go**2 / go2))
    return {"d_kernel": d_kernel, "n_eff": n_eff, "pairs": pairs, "value_dim": value_dim,
            "candidates": candidates, "snr_readout_trained": float(theory.predicted_snr(d_kernel, n_eff)),
            "acc_readout_trained": read_accuracy(np.sqrt(d_kernel / n_read), candidates, value_dim, pairs)}


def _layer(mixer, hooks: dict, target_pos: torch.Tensor, query: torch.Tensor, span: int):
    """Per-read sums (B, H, T) float64 on the CPU and the codebook's value vectors of one layer."""
    log_decay, dt = hooks.get("log_decay"), hooks.get("dt")
    B, T = query.shape
    sums, values = None, []
    for b in range(B):  # one example at a time keeps the (H, R, T) temporaries small
        pos = query[b].nonzero().squeeze(-1)  # (R,)
        if pos.numel() == 0:
            continue
        a = mixer.effective_weights({k: v[b:b + 1] for k, v in hooks.items()}, rows=pos)[0]  # (H, R, T)
        H, dev = a.shape[0], pos.to(a.device)
        if dt is not None:  # SSD writes k (dt v)^T: the hooked v carries dt, unit-scale values do not
            a = a * dt[b].to(a.dtype).unsqueeze(-2)
        ld = None if log_decay is None else log_decay[b]
        g2 = decay_gain_sq(ld, T, per_dim=ld is not None and ld.dim() == 3, positions=dev,
                           write_scale=None if dt is None else dt[b], device=a.device).expand(H, -1, -1)
        tp = target_pos[b, pos].to(a.device).expand(H, -1)  # (H, R)
        found = read_sums(a, g2, tp, dev, span)
        if sums is None:
            sums = {n: torch.zeros(B, H, T, dtype=torch.float64) for n in SUMS}
        for name, value in found.items():
            sums[name][b][:, pos] = value.cpu()
        t = target_pos[b, pos].long()  # (R,) the answers' positions
        v = hooks["v"][b][:, t.to(hooks["v"].device)].to(torch.float64)  # (H, R, Dv)
        if dt is not None:
            v = v / dt[b][:, t.to(dt.device)].to(torch.float64).unsqueeze(-1)
        values.append(v.cpu())
    return sums, values


def measure_trained_theory(model, batch, *, max_examples: Optional[int] = None,
                           retrieval: Optional[tuple[int, int]] = None) -> dict:
    """The trained-statistics law for every layer, head and slice value of `model` on `batch`.

    batch: a task Batch (inputs, targets, target_pos, slice_value, slice_name; a dict works
    too); the first `max_examples` examples are measured, the candidates counted over all of
    them. retrieval: the (layer, head) whose pooled numbers go into the summary (the retrieval
    head of harness.measure.trained.measure_model); None: no summary.

    Returns {"rows": {(layer, head, value): {column: value}}, "summary": {...}, "status": str}.
    """
    targets = batch_field(batch, "targets")
    target_pos_all = batch_field(batch, "target_pos")
    candidates = int(torch.unique(targets[target_pos_all >= 0]).numel())
    inputs = batch_field(batch, "inputs")[:max_examples]
    target_pos = target_pos_all[:max_examples].cpu()
    answers = targets[:max_examples].cpu()
    slice_value = batch_field(batch, "slice_value")[:max_examples].cpu()
    query = target_pos >= 0  # (B, T)
    device = next(model.parameters()).device

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), capture(model, names=lambda name: ".mixer.hook_" in name) as cache:
            model(inputs.to(device))
    finally:
        model.train(was_training)

    span = answer_span(model)
    values = sorted(int(x) for x in torch.unique(slice_value[query]).tolist())
    rows, summary, status, group = {}, {}, "ok", None
    for layer, mixer in enumerate(model.mixers()):
        hooks = mixer_hooks(mixer, cache, f"layers.{layer}.mixer.")
        why = lacks(mixer, "effective_weights") or (None if "v" in hooks else "skipped: no hook_v")
        if why:
            status = why
            continue
        with torch.no_grad():
            sums, value_rows = _layer(mixer, hooks, target_pos, query, span)
        if sums is None:
            continue
        labels = torch.cat([answers[b][query[b]] for b in range(query.shape[0]) if query[b].any()])
        vectors = torch.cat(value_rows, dim=1)  # (H, reads, Dv)
        g = int(getattr(mixer, "heads_per_readout", 1) or 1)
        for first in range(0, vectors.shape[0], g):
            heads = list(range(first, first + g))
            book = vectors[first:first + g].transpose(0, 1).reshape(vectors.shape[1], -1)  # (reads, g Dv)
            value_dim, _ = codebook_dimension(book, labels)
            pooled = pool_heads({n: sums[n][:, first:first + g] for n in SUMS})  # (B, T) each
            groups = [(value, query & (slice_value == value)) for value in values] + [(None, query)]
            for value, sel in groups:
                per_read = {n: x[sel].numpy() for n, x in pooled.items()}
                keep = per_read["gain_target"] > 0
                found = predict({n: x[keep] for n, x in per_read.items()}, value_dim, candidates)
                for h in heads:
                    if value is not None:
                        rows[(layer, h, value)] = found
                    elif retrieval == (layer, h):
                        summary = found
                        group = {"layer": layer, "heads": heads, "span": span, "law": law_of(mixer),
                                 **_head_statistics({n: sums[n][:, first:first + g] for n in SUMS},
                                                    hooks, heads, query, target_pos, span)}
    return {"rows": rows, "summary": summary, "status": status, "group": group}


def _head_statistics(sums: dict[str, torch.Tensor], hooks: dict, heads: list[int], query: torch.Tensor,
                     target_pos: torch.Tensor, span: int) -> dict:
    """What the out-of-sample law carries from this setting, per head of one read-out
    (harness.measure.out_of_sample): the mean kappa^2 on the answer span and on the other writes
    over the reads where the head holds both, the mean log decay per step (per key dimension;
    0 without decay) and the target write gain (mean squared write scale on the answer spans
    over that on all positions; 1 without one)."""
    kernel_target, kernel_other = [], []
    for h in range(len(heads)):
        ok = query & (sums["gain_target"][:, h] > 0) & (sums["gain_other"][:, h] > 0)  # (B, T)
        kernel_target.append(float(sums["kernel_target"][:, h][ok].mean()) if ok.any() else math.nan)
        kernel_other.append(float(sums["kernel_other"][:, h][ok].mean()) if ok.any() else math.nan)
    log_decay, dt = hooks.get("log_decay"), hooks.get("dt")
    if log_decay is None:
        decay = [(0.0,)] * len(heads)
    else:
        ld = log_decay[:, heads].to(torch.float64).cpu()  # (B, g, T) or (B, g, T, Dk)
        per_head = ld.mean((0, 2)) if ld.dim() == 4 else ld.mean((0, 2))[:, None]  # (g, Dk or 1)
        decay = [tuple(float(x) for x in row) for row in per_head]
    gain = [1.0] * len(heads)
    if dt is not None:
        w2 = dt[:, heads].to(torch.float64).cpu().square()  # (B, g, T)
        T = w2.shape[-1]
        b, i = query.nonzero(as_tuple=True)
        on = (target_pos[b, i].long()[:, None] + torch.arange(span)).clamp(max=T - 1)  # (R, span)
        gain = [float(w2[b[:, None], h, on].mean() / w2[:, h].mean()) for h in range(len(heads))]
    return {"kernel_target": kernel_target, "kernel_other": kernel_other, "log_decay": decay,
            "target_write_gain": gain}


def merge_rows(heads: list[dict], found: dict) -> list[dict]:
    """heads rows (harness.measure.trained) with this module's columns added by (layer, head, value)."""
    return [{**row, **found["rows"].get((row["layer"], row["head"], row["value"]), {})} for row in heads]


def law_of(mixer) -> str:
    """Which out-of-sample law describes `mixer`'s read-out (harness.measure.out_of_sample):
    "delta" for the delta rule, "additive" for the other states and for softmax read as a kernel
    over its cache, "not applicable: <why>" for a window or an undeclared family."""
    family = getattr(mixer, "family", "")
    if getattr(mixer, "window", None) is not None:
        return "not applicable: window (the law counts every write of the prefix)"
    if family == "delta":
        return "delta"
    if family in ("linear", "decay", "softmax"):
        return "additive"
    return f"not applicable: family {family!r}"


# --------------------------------------------------------------------------------------------
# The predictive mode: statistics of the training setting, predictions everywhere else.


def train_statistics(model, batch, *, max_examples: Optional[int] = None, num_pairs: Optional[int] = None,
                     retrieval: Optional[tuple[int, int]] = None) -> tuple[Optional[TrainStats], str]:
    """(TrainStats, "ok") of `model` on `batch`, a batch at the training setting (validation
    data), for the (layer, head) `retrieval`, by default the retrieval head chosen on this batch
    (harness.measure.trained.measure_model); (None, why) where the statistics cannot be
    measured. num_pairs: the training N, recorded."""
    from harness.measure.trained import measure_model

    if retrieval is None:
        chosen = measure_model(model, batch, max_examples=max_examples)["summary"]
        retrieval = (chosen.get("retrieval_layer"), chosen.get("retrieval_head"))
    if None in retrieval:
        return None, "skipped: no retrieval head"
    found = measure_trained_theory(model, batch, max_examples=max_examples, retrieval=retrieval)
    group, summary = found["group"], found["summary"]
    if group is None or not summary:
        return None, found["status"] if found["status"] != "ok" else "skipped: no reads"
    stats = TrainStats(
        law=group["law"], span=group["span"], kernel_target=tuple(group["kernel_target"]),
        kernel_other=tuple(group["kernel_other"]), log_decay=tuple(group["log_decay"]),
        target_write_gain=tuple(group["target_write_gain"]), value_dim=summary["value_dim"],
        candidates=summary["candidates"], d_kernel=summary["d_kernel"], n_eff=summary["n_eff"],
        pairs=summary["pairs"], snr_readout=summary["snr_readout_trained"],
        acc_readout=summary["acc_readout_trained"], seq_len=int(batch_field(batch, "inputs").shape[1]),
        num_pairs=num_pairs, layer=group["layer"], head=retrieval[1])
    reads = reads_of(batch, max_examples)  # the reads the statistics were measured on
    d_key = getattr(model.mixers()[group["layer"]], "d_key", None)
    stats = dataclasses.replace(stats, n_eff_law=law_n_eff(stats, reads), n_eff_flat=flat_n_eff(reads, stats.span),
                                d_key=float(d_key) if d_key else math.nan)
    if stats.law == "delta":
        stats = dataclasses.replace(stats, d_delta=fit_delta_dim(stats, reads))
    return stats, "ok"


TRAIN_SETTING_STREAM = 7918  # the training setting's validation batch: seed * 7919 + this, no
                             # evaluation setting's (those are seed * 7919 + i, i < 7918)


def add_out_of_sample(results: dict, model, task, task_cfg, eval_sets, *, examples: int,
                      max_examples: Optional[int], seed: int) -> dict:
    """The predictive mode at the end of a run: statistics at the training setting (`examples`
    validation examples of task_cfg, the first `max_examples` measured), then predictions at
    every evaluation setting from its layout alone.

    task: the task module (make_batch); eval_sets: objects with .name and .batch. Writes
    results["train_stats"] (TrainStats.as_dict() and a status) and adds snr_predicted_from_train,
    acc_predicted_from_train, n_eff_from_train and pairs_from_train, and the baselines beside them
    (acc_baseline_nominal, acc_baseline_anchored: out_of_sample.predict_baselines), to each
    results["settings"] row of the same name; returns the summary entries snr_predicted_from_train/<name>,
    acc_predicted_from_train/<name> and acc_predicted_from_train (their mean, like accuracy).
    """
    device = next(model.parameters()).device
    batch = task.make_batch(task_cfg, examples, seed=seed * 7919 + TRAIN_SETTING_STREAM, device=device,
                            split="val")
    stats, status = train_statistics(model, batch, max_examples=max_examples,
                                     num_pairs=getattr(task_cfg, "num_pairs", None))
    results["train_stats"] = {"status": status, **(stats.as_dict() if stats else {})}
    predicted = {es.name: ({**predict_from_train(stats, reads_of(es.batch)), **predict_baselines(stats, reads_of(es.batch))}
                           if stats else {**no_prediction(), **dict.fromkeys(BASELINES, math.nan)})
                 for es in eval_sets}
    for row in results.get("settings", []):
        row.update(predicted.get(row["name"], {}))
    summary = {}
    for name, found in predicted.items():
        summary[f"snr_predicted_from_train/{name}"] = found["snr_predicted_from_train"]
        summary[f"acc_predicted_from_train/{name}"] = found["acc_predicted_from_train"]
        for baseline in BASELINES:
            summary[f"{baseline}/{name}"] = found[baseline]
    accs = [found["acc_predicted_from_train"] for found in predicted.values()]
    summary["acc_predicted_from_train"] = float(np.mean(accs)) if accs else math.nan
    return summary
