"""Needle in a haystack: a few key/value pairs buried at a chosen depth, queried at the end.

The RULER single-needle / multi-key design at a scale a CPU trains. Vocabulary: token 0 is
the filler; keys come from [1, V//2), values from [V//2, V). The context (every position
but the last K) is a haystack with K needle pairs (`num_needles`) side by side in it, at
`depth` (a fraction of the context: 0 = its start, 1 = just before the queries); the last K
positions ask the needle keys, in random order, each labelled with its needle's value.

    V=16, seq_len=10, num_needles=1, depth=0.5, haystack=pairs (one possible draw; needle 3 -> 12):

    position     0   1   2   3   4   5   6   7   8 | 9
    inputs       6  11   2   9   3  12   6  14   0 | 3
    targets      .   .   .   .   .   .   .   .   . |12
    target_pos   .   .   .   .   .   .   .   .   . | 5
    slice_value  .   .   .   .   .   .   .   .   . |50

The context is laid out in pair slots (positions 2s, 2s + 1; an odd context ends in one
filler 0): S = (seq_len - K) // 2 slots, the needles in slots s .. s + K - 1 with
s = round(depth * (S - K)) (here S = 4, s = round(0.5 * 3) = 2). The haystack fills the
other slots:

  pairs   distractor pairs: a key and a value in each slot, drawn with replacement (so the
          distractor keys recur with different values), never a needle key or value;
  random  random tokens from [1, V) minus the needle keys and values;
  zero    the filler 0.

Labels are unambiguous in every haystack: a needle key occurs once in the context (and at its
query), a needle value once, at target_pos. `depth=None` draws a depth per example
(uniform over the slots: for training on every depth). Slice "depth", in percent: the
setting's depth, round(100 * depth); a drawn depth is reported to the nearest 10%.

Evaluation: one setting per (entry of `test_depth`, entry of `test_seq_len`), depth varying
fastest (defaults: the training depth and length): the depth x length grid of a heatmap.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

import torch

from harness.tasks.base import (PAD, Batch, as_config, check_call, check_float, check_int, empty_labels,
                                eval_grid, fail, longest, make_generator, permutation, randint, require,
                                sample_distinct, sample_excluding, validate_settings)

NAME = "needle"
SLICE_NAME = "depth"
HAYSTACKS = ("pairs", "random", "zero")


@dataclass
class Config:
    seq_len: int = 128
    vocab_size: int = 256
    num_needles: int = 1
    depth: Optional[float] = None            # fraction of the context; None: drawn per example
    haystack: str = "pairs"                  # pairs | random | zero
    test_depth: list[float] = field(default_factory=list)   # empty: [depth]
    test_seq_len: list[int] = field(default_factory=list)   # empty: [seq_len]


def _check_depth(name: str, depth: object) -> None:
    d = check_float(NAME, name, depth)
    require(0.0 <= d <= 1.0, f"{NAME}: {name}={depth} must be in [0, 1] (a fraction of the context: "
                             f"0 = its start, 1 = just before the queries); a needle cannot lie deeper")


def _validate_setting(cfg: Config, where: str) -> None:
    check_int(NAME, f"{where}seq_len", cfg.seq_len)
    check_int(NAME, "vocab_size", cfg.vocab_size, minimum=4)
    check_int(NAME, "num_needles", cfg.num_needles)
    if cfg.depth is not None:
        _check_depth(f"{where}depth", cfg.depth)
    require(cfg.haystack in HAYSTACKS, f"{NAME}: unknown haystack {cfg.haystack!r}; valid: {', '.join(HAYSTACKS)}")
    k, v, t = cfg.num_needles, cfg.vocab_size, cfg.seq_len
    spare = 1 if cfg.haystack == "pairs" else 0  # distractor pairs need a key and a value no needle has
    require(k + spare <= v // 2 - 1, f"{NAME}: num_needles={k} distinct keys"
                                     f"{' and a distractor key' if spare else ''} do not fit in the key half "
                                     f"[1, {v // 2}) of vocab_size={v}; raise vocab_size")
    require(k + spare <= v - v // 2, f"{NAME}: num_needles={k} distinct values"
                                     f"{' and a distractor value' if spare else ''} do not fit in the value half "
                                     f"[{v // 2}, {v}) of vocab_size={v}; raise vocab_size")
    require(3 * k <= t, f"{NAME}: num_needles={k} needs 3*num_needles = {3 * k} positions (the needle pairs "
                        f"and their queries), {where}seq_len={t}; raise seq_len")


def validate(cfg: Config) -> None:
    """Raise ValueError (one line) unless the training and every evaluation setting is valid."""
    cfg = as_config(Config, cfg, NAME)
    if not isinstance(cfg.test_depth, (list, tuple)):
        fail(f"{NAME}: test_depth must be a list of depths (e.g. [0,0.5,1]), got {cfg.test_depth!r}")
    for d in cfg.test_depth:
        _check_depth("test_depth entry", d)
    validate_settings(NAME, cfg, _validate_setting, eval_settings)


def eval_settings(cfg: Config) -> list[Config]:
    """One setting per (test length, test depth), depth varying fastest."""
    return [dataclasses.replace(s, depth=None if s.depth is None else float(s.depth))
            for s in eval_grid(as_config(Config, cfg, NAME), "seq_len", "depth")]


def seq_len(cfg: Config) -> int:
    """The length of this setting's examples, from the config alone (no example is generated)."""
    return as_config(Config, cfg, NAME).seq_len


def max_seq_len(cfg: Config) -> int:
    return longest(cfg, seq_len, eval_settings(cfg))


def needle_slot(depth: float, slots: int, needles: int) -> int:
    """The first needle slot at `depth`: round(depth * (slots - needles))."""
    return int(round(depth * (slots - needles)))


def make_batch(cfg: Config, batch_size: int, *, seed: int, device: torch.device | str = "cpu",
               split: str = "train") -> Batch:
    cfg = as_config(Config, cfg, NAME)
    _validate_setting(cfg, "")
    check_call(NAME, batch_size, seed, split)
    b, t, k, v = batch_size, cfg.seq_len, cfg.num_needles, cfg.vocab_size
    slots = (t - k) // 2
    gen = make_generator(seed, split, device)
    dev = gen.device

    keys = sample_distinct(gen, b, k, 1, v // 2)                        # (B, K) needle keys
    values = sample_distinct(gen, b, k, v // 2, v)                      # (B, K) needle values
    if cfg.depth is None:                                               # a depth per example
        first = randint(gen, 0, slots - k + 1, b, 1)                    # (B, 1)
        depth = first.double() / max(1, slots - k)
        percent = (10 * torch.round(10 * depth)).long()                 # nearest 10%
    else:
        first = torch.full((b, 1), needle_slot(float(cfg.depth), slots, k), dtype=torch.long, device=dev)
        percent = torch.full((b, 1), int(round(100 * float(cfg.depth))), dtype=torch.long, device=dev)
    order = permutation(gen, b, k)                                      # (B, K) the order they are asked

    inputs = torch.full((b, t), PAD, dtype=torch.long, device=dev)      # (B, T)
    context = 2 * slots
    if cfg.haystack == "pairs":
        inputs[:, 0:context:2] = sample_excluding(gen, (b, slots), 1, v // 2, keys)
        inputs[:, 1:context:2] = sample_excluding(gen, (b, slots), v // 2, v, values)
    elif cfg.haystack == "random":
        inputs[:, :context] = sample_excluding(gen, (b, context), 1, v, torch.cat([keys, values], dim=1))
    needle_pos = 2 * (first + torch.arange(k, device=dev))              # (B, K) needle key positions
    inputs.scatter_(1, needle_pos, keys)
    inputs.scatter_(1, needle_pos + 1, values)
    query_pos = torch.arange(t - k, t, device=dev).expand(b, k)         # (B, K) the last K positions
    inputs[:, t - k:] = keys.gather(1, order)

    targets, slice_value, target_pos = empty_labels(b, t, dev)
    targets.scatter_(1, query_pos, values.gather(1, order))
    target_pos.scatter_(1, query_pos, needle_pos.gather(1, order) + 1)
    slice_value.scatter_(1, query_pos, percent.expand(b, k))
    return Batch(inputs, targets, slice_value, target_pos, SLICE_NAME)
