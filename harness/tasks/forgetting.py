"""Forgetting MQAR: some keys are written again with a new value; a query wants the latest one.

Zoology's forgetting variant of multi-query associative recall: the state must *replace* what
it holds. One additive state keeps both values at full weight (a model of several layers can
still learn to make the later write the louder one); decay and gating fade the older write;
the delta rule replaces it by construction.

Vocabulary: token 0 is the filler; keys come from [1, V//2), values from [V//2, V). Each
example makes W = N + M writes (key, value), back to back from position 0: each of N distinct
keys once, and M of them (`num_overwrites`) a second time, in a random order. Every write
has its own value (all W values distinct), so a key written twice holds a stale value and a
latest one. Queries of stored keys follow at power-law gaps (as in `recall`); the label is
the value of the key's *last* write before the query.

    V=16, N=2, num_overwrites=1, seq_len=10, num_queries=2 (one possible draw; key 3 twice):

    position     0   1   2   3   4   5 | 6   7   8   9
    inputs       3   9   5  12   3  14 | 5   0   3   0
    targets      .   .   .   .   .   . |12   .  14   .
    target_pos   .   .   .   .   .   . | 3   .   5   .
    overwritten  .   .   .   .   .   . | 0   .   1   .
    age          .   .   .   .   .   . | 2   .   2   .     (6 - 3 = 3 and 8 - 5 = 3, in bin 2)

Stale values: a query of a key written twice carries the key's earlier value in the batch's
`stale` (IGNORE for a key written once), so evaluation counts the wrong answers that are that
value (each slice row's `stale`): the share of an additive state's errors that are the old
association, not crosstalk from the other keys.

Slices: "overwritten" (1 if the queried key was written twice, else 0) is the primary slice;
"age" is the age of the key's last write at the query, query position - target_pos, binned
to powers of two (the bin's lower edge: 1, 2, 4, 8, ...). The write order is random, so
an overwritten key's last write is not always the younger one: the two slices are not the
same variable. target_pos is the latest value's position, the only place the answer can be
read from (values are distinct and never reappear after the writes); the stale value sits at
the key's earlier write.

Queries: `num_queries=None` asks each key once (Q = N); with Q > N each key is asked
floor(Q/N) or ceil(Q/N) times. Evaluation: one setting per entry of `test_seq_len` (default
the training length).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from harness.tasks.base import (IGNORE, PAD, Batch, as_config, balanced_choice, check_call, check_float, check_int,
                                empty_labels, eval_grid, longest, make_generator, permutation,
                                power_law_offsets, require, sample_distinct, validate_settings)

NAME = "forgetting"
SLICE_NAME = "overwritten"
AGE = "age"


@dataclass
class Config:
    seq_len: int = 64
    vocab_size: int = 256
    num_pairs: int = 4                       # distinct keys
    num_overwrites: int = 2                  # keys written a second time, with a new value
    num_queries: Optional[int] = None        # None: num_pairs (each key asked once)
    power_a: float = 0.01                    # gap law of the queries, as in recall
    test_seq_len: list[int] = field(default_factory=list)  # empty: [seq_len]


def num_writes(cfg: Config) -> int:
    return cfg.num_pairs + cfg.num_overwrites


def _num_queries(cfg: Config) -> int:
    return cfg.num_pairs if cfg.num_queries is None else cfg.num_queries


def _validate_setting(cfg: Config, where: str) -> None:
    check_int(NAME, f"{where}seq_len", cfg.seq_len)
    check_int(NAME, "vocab_size", cfg.vocab_size, minimum=4)
    check_int(NAME, "num_pairs", cfg.num_pairs)
    check_int(NAME, "num_overwrites", cfg.num_overwrites, minimum=0)
    if cfg.num_queries is not None:
        check_int(NAME, "num_queries", cfg.num_queries)
    a = check_float(NAME, "power_a", cfg.power_a)
    require(a > 0, f"{NAME}: power_a must be > 0, got {cfg.power_a}")
    n, m, v, t = cfg.num_pairs, cfg.num_overwrites, cfg.vocab_size, cfg.seq_len
    require(m <= n, f"{NAME}: num_overwrites={m} exceeds num_pairs={n} (each overwrite writes a stored key again)")
    require(n <= v // 2 - 1, f"{NAME}: num_pairs={n} distinct keys do not fit in the key half "
                             f"[1, {v // 2}) of vocab_size={v}; raise vocab_size")
    require(n + m <= v - v // 2, f"{NAME}: num_pairs + num_overwrites = {n + m} distinct values do not fit "
                                 f"in the value half [{v // 2}, {v}) of vocab_size={v}; raise vocab_size")
    q = _num_queries(cfg)
    require(2 * (n + m) + q <= t, f"{NAME}: 2*(num_pairs + num_overwrites) + num_queries = {2 * (n + m) + q} "
                                  f"exceeds {where}seq_len={t}")


def validate(cfg: Config) -> None:
    """Raise ValueError (one line) unless the training and every evaluation setting is valid."""
    validate_settings(NAME, as_config(Config, cfg, NAME), _validate_setting, eval_settings)


def eval_settings(cfg: Config) -> list[Config]:
    """One setting per entry of test_seq_len (default: the training length)."""
    return eval_grid(as_config(Config, cfg, NAME), "seq_len")


def seq_len(cfg: Config) -> int:
    """The length of this setting's examples, from the config alone (no example is generated)."""
    return as_config(Config, cfg, NAME).seq_len


def max_seq_len(cfg: Config) -> int:
    return longest(cfg, seq_len, eval_settings(cfg))


def latest_write(write_keys: torch.Tensor, asked: torch.Tensor) -> torch.Tensor:
    """(B, Q): the index of the last write of each asked key. write_keys (B, W), asked (B, Q)
    (every asked key written at least once)."""
    order = torch.arange(write_keys.shape[1], device=write_keys.device)          # (W,)
    match = write_keys.unsqueeze(1) == asked.unsqueeze(-1)                        # (B, Q, W)
    return torch.where(match, order, torch.full_like(order, -1)).amax(dim=-1)     # (B, Q)


def earliest_write(write_keys: torch.Tensor, asked: torch.Tensor) -> torch.Tensor:
    """(B, Q): the index of the first write of each asked key (its latest_write where it was
    written once)."""
    order = torch.arange(write_keys.shape[1], device=write_keys.device)          # (W,)
    match = write_keys.unsqueeze(1) == asked.unsqueeze(-1)                        # (B, Q, W)
    return torch.where(match, order, torch.full_like(order, write_keys.shape[1])).amin(dim=-1)  # (B, Q)


def age_bin(age: torch.Tensor) -> torch.Tensor:
    """The power-of-two bin of an age >= 1, as its lower edge: 1, 2, 2, 4, 4, 4, 4, 8, ..."""
    return torch.pow(2, torch.floor(torch.log2(age.double())).long())


def make_batch(cfg: Config, batch_size: int, *, seed: int, device: torch.device | str = "cpu",
               split: str = "train") -> Batch:
    cfg = as_config(Config, cfg, NAME)
    _validate_setting(cfg, "")
    check_call(NAME, batch_size, seed, split)
    b, t, n, m, v = batch_size, cfg.seq_len, cfg.num_pairs, cfg.num_overwrites, cfg.vocab_size
    w, q = n + m, _num_queries(cfg)
    gen = make_generator(seed, split, device)
    dev = gen.device

    keys = sample_distinct(gen, b, n, 1, v // 2)                        # (B, N), random order
    twice = keys[:, :m]                                                 # (B, M) the overwritten keys
    order = permutation(gen, b, w)                                      # (B, W) the write order
    write_keys = torch.cat([keys, twice], dim=1).gather(1, order)       # (B, W)
    write_values = sample_distinct(gen, b, w, v // 2, v)                # (B, W) every write its own value
    which = balanced_choice(gen, b, q, n)                               # (B, Q) key asked
    offsets = power_law_offsets(gen, b, q, t - 2 * w, float(cfg.power_a))  # (B, Q)
    query_pos = 2 * w + offsets                                         # (B, Q)

    asked = keys.gather(1, which)                                       # (B, Q)
    last = latest_write(write_keys, asked)                              # (B, Q) index of the answer's write
    inputs = torch.full((b, t), PAD, dtype=torch.long, device=dev)      # (B, T)
    inputs[:, 0:2 * w:2] = write_keys
    inputs[:, 1:2 * w:2] = write_values
    inputs.scatter_(1, query_pos, asked)
    targets, overwritten, target_pos = empty_labels(b, t, dev)
    answer_pos = 2 * last + 1                                           # (B, Q)
    targets.scatter_(1, query_pos, write_values.gather(1, last))
    target_pos.scatter_(1, query_pos, answer_pos)
    overwritten.scatter_(1, query_pos, (which < m).long())
    age = torch.full_like(target_pos, -1)
    age.scatter_(1, query_pos, age_bin(query_pos - answer_pos))
    first = earliest_write(write_keys, asked)                           # (B, Q) the stale write, if any
    stale = torch.full_like(targets, IGNORE)                            # (B, T)
    stale.scatter_(1, query_pos, torch.where(first < last, write_values.gather(1, first),
                                             torch.full_like(first, IGNORE)))
    return Batch(inputs, targets, overwritten, target_pos, SLICE_NAME, ((AGE, age),), stale)
