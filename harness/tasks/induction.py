"""Induction heads: a bigram A B seen earlier; at the later A the model must predict B.

Vocabulary: token 0 is unused (reserved, as in the other tasks); trigger tokens A come from
[1, V//2); everything else (the random filler and the answers B) from [V//2, V). Because the
filler never uses the trigger range and the triggers of one example are distinct, each A
occurs exactly twice, so the answer at the second A is unambiguous.

    V=16, seq_len=10, num_triggers=1 (one possible draw; A=5, B=11, distance 5):

    position     0   1   2   3   4   5   6   7   8   9
    inputs      13   5  11   8  14   9   5  10  12   8
    targets      .   .   .   .   .   .  11   .   .   .
    target_pos   .   .   .   .   .   .   2   .   .   .
    slice_value  .   .   .   .   .   .   5   .   .   .

Each example plants `num_triggers` such pairs; `test_seq_len` evaluates the same triggers and
distances in longer (or shorter) sequences of random filler. The distance (second A minus first A) is
uniform in [min_distance, max_distance] and is the slice ("distance"); target_pos is the
position of B after the first A, so inputs[b, target_pos] == targets[b, t].

Placement loops over the triggers (not the examples): each trigger picks, per example, a
uniformly random start among those whose three positions (A, B, second A) are still free.
Every earlier trigger rules out at most 8 starts, so validation demands
seq_len - max_distance > 8 * (num_triggers - 1), which guarantees a free start always exists.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.tasks.base import (Batch, as_config, check_call, check_int, empty_labels, eval_grid, longest,
                                make_generator, randint, require, sample_distinct, uniform, validate_settings)

NAME = "induction"
SLICE_NAME = "distance"
BLOCKED_PER_TRIGGER = 8   # starts one placed trigger can rule out for the next (see docstring)


@dataclass
class Config:
    seq_len: int = 64
    vocab_size: int = 64
    num_triggers: int = 4     # induction pairs (labels) per example
    min_distance: int = 2     # second A minus first A; 2 is "A B A"
    max_distance: int = 32
    test_seq_len: list[int] = field(default_factory=list)  # empty: [seq_len]


def validate(cfg: Config) -> None:
    """Raise ValueError (one line) unless every example of the training and of every
    evaluation length can be laid out."""
    validate_settings(NAME, as_config(Config, cfg, NAME), _validate_setting, eval_settings)


def _validate_setting(cfg: Config, where: str) -> None:
    check_int(NAME, f"{where}seq_len", cfg.seq_len)
    check_int(NAME, "vocab_size", cfg.vocab_size, minimum=4)
    check_int(NAME, "num_triggers", cfg.num_triggers)
    check_int(NAME, "min_distance", cfg.min_distance, minimum=2)
    check_int(NAME, "max_distance", cfg.max_distance, minimum=2)
    t, v, k = cfg.seq_len, cfg.vocab_size, cfg.num_triggers
    require(cfg.min_distance <= cfg.max_distance,
            f"{NAME}: min_distance={cfg.min_distance} exceeds max_distance={cfg.max_distance}")
    require(cfg.max_distance < t, f"{NAME}: max_distance={cfg.max_distance} must be < {where}seq_len={t}")
    require(k <= v // 2 - 1, f"{NAME}: num_triggers={k} distinct triggers do not fit in the trigger "
                             f"range [1, {v // 2}) of vocab_size={v}; raise vocab_size")
    need = BLOCKED_PER_TRIGGER * (k - 1)
    require(t - cfg.max_distance > need,
            f"{NAME}: num_triggers={k} at distances up to max_distance={cfg.max_distance} need "
            f"{where}seq_len - max_distance > {need}, got {t - cfg.max_distance}; "
            f"raise seq_len or lower max_distance/num_triggers")


def eval_settings(cfg: Config) -> list[Config]:
    """One setting per entry of test_seq_len (default the training length), the same triggers
    and distances at each; accuracy is sliced by distance, each row with its length."""
    return eval_grid(as_config(Config, cfg, NAME), "seq_len")


def seq_len(cfg: Config) -> int:
    """The length of this setting's examples, from the config alone (no example is generated)."""
    return as_config(Config, cfg, NAME).seq_len


def max_seq_len(cfg: Config) -> int:
    return longest(cfg, seq_len, eval_settings(cfg))


def make_batch(cfg: Config, batch_size: int, *, seed: int, device: torch.device | str = "cpu",
               split: str = "train") -> Batch:
    cfg = as_config(Config, cfg, NAME)
    _validate_setting(cfg, "")
    check_call(NAME, batch_size, seed, split)
    b, t, v, k = batch_size, cfg.seq_len, cfg.vocab_size, cfg.num_triggers
    gen = make_generator(seed, split, device)
    dev = gen.device

    inputs = randint(gen, v // 2, v, b, t)                              # (B, T) filler
    triggers = sample_distinct(gen, b, k, 1, v // 2)                    # (B, K) the A tokens
    answers = randint(gen, v // 2, v, b, k)                             # (B, K) the B tokens
    dist = randint(gen, cfg.min_distance, cfg.max_distance + 1, b, k)   # (B, K)

    pos = torch.arange(t, device=dev)                                   # (T,)
    free = torch.ones(b, t, dtype=torch.bool, device=dev)               # (B, T)
    starts = []
    for i in range(k):   # triggers, not examples: each step is vectorised over the batch
        d = dist[:, i:i + 1]                                            # (B, 1)
        second = pos + d                                                # (B, T)
        ok = (second < t) & free
        ok &= free.gather(1, (pos + 1).clamp(max=t - 1).expand(b, t))
        ok &= free.gather(1, second.clamp(max=t - 1))
        score = uniform(gen, b, t).masked_fill(~ok, -1.0)               # (B, T)
        p = score.argmax(dim=1, keepdim=True)                           # (B, 1)
        if not bool(ok.gather(1, p).all()):  # excluded by validate(); kept as an invariant
            raise RuntimeError(f"{NAME}: no free start for trigger {i}")
        occupied = torch.cat([p, p + 1, p + d], dim=1)                  # (B, 3)
        free.scatter_(1, occupied, False)
        starts.append(p)
    first = torch.cat(starts, dim=1)                                    # (B, K)
    second = first + dist                                               # (B, K)

    inputs.scatter_(1, first, triggers)
    inputs.scatter_(1, first + 1, answers)
    inputs.scatter_(1, second, triggers)
    targets, slice_value, target_pos = empty_labels(b, t, dev)
    targets.scatter_(1, second, answers)
    slice_value.scatter_(1, second, dist)
    target_pos.scatter_(1, second, first + 1)
    return Batch(inputs, targets, slice_value, target_pos, SLICE_NAME)
