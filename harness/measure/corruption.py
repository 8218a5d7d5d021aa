"""Corrupted twins of a task batch: the same examples with the answer of every query changed,
for patching (harness.measure.ablate, harness.measure.paths).

Three corruptions, each named in every row that uses one:

  query  each labelled position's token (the queried key) swapped for the next labelled
         position's of the same example (cyclically): the query now asks another stored key,
         and the answer is that key's value. The context is untouched.
  key    in the context, the key tokens of the queried pairs rotated among those pairs: the pair
         whose value sits at p_i takes the key of the pair at p_(i+1). The queries stay, so the
         key a query asks now sits before the value of the pair before its own.
  value  in the context, the value tokens of the queried pairs rotated the same way: the key a
         query asks now sits before the next pair's value.

A pair is read off the batch's target_pos (the value token that answers each query) and the
token just before it (its key), the layout of recall's pairs and of induction's "A B". Only the
queried pairs move, so every query's answer changes and a pair no query asks stays as it was.
An example with fewer than two queried pairs (query: fewer than two distinct queried keys) has
nothing to rotate: its labels are dropped from the corrupted batch.

            position  0  1  2  3  4  5 | 6  7   (k1 v1 k2 v2 k3 v3 | queries k1, k3)
    clean            k1 v1 k2 v2 k3 v3 | k1 k3   answers v1, v3
    query            k1 v1 k2 v2 k3 v3 | k3 k1   answers v3, v1
    key              k3 v1 k2 v2 k1 v3 | k1 k3   answers v3, v1
    value            k1 v3 k2 v2 k3 v1 | k1 k3   answers v3, v1
"""
from __future__ import annotations

import torch

from harness.config.schema import CORRUPTIONS
from harness.tasks.base import IGNORE, batch_field


def corrupt(batch, part: str = "query") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(corrupted inputs (B, T), targets (B, T): the clean answers where the corruption changed
    the answer, IGNORE elsewhere, the corrupted run's answers (B, T), IGNORE where none) of
    `batch` (a task Batch, or a mapping with inputs, targets and, for key and value, target_pos)."""
    if part not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {part!r}; valid: {', '.join(CORRUPTIONS)}")
    inputs, targets = batch_field(batch, "inputs").clone(), batch_field(batch, "targets").clone()
    other = torch.full_like(targets, IGNORE)
    if part == "query":
        _swap_queries(inputs, targets, other)
    else:
        _rotate_pairs(inputs, targets, other, batch_field(batch, "target_pos"), shift=0 if part == "value" else 1)
    return inputs, targets, other


def _swap_queries(inputs: torch.Tensor, targets: torch.Tensor, other: torch.Tensor) -> None:
    """In place: each query takes the next query's key; its corrupted answer is that query's."""
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


def _rotate_pairs(inputs: torch.Tensor, targets: torch.Tensor, other: torch.Tensor, target_pos: torch.Tensor,
                  shift: int) -> None:
    """In place: the keys (shift 1: the token before each value) or the values (shift 0) of the
    queried pairs rotated one pair on; each query's corrupted answer is the value its key now
    sits before."""
    for b in range(inputs.shape[0]):
        labelled = (targets[b] != IGNORE).nonzero().squeeze(-1)  # (K,)
        pairs = torch.unique(target_pos[b, labelled])  # (P,) value positions, ascending
        if pairs.numel() < 2:
            targets[b] = IGNORE
            continue
        clean = inputs[b].clone()
        moved = pairs - shift  # the key tokens (shift 1) or the value tokens (shift 0)
        inputs[b, moved] = clean[moved.roll(-1)]
        # the pair a query's key now labels: the one before its own (keys moved), or its own,
        # whose value is now the next pair's (values moved)
        index = torch.searchsorted(pairs, target_pos[b, labelled])  # (K,) each query's pair
        answer_at = pairs[(index - shift) % pairs.numel()]
        other[b, labelled] = inputs[b, answer_at]
