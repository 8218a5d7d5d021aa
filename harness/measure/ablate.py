"""Causal attribution: which layers and heads recall needs, found by removing them.

Every intervention is an edit of a named hook point (harness.hooks.intervene); the model is
never forked. Two points per layer:

  layers.<i>.hook_mixer_out      the mixer's output (B, T, C), any mixer: a whole layer removed
  layers.<i>.mixer.hook_out      the mixer's read-out per head (B, H, T, d_head): one head removed
                                 (declared by the built-in mixers; an outside mixer that declares
                                 none has its heads skipped, with the reason)

Two ablations, named in every row: "zero" (the output set to 0) and "mean" (set to its mean
over a reference batch, per position, so the layer's average contribution stays). Activation
patching takes a clean example and a corrupted one (each queried key swapped for another
query's key of the same example, so the correct answer changes), runs the corrupted one with
one head's output taken from the clean run, and reports the fraction of the clean logit
difference (correct answer minus the corrupted run's answer) that this restores: 1 when that
head alone carries the answer, 0 when it carries none of it.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from harness.hooks import capture, hook_points, intervene
from harness.tasks import IGNORE, label_positions

KINDS = ("zero", "mean")


def _field(batch, name: str):
    return batch[name] if isinstance(batch, dict) else getattr(batch, name)


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
    logits, labels = _logits(model, _field(batch, "inputs").to(device), _field(batch, "targets").to(device), edits)
    mask = labels != IGNORE
    return float((logits.argmax(-1) == labels)[mask].float().mean()) if mask.any() else float("nan")


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


def _head_counts(model, batch) -> dict[str, int]:
    """Heads at each layer's hook_out, read off one forward pass (mamba and retnet have more
    decay heads than q/k heads; an outside mixer has its own count)."""
    device = next(model.parameters()).device
    with capture(model, names=lambda n: n.endswith(".mixer.hook_out")) as cache:
        model(_field(batch, "inputs")[:1].to(device))
    return {name: t.shape[1] for name, t in cache.items() if t.dim() == 4}


def reference_means(model, reference) -> dict[str, torch.Tensor]:
    """Mean of every ablation point over the reference batch's examples, per position."""
    device = next(model.parameters()).device
    wanted = lambda n: n.endswith(".hook_mixer_out") or n.endswith(".mixer.hook_out")  # noqa: E731
    with torch.no_grad(), capture(model, names=wanted) as cache:
        model(_field(reference, "inputs").to(device))
    return {name: t.mean(dim=0, keepdim=True) for name, t in cache.items()}


def edit(kind: str, head: Optional[int], mean: Optional[torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """The edit that removes one head (dim 1 of (B, H, T, d)) or the whole output."""
    if kind not in KINDS:
        raise ValueError(f"unknown ablation kind {kind!r}; valid: {', '.join(KINDS)}")

    def fn(x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        part = (slice(None), head) if head is not None else (slice(None),)
        x[part] = 0.0 if kind == "zero" else mean[part].to(x.dtype).expand_as(x[part])
        return x

    return fn


def corrupt(batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(corrupted inputs, targets, the corrupted run's answers): each labelled position's token
    (the queried key) swapped for the next labelled position's of the same example (cyclically),
    whose target becomes the corrupted answer. Examples with fewer than two labels are unlabelled."""
    inputs, targets = _field(batch, "inputs").clone(), _field(batch, "targets").clone()
    other = torch.full_like(targets, IGNORE)
    for b in range(inputs.shape[0]):
        pos = (targets[b] != IGNORE).nonzero().squeeze(-1)
        if pos.numel() < 2:
            targets[b] = IGNORE
            continue
        rolled = pos.roll(-1)
        keys = inputs[b, rolled].clone()
        differs = keys != inputs[b, pos]  # a query repeated: swapping it changes nothing
        inputs[b, pos] = keys
        other[b, pos] = torch.where(differs, targets[b, rolled], IGNORE)
        targets[b, pos[~differs]] = IGNORE
    return inputs, targets, other


def _logit_diff(logits: torch.Tensor, labels: torch.Tensor, other: torch.Tensor) -> float:
    """Mean over labelled positions of logit[clean answer] - logit[corrupted answer]."""
    mask = (labels != IGNORE) & (other != IGNORE)
    good = logits.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    bad = logits.gather(-1, other.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return float((good - bad)[mask].mean()) if mask.any() else float("nan")


@torch.no_grad()
def patching(model, batch, heads: dict[str, int]) -> list[dict[str, Any]]:
    """Per (layer, head) of `heads` (hook_out name -> head count): the fraction of the clean
    logit difference restored in the corrupted run by that head's clean output."""
    device = next(model.parameters()).device
    clean_in = _field(batch, "inputs").to(device)
    bad_in, targets, other = (t.to(device) for t in corrupt(batch))
    positions, labels = label_positions(targets)
    others = other.gather(1, positions)  # (B, K) the corrupted run's answers
    with capture(model, names=set(heads)) as clean:
        clean_diff = _logit_diff(model(clean_in, positions), labels, others)
    bad_diff = _logit_diff(model(bad_in, positions), labels, others)
    rows = []
    for name, count in heads.items():
        layer = int(name.split(".")[1])
        for h in range(count):
            def put(x, h=h, src=clean[name]):
                x = x.clone()
                x[:, h] = src[:, h].to(x.dtype)
                return x
            with intervene(model, {name: put}):
                diff = _logit_diff(model(bad_in, positions), labels, others)
            span = clean_diff - bad_diff
            rows.append({"layer": layer, "head": h, "kind": "patch", "clean_logit_diff": clean_diff,
                         "corrupted_logit_diff": bad_diff, "patched_logit_diff": diff,
                         "restored": (diff - bad_diff) / span if span else float("nan")})
    return rows


def ablate(model, batch, reference=None, *, kinds=KINDS, patch: bool = True) -> dict[str, Any]:
    """Recall with each layer, and each head of each layer, removed, by each ablation kind; and
    activation patching of each head from clean into corrupted examples.

    batch: a task Batch (inputs, targets; a dict with those keys works too) at one length.
    reference: the batch mean ablation averages over (same length; default `batch` itself).
    Returns {"accuracy": the model's own, "rows": one per (layer, head, kind) with "accuracy"
    (that part removed), "base_accuracy" and "drop"; head None for the whole layer; patching
    rows with kind "patch" and "restored"}, "skipped": the reasons a layer's heads were not
    ablated}. The model's mode is restored."""
    was_training = model.training
    model.eval()
    try:
        base = accuracy(model, batch)
        means = reference_means(model, batch if reference is None else reference) if "mean" in kinds else {}
        heads = _head_counts(model, batch)
        rows, skipped = [], {}
        for p in points(model):
            if p["skipped"]:
                skipped[f"layer {p['layer']} heads"] = p["skipped"]
                continue
            head_name = f"layers.{p['layer']}.mixer.hook_out"
            if head_name in hook_points(model) and head_name not in heads:
                skipped[f"layer {p['layer']} heads"] = "skipped: hook_out is not laid out (B, H, T, d_head)"
            targets = [(p["point"], None)] + [(head_name, h) for h in range(heads.get(head_name, 0))]
            for name, head in targets:
                for kind in kinds:
                    acc = accuracy(model, batch, {name: edit(kind, head, means.get(name))})
                    rows.append({"layer": p["layer"], "head": head, "kind": kind, "point": name,
                                 "accuracy": acc, "base_accuracy": base, "drop": base - acc})
        if patch:
            rows += patching(model, batch, heads)
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


def ablate_run(model, config, *, examples: int = 256, seed: int = 1_000_003, kinds=KINDS,
               patch: bool = True) -> dict[str, Any]:
    """`ablate` on a finished run's model (harness.load_run(...).model) and config, at its task's
    first test setting: what mode=ablate computes, with the same defaults."""
    batch, reference, setting = task_batches(config.task, examples, seed)
    out = ablate(model, batch, reference, kinds=kinds, patch=patch)
    out["seq_len"] = int(_field(batch, "inputs").shape[1])
    out["examples"] = examples
    return out
