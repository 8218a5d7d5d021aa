"""Path patching: how much of the answer one head's clean output brings back through one later
head alone (a candidate gather head G into a candidate aggregate head A).

The form implemented, in three runs of the corrupted inputs (harness.measure.corruption), each
an edit of the model's hook points:

1. G's read-out (layers.g.mixer.hook_out, head h) put back to its clean value, every other head
   as the corrupted run computes it. The change this makes to G's layer output
   (layers.g.hook_mixer_out, minus the corrupted run's) is G's clean output as it enters the
   residual stream, through its own layer's norm, gate and output projection.
2. That change added to the input of A's block alone (the edit is at layers.(a-1).hook_resid_post,
   read only by A's block): the layers between G and A, and the MLP of G's own block, compute
   from the corrupted stream, so G reaches A by the residual stream directly and by nothing else.
   A's read-out in this run (layers.a.mixer.hook_out, head k) is recorded; nothing else of it is used.
3. Only A's read-out replaced by the recorded one; every other head, A's own layer's included,
   and every layer after A compute from the corrupted inputs and A's change. The logit
   difference there gives `restored`: the share of the clean-minus-corrupted logit difference
   that comes back through the path G -> A -> logits.

This is the path patching of Wang et al. (2022, "Interpretability in the wild"), sender to
receiver, with the path restricted to the direct residual edge (no MLP or head in between
recomputed with the sender's change). A sender and receiver in one layer have no such path
(their inputs are one and the same), and layer 0 has no sender before it.

Rows: {"kind": "path", "corrupt", "sender_layer", "sender_head", "layer", "head" (the
receiver), "clean_logit_diff", "corrupted_logit_diff", "patched_logit_diff", "restored"}.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from harness.measure.contrast import Contrast, put_head, restored_share


def layer_of(point: str) -> int:
    """The layer index of a hook point's name (layers.<i>....)."""
    return int(point.split(".")[1])


def added(delta: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """The edit that adds `delta` to what a hook point passes on."""
    return lambda x: x + delta.to(x.dtype)


@torch.no_grad()
def path_patching(model, batch, heads: dict[str, int], corruptions=("key",)) -> list[dict[str, Any]]:
    """One row per corruption and (sender head, receiver head in a later layer): `restored`
    through the direct path from the sender into the receiver (module docstring). heads:
    hook_out name -> head count (harness.measure.ablate.head_counts)."""
    rows = []
    outputs = {f"layers.{i}.hook_mixer_out" for i in range(len(model.layers))}
    for part in corruptions:
        contrast = Contrast(model, batch, part)
        clean_diff, clean = contrast.clean_run(set(heads))
        bad_diff, bad = contrast.diff(names=outputs)
        for sender, count in heads.items():
            g = layer_of(sender)
            receivers = {name: n for name, n in heads.items() if layer_of(name) > g}
            out = f"layers.{g}.hook_mixer_out"
            for sh in range(count if receivers else 0):
                _, got = contrast.diff({sender: put_head(sh, clean[sender])}, names={out})
                delta = got[out] - bad[out]  # (B, T, C) the sender's clean output in the stream
                for receiver, n in receivers.items():
                    a = layer_of(receiver)
                    _, seen = contrast.diff({f"layers.{a - 1}.hook_resid_post": added(delta)}, names={receiver})
                    for rh in range(n):
                        diff, _ = contrast.diff({receiver: put_head(rh, seen[receiver])})
                        rows.append({"kind": "path", "corrupt": part, "sender_layer": g, "sender_head": sh,
                                     "layer": a, "head": rh, "clean_logit_diff": clean_diff,
                                     "corrupted_logit_diff": bad_diff, "patched_logit_diff": diff,
                                     "restored": restored_share(diff, clean_diff, bad_diff)})
    return rows
