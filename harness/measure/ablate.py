"""Causal attribution: which layers and heads recall needs, found by removing and restoring them.

Every intervention is an edit of a named hook point (harness.hooks.intervene); the model is
never forked. Two points per layer:

  layers.<i>.hook_mixer_out      the mixer's output (B, T, C), any mixer: a whole layer removed
  layers.<i>.mixer.hook_out      the mixer's read-out per head (B, H, T, d_head): one head removed
                                 (declared by the built-in mixers; an outside mixer that declares
                                 none has its heads skipped, with the reason)

Three ablations, named in every row (kind):

  zero      the output set to 0;
  mean      set to its mean over a reference batch, per position (the average contribution stays);
  resample  taken from another example of the same batch (example b gets example b-1's, cyclically),
            so the head still writes an output of the kind it writes, only about the wrong example.
            Zero and mean ablation move the head off its own distribution and can disagree for
            that reason alone; resampling keeps it there (the resampling ablation of causal
            scrubbing, Chan et al. 2022).

Each ablation row has the model's own recall on the examples (base_accuracy), the recall with
that part removed, the drop, and `chance`: the recall of a guess among the example's stored
values (1/N for recall), so a drop reads as a share of the way to chance.

Activation patching (kind "patch") takes a clean example and a corrupted one in which every
query's answer changed (harness.measure.corruption: the query swapped, or the queried pair's
key or value rotated in the context; `corrupt` names which), runs the corrupted one with one
head's clean output (its whole sequence) put back, and reports `restored`, the share of the
clean-minus-corrupted logit difference (clean answer minus corrupted answer) this brings back:
1 when that head alone carries the answer, 0 when it carries none of it. Path patching from one
head into another (kind "path") is harness.measure.paths; the weights each head puts where a
gather or an aggregate head would look (kind "weights") are harness.measure.head_weights.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional

import torch

from harness.config.schema import ABLATIONS, CORRUPTIONS, PATH_CORRUPTIONS
from harness.hooks import capture, hook_points, intervene
from harness.measure.contrast import Contrast, put_head, restored_share
from harness.tasks import IGNORE, label_positions
from harness.tasks.base import batch_field

KINDS = ABLATIONS  # the ablations, named in every row


@torch.no_grad()
def _logits(model, inputs: torch.Tensor, targets: torch.Tensor, edits: Optional[dict] = None):
    """Logits (B, K, V) at the labelled positions, with `edits` on the hook points, and the
    (B, K) targets there (IGNORE where a row has fewer labels)."""
    positions, labels = label_positions(targets)
    with intervene(model, edits or {}):
        return model(inputs, positions), labels


def accuracy(model, batch, edits: Optional[dict] = None) -> float:
    """Top-1 accuracy over the labelled positions of `batch`, with `edits` applied."""
    device = next(model.parameters()).device
    logits, labels = _logits(model, batch_field(batch, "inputs").to(device), batch_field(batch, "targets").to(device),
                             edits)
    mask = labels != IGNORE
    return float((logits.argmax(-1) == labels)[mask].float().mean()) if mask.any() else float("nan")


def chance(batch) -> float:
    """Recall of a guess among each example's stored values (1/N per query, N the query's slice
    value where the task slices by num_pairs), averaged over the labelled positions; NaN for a
    task that does not say how many values a query chooses among."""
    try:
        name, n = batch_field(batch, "slice_name"), batch_field(batch, "slice_value")
    except (KeyError, AttributeError):
        return math.nan
    n = n[batch_field(batch, "targets") != IGNORE]
    return float((1.0 / n.clamp(min=1).double()).mean()) if name == "num_pairs" and n.numel() else math.nan


def has_pairs(batch) -> bool:
    """Whether `batch` says where each query's answer sits (target_pos): the key and value
    corruptions and the head weights need it."""
    try:
        return batch_field(batch, "target_pos") is not None
    except (KeyError, AttributeError):
        return False


def points(model) -> list[dict[str, Any]]:
    """Every place one can ablate: {"layer", "head" (None: the whole layer), "point", "skipped"}."""
    names = hook_points(model)
    out = []
    for i, block in enumerate(model.layers):
        out.append({"layer": i, "head": None, "point": f"layers.{i}.hook_mixer_out", "skipped": None})
        name = f"layers.{i}.mixer.hook_out"
        if name not in names:
            out.append({"layer": i, "head": None, "point": None,
                        "skipped": "skipped: no hook_out (declare a HookPoint hook_out on the mixer's "
                                   "(B, H, T, d_head) read-out to ablate its heads)"})
    return out


def head_counts(model, batch) -> dict[str, int]:
    """Heads at each layer's hook_out, read off one forward pass (mamba and retnet have more
    decay heads than q/k heads; an outside mixer has its own count)."""
    device = next(model.parameters()).device
    with capture(model, names=lambda n: n.endswith(".mixer.hook_out")) as cache:
        model(batch_field(batch, "inputs")[:1].to(device))
    return {name: t.shape[1] for name, t in cache.items() if t.dim() == 4}


def reference_means(model, reference) -> dict[str, torch.Tensor]:
    """Mean of every ablation point over the reference batch's examples, per position."""
    device = next(model.parameters()).device
    wanted = lambda n: n.endswith(".hook_mixer_out") or n.endswith(".mixer.hook_out")  # noqa: E731
    with torch.no_grad(), capture(model, names=wanted) as cache:
        model(batch_field(reference, "inputs").to(device))
    return {name: t.mean(dim=0, keepdim=True) for name, t in cache.items()}


def edit(kind: str, head: Optional[int], mean: Optional[torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """The edit that removes one head (dim 1 of (B, H, T, d)) or the whole output: zero, the
    reference mean (`mean`), or the output of the example before in the batch (resample)."""
    if kind not in KINDS:
        raise ValueError(f"unknown ablation kind {kind!r}; valid: {', '.join(KINDS)}")

    def fn(x: torch.Tensor) -> torch.Tensor:
        out = x.clone()
        part = (slice(None), head) if head is not None else (slice(None),)
        if kind == "zero":
            out[part] = 0.0
        elif kind == "mean":
            out[part] = mean[part].to(x.dtype).expand_as(x[part])
        else:  # this very pass computed the head on every example: another example's output is at hand
            out[part] = x.roll(1, dims=0)[part]
        return out

    return fn


@torch.no_grad()
def patching(model, batch, heads: dict[str, int], corruptions=("query",)) -> list[dict[str, Any]]:
    """Per corruption and (layer, head) of `heads` (hook_out name -> head count): the share of
    the clean logit difference restored in the corrupted run by that head's clean output."""
    rows = []
    for part in corruptions:
        contrast = Contrast(model, batch, part)
        clean_diff, clean = contrast.clean_run(set(heads))
        bad_diff, _ = contrast.diff()
        for name, count in heads.items():
            layer = int(name.split(".")[1])
            for h in range(count):
                diff, _ = contrast.diff({name: put_head(h, clean[name])})
                rows.append({"layer": layer, "head": h, "kind": "patch", "corrupt": part,
                             "clean_logit_diff": clean_diff, "corrupted_logit_diff": bad_diff,
                             "patched_logit_diff": diff, "restored": restored_share(diff, clean_diff, bad_diff)})
    return rows


def _ablation_rows(model, batch, means: dict, heads: dict[str, int], kinds, skipped: dict) -> list[dict[str, Any]]:
    """One row per (layer, head or the whole layer, kind): recall with that part removed."""
    base, floor = accuracy(model, batch), chance(batch)
    names, rows = hook_points(model), []
    for p in points(model):
        if p["skipped"]:
            skipped[f"layer {p['layer']} heads"] = p["skipped"]
            continue
        head_name = f"layers.{p['layer']}.mixer.hook_out"
        if head_name in names and head_name not in heads:
            skipped[f"layer {p['layer']} heads"] = "skipped: hook_out is not laid out (B, H, T, d_head)"
        targets = [(p["point"], None)] + [(head_name, h) for h in range(heads.get(head_name, 0))]
        for name, head in targets:
            for kind in kinds:
                acc = accuracy(model, batch, {name: edit(kind, head, means.get(name))})
                rows.append({"layer": p["layer"], "head": head, "kind": kind, "point": name, "accuracy": acc,
                             "base_accuracy": base, "drop": base - acc, "chance": floor})
    return rows


def ablate(model, batch, reference=None, *, kinds=KINDS, patch: bool = True, corruptions=CORRUPTIONS,
           path_corruptions=PATH_CORRUPTIONS) -> dict[str, Any]:
    """Recall with each layer, and each head of each layer, removed by each ablation kind; each
    head patched from clean into corrupted examples, by each of `corruptions`; each head's clean
    output patched along its path into each head of a later layer (harness.measure.paths), by
    each of `path_corruptions`; and the weights each head puts where gathering and aggregating
    look (harness.measure.head_weights).

    batch: a task Batch (inputs, targets, target_pos, slice values; a dict with those keys works
    too) at one length. reference: the batch mean ablation averages over (same length; default
    `batch` itself). Returns {"accuracy": the model's own, "rows": one per (layer, head, kind)
    (head None for the whole layer) with "accuracy" (that part removed), "base_accuracy", "drop"
    and "chance"; patching rows (kind "patch") with "corrupt" and "restored"; path rows (kind
    "path"); weights rows (kind "weights"), "skipped": the reasons a part was not measured}.
    The model's mode is restored."""
    from harness.measure.head_weights import head_weight_rows
    from harness.measure.paths import path_patching

    was_training = model.training
    model.eval()
    try:
        means = reference_means(model, batch if reference is None else reference) if "mean" in kinds else {}
        heads, skipped = head_counts(model, batch), {}
        rows = _ablation_rows(model, batch, means, heads, kinds, skipped)
        usable = lambda parts: [c for c in parts if c == "query" or has_pairs(batch)]  # noqa: E731
        for part in sorted(set(corruptions) | set(path_corruptions)):
            if not usable([part]):
                skipped[f"corrupt {part}"] = "skipped: the batch has no target_pos (where each answer sits)"
        if patch:
            rows += patching(model, batch, heads, usable(corruptions))
        rows += path_patching(model, batch, heads, usable(path_corruptions))
        if has_pairs(batch):
            found, why = head_weight_rows(model, batch)
            rows += found
            if why:
                skipped["weights"] = why
        base = accuracy(model, batch)
    finally:
        model.train(was_training)
    return {"accuracy": base, "rows": rows, "skipped": skipped}


def task_batches(task_cfg, examples: int, seed: int):
    """(batch, reference) of a run's task config (a DictConfig: its `task` group) at its first
    test setting (the training length), drawn from two seeds apart from training's; and that
    setting's Config."""
    from harness.config.build import task_config

    module, tcfg = task_config(task_cfg)
    setting = module.eval_settings(tcfg)[0]
    batch = module.make_batch(setting, examples, seed=seed)
    reference = module.make_batch(setting, examples, seed=seed + 1)
    return batch, reference, setting


def settings(ab) -> dict[str, Any]:
    """ablate_run's keyword arguments from the ablate.* config node (mode=ablate, trainer.ablate)."""
    return {"examples": int(ab.examples), "seed": int(ab.seed), "kinds": list(ab.kinds), "patch": bool(ab.patch),
            "corruptions": list(ab.corrupt), "path_corruptions": list(ab.path_corrupt)}


def ablate_run(model, config, *, examples: int = 256, seed: int = 1_000_003, kinds=KINDS,
               patch: bool = True, corruptions=CORRUPTIONS, path_corruptions=PATH_CORRUPTIONS) -> dict[str, Any]:
    """`ablate` on a finished run's model (harness.load_run(...).model) and config, at its task's
    first test setting: what mode=ablate and a run with trainer.ablate=true compute, with the
    same defaults."""
    batch, reference, setting = task_batches(config.task, examples, seed)
    out = ablate(model, batch, reference, kinds=kinds, patch=patch, corruptions=corruptions,
                 path_corruptions=path_corruptions)
    out["seq_len"] = int(batch_field(batch, "inputs").shape[1])
    out["examples"] = examples
    return out
