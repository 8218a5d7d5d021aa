"""Evaluation of a model on held-out batches: a batch per evaluation setting of the task, streamed
through the model in passes of about `trainer.eval_tokens` tokens, with accuracy and loss per
setting and per slice value (harness.train.loop evaluates on the validation split during training
and on the test split at the end).
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from harness.tasks import IGNORE, label_positions


@dataclass
class EvalSet:
    """A held-out batch for one evaluation setting (fixed for the whole run)."""
    name: str
    batch: Any
    seq_len: int


def setting_names(settings: list) -> list[str]:
    """A name per evaluation setting from the fields in which the settings differ, in the order
    of the task's Config ("num_pairs=8", "seq_len=1024,num_pairs=8", "seq_len=4096,depth=0.5");
    a single setting is named by its num_pairs where it has one, else "set0"."""
    rows = [dataclasses.asdict(s) if dataclasses.is_dataclass(s) else dict(vars(s)) for s in settings]
    fields = [f for f in rows[0] if len({repr(r.get(f)) for r in rows}) > 1] if rows else []
    if not fields and rows and "num_pairs" in rows[0]:
        fields = ["num_pairs"]
    if not fields:
        return [f"set{i}" for i in range(len(rows))]
    return [",".join(f"{f}={r[f]:g}" if isinstance(r[f], float) else f"{f}={r[f]}" for f in fields) for r in rows]


def make_eval_sets(module, tcfg, tr, seed: int, device: torch.device, split: str = "test") -> list[EvalSet]:
    """One held-out batch of `trainer.eval_examples` examples per evaluation setting of the task
    (its eval_settings: test N x test lengths, say), from the `split` stream: "val" is evaluated
    during training (early stop, and the split a sweep chooses learning rates on), "test" once
    at the end (the reported numbers). A task that trains on other settings than it tests (the
    recall task's mixture) names its validation settings with `val_settings`."""
    settings = module.eval_settings(tcfg)
    if split == "val" and hasattr(module, "val_settings"):
        settings = module.val_settings(tcfg)
    sets = []
    for i, (setting, name) in enumerate(zip(settings, setting_names(settings))):
        batch = module.make_batch(setting, tr.eval_examples, seed=seed * 7919 + i,
                                  device=device, split=split)
        sets.append(EvalSet(name=name, batch=batch, seq_len=batch.inputs.shape[1]))
    return sets


def periodic_sets(eval_sets: list[EvalSet], train_len: int) -> list[EvalSet]:
    """The sets evaluated every `trainer.eval_every` steps (and that early stopping watches):
    those no longer than the training length. Longer ones measure extrapolation, not training
    progress, and are evaluated once, at the end; when every set is longer (the run asks for
    nothing else), all are periodic."""
    return [es for es in eval_sets if es.seq_len <= train_len] or list(eval_sets)


def examples_per_pass(seq_len: int, tokens: int, examples: int | None = None) -> int:
    """Examples of length `seq_len` in one evaluation pass of `tokens` tokens (at least one;
    at most the set's `examples`): how `evaluate` streams a set (harness.train.memory estimates
    its peak from the same count)."""
    per = max(1, tokens // max(1, seq_len))
    return per if examples is None else min(per, examples)


EVAL_FORM = "chunk"  # evaluation runs the linear families in the chunk form: memory linear in T


def _eval_pass(model, inputs: torch.Tensor, targets: torch.Tensor, autocast):
    """One forward pass with the head at the labelled positions: (logits (B, K, V), targets (B, K),
    positions (B, K))."""
    positions, tgt = label_positions(targets)
    with autocast():
        logits = model(inputs, positions)
    return logits, tgt, positions


def _evaluate_set(model, es: EvalSet, autocast, per_pass: int) -> tuple[dict, list[dict]]:
    b = es.batch
    slices = b.slices() if hasattr(b, "slices") else [(b.slice_name, b.slice_value)]
    stale = getattr(b, "stale", None)  # (B, T) the old association's token, where a query has one
    correct, stale_hits, loss_sum, seen = [], [], 0.0, {name: [] for name, _ in slices}
    for s in range(0, b.inputs.shape[0], per_pass):
        part = slice(s, s + per_pass)
        logits, tgt, positions = _eval_pass(model, b.inputs[part], b.targets[part], autocast)
        mask = tgt != IGNORE  # (B, K)
        loss_sum += F.cross_entropy(logits[mask].float(), tgt[mask], reduction="sum").item()
        predicted = logits.argmax(-1)  # (B, K)
        correct.append((predicted == tgt)[mask])
        if stale is not None:
            old = stale[part].gather(1, positions)  # (B, K)
            stale_hits.append(((predicted == old) & (old != IGNORE))[mask])
        for name, value in slices:
            seen[name].append(value[part].gather(1, positions)[mask])
    hits = torch.cat(correct).float()
    said_stale = torch.cat(stale_hits) if stale is not None else None
    n = hits.numel()
    setting = {"name": es.name, "accuracy": hits.mean().item(), "loss": loss_sum / n, "count": n,
               "seq_len": es.seq_len}
    rows = []
    for name, parts in seen.items():
        values = torch.cat(parts)
        for v in torch.unique(values).tolist():
            sel = values == v
            rows.append({"slice": name, "value": int(v), "seq_len": es.seq_len,
                         "accuracy": hits[sel].mean().item(), "count": int(sel.sum())})
            if said_stale is not None:  # the queries answered with the old association's token
                rows[-1]["stale"] = int(said_stale[sel].sum())
    return setting, rows


def _eval_memory(model, es: EvalSet, autocast, per_pass: int) -> int:
    """Peak bytes of one evaluation pass at this setting's length (the streamed evaluation holds
    one pass at a time, so this is its peak), beyond the parameters and the held-out batch.
    CUDA: torch.cuda.max_memory_allocated. CPU: the live-memory tracker (harness.peak_memory), with
    the fused CPU chunk kernels off for the pass, as the tracker cannot see inside them (the
    batched forms they stand for hold at least as much)."""
    from harness.peak_memory import peak_memory
    from harness.ops import fused_cpu_enabled, set_fused_cpu

    device = es.batch.inputs.device
    inputs, targets = es.batch.inputs[:per_pass], es.batch.targets[:per_pass]
    existing = [*model.parameters(), *model.buffers(), es.batch.inputs, es.batch.targets]
    fused = fused_cpu_enabled()
    set_fused_cpu(fused and device.type != "cpu")
    try:
        return peak_memory(lambda: _eval_pass(model, inputs, targets, autocast), device, existing)
    finally:
        set_fused_cpu(fused)


@torch.no_grad()
def evaluate(model, eval_sets: list[EvalSet], autocast, *, tokens: int = 1 << 14,
             memory: bool = False) -> dict[str, Any]:
    """Accuracy and loss per setting and per slice value (N, distance, ...; each row with its
    length), streamed: passes of about `tokens` tokens (at least one example each), the head
    at the labelled positions only, the linear families in the chunk form whatever the
    training form (the forms agree; memory stays linear in T). memory=True adds each setting's
    peak memory of one pass (peak_mem_bytes) and the examples per pass."""
    model.eval()
    form = getattr(model.cfg, "form", None)
    if form is not None and form != EVAL_FORM:
        model.set_form(EVAL_FORM)
    per_set, slices = [], []
    try:
        for es in eval_sets:
            per_pass = examples_per_pass(es.seq_len, tokens)
            started = time.perf_counter()
            setting, rows = _evaluate_set(model, es, autocast, per_pass)
            setting["time_s"] = time.perf_counter() - started
            if memory:
                setting.update(peak_mem_bytes=_eval_memory(model, es, autocast, per_pass),
                               examples_per_pass=min(per_pass, es.batch.inputs.shape[0]), form=EVAL_FORM)
            per_set.append(setting)
            slices.extend(rows)
    finally:
        if form is not None and form != EVAL_FORM:
            model.set_form(form)
        model.train()
    accuracy = sum(p["accuracy"] for p in per_set) / len(per_set)
    loss = sum(p["loss"] for p in per_set) / len(per_set)
    return {"accuracy": accuracy, "loss": loss, "min_accuracy": min(p["accuracy"] for p in per_set),
            "settings": per_set, "slices": slices}


def with_val_accuracy(test_slices: list[dict], val_slices: list[dict]) -> list[dict]:
    """Test slice rows with the validation accuracy of the same (slice, value, seq_len) beside
    them (`val_accuracy`, NaN where the validation batch has no such slice value)."""
    val = {(r["slice"], r["value"], r["seq_len"]): r["accuracy"] for r in val_slices}
    return [{**r, "val_accuracy": val.get((r["slice"], r["value"], r["seq_len"]), math.nan)}
            for r in test_slices]
