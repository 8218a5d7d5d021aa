"""Where each head looks, at the two places gathering and aggregating happen in recall (the
Gather-and-Aggregate heads of Bick, Xing & Gu 2025, mapped onto key/value pairs):

  value_on_key     at the value token of each queried pair, the weight on the token just before
                   it, its key: a gather head binds the pair into the value token there.
  query_on_answer  at each query, the weight on the answer's value token (its span with the
                   short convolution, harness.measure.trained.answer_span): an aggregate head
                   reads the bound pair from there.

Weights are each head's effective a_ij (Mixer.effective_weights) as the sharpness measurements
read them, p_ij = |a_ij| / sum_{l<=i} |a_il| over the causal prefix
(harness.measure.trained.sharpness), averaged over the rows of up to WEIGHT_EXAMPLES examples.
A mixer that declares no effective_weights has no rows, and the reason is returned.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from harness.hooks import capture
from harness.layers.protocol import lacks, mixer_hooks
from harness.measure.trained import answer_span, sharpness
from harness.tasks.base import IGNORE, batch_field

WEIGHT_EXAMPLES = 64  # examples whose weights are read: rows enough for a mean, O(H R T) each


def _target_weight(mixer, hooks: dict, rows: torch.Tensor, targets: torch.Tensor, span: int) -> torch.Tensor:
    """(H, R): the weight each head puts at rows `rows` on the span starting at `targets`."""
    a = mixer.effective_weights(hooks, rows=rows)[0]  # (H, R, T)
    tp = targets.to(a.device).expand(a.shape[0], -1)  # (H, R)
    return sharpness(a, tp, positions=rows.to(a.device), span=span)["target_weight"]


@torch.no_grad()
def head_weight_rows(model, batch, examples: int = WEIGHT_EXAMPLES) -> tuple[list[dict[str, Any]], Optional[str]]:
    """(one row per (layer, head): {"kind": "weights", "value_on_key", "query_on_answer"}, the
    reason a layer has none or None)."""
    device = next(model.parameters()).device
    inputs = batch_field(batch, "inputs")[:examples]
    targets = batch_field(batch, "targets")[:examples].cpu()
    target_pos = batch_field(batch, "target_pos")[:examples].cpu()
    span = answer_span(model)
    was_training = model.training
    model.eval()
    try:
        with capture(model, names=lambda name: ".mixer.hook_" in name) as cache:
            model(inputs.to(device))
    finally:
        model.train(was_training)
    rows, why = [], None
    for layer, mixer in enumerate(model.mixers()):
        skip = lacks(mixer, "effective_weights")
        if skip:
            why = f"layer {layer}: {skip}"
            continue
        hooks = mixer_hooks(mixer, cache, f"layers.{layer}.mixer.")
        on_key, on_answer = [], []
        for b in range(inputs.shape[0]):
            queries = (targets[b] != IGNORE).nonzero().squeeze(-1)  # (R,)
            if queries.numel() == 0:
                continue
            values = torch.unique(target_pos[b, queries])  # (P,) the queried pairs' value tokens
            one = {k: v[b:b + 1] for k, v in hooks.items()}
            on_answer.append(_target_weight(mixer, one, queries, target_pos[b, queries], span))
            on_key.append(_target_weight(mixer, one, values, values - 1, 1))
        if not on_answer:
            continue
        answer, key = torch.cat(on_answer, dim=1), torch.cat(on_key, dim=1)  # (H, rows)
        for h in range(answer.shape[0]):
            rows.append({"layer": layer, "head": h, "kind": "weights", "value_on_key": float(key[h].nanmean()),
                         "query_on_answer": float(answer[h].nanmean())})
    return rows, why
