"""Key interference: the direct capacity test of a recurrent state.

All N pairs are written first, then queries of (by default all) stored keys, back to back.
With one layer the state is the bottleneck, so sweeping N past the state's key dimension d
shows the crosstalk directly; results are reported against N/d (slice "num_pairs").

Vocabulary: token 0 is padding; key tokens come from [1, V//2), values from [V//2, V).
A key is `key_len` tokens; a pair is the key's tokens followed by its value; a query is the
key's tokens again, labelled at its last token with the value (values are distinct).

    V=32, N=2, key_len=2, num_queries=2 (one possible draw; keys (3,7) and (4,9)):

    position     0   1   2   3   4   5 | 6   7   8   9
    inputs       3   7  20   4   9  27 | 4   9   3   7
    targets      .   .   .   .   .   . | .  27   .  20
    target_pos   .   .   .   .   .   . | .   5   .   2
    slice_value  .   .   .   .   .   . | .   2   .   2

seq_len=None uses exactly N*(key_len+1) + Q*key_len positions; a larger seq_len puts the
filler 0 between the pairs and the queries, so the queries close the sequence and the state
must hold the pairs across the gap (`test_seq_len` evaluates at other lengths: a length axis). num_queries=None asks every key once; more queries ask each key
floor(Q/N) or ceil(Q/N) times, fewer ask a random subset; the order is random.

key_overlap (in [0, 1)) controls how much structure keys share. Position j of every key draws
its token from a per-example pool of P tokens (pools of different positions are disjoint):

    P = max(ceil((1 - key_overlap) * N), smallest P with P**key_len >= N)

key_overlap=0 gives P=N: every key token belongs to exactly one key, so any single token
identifies its key. As key_overlap grows the pools shrink and each token is shared by about
N/P keys at each position; only the combination of a key's tokens identifies it, so the keys'
representations share components and interfere more. Keys stay distinct as tuples: key i has
a code c (a random permutation of 0..N-1) with base-P digits m_0, m_1, ...; its token at
position 0 is pool_0[m_0] and at position j >= 1 is pool_j[(m_0 + m_j) mod P], an injective
map that puts each pool token of position 0 in floor(N/P) or ceil(N/P) keys. A single-token
key cannot share structure, so key_overlap > 0 requires key_len >= 2.

key_regime says where a sequence's keys come from:

  shared  (default) the whole key half [1, V//2) of the vocabulary, as above: every setting's
          model must embed V//2 - 1 key tokens, however few pairs a sequence holds, so with a
          narrow model the keys' embeddings interfere before the state holds anything (31 keys
          cannot be orthogonal in 8 dimensions).
  schlag  Schlag, Irie & Schmidhuber's (2021) capacity regime: a key set of S = num_keys tokens,
          [1, S] (null: the training num_pairs, so every sequence holds every key once, in a
          random order), each sequence N distinct keys of it. S can be at or below the model's
          width, so the keys can be embedded orthogonally and the state is left as the only
          bottleneck. An evaluation setting draws from the training setting's S keys: a test N
          above S would ask for keys the model never saw, and is refused. Single-token keys
          only (key_len 1, key_overlap 0), as in their experiment.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Optional

import torch

from harness.tasks.base import (PAD, Batch, as_config, balanced_choice, check_call, check_float, check_int,
                                empty_labels, eval_grid, longest, make_generator, permutation, require,
                                sample_distinct, validate_settings)

NAME = "interference"
SLICE_NAME = "num_pairs"
KEY_REGIMES = ("shared", "schlag")


@dataclass
class Config:
    num_pairs: int = 16
    vocab_size: int = 512
    seq_len: Optional[int] = None            # None: exactly the pairs and the queries
    num_queries: Optional[int] = None        # None: every stored key is asked once
    key_len: int = 1                         # tokens per key
    key_overlap: float = 0.0                 # in [0, 1): shrinks the per-position token pools
    test_num_pairs: list[int] = field(default_factory=list)  # empty: [num_pairs]
    test_seq_len: list[int] = field(default_factory=list)    # empty: [seq_len] (derived per N when null)
    key_regime: str = "shared"               # shared | schlag (module docstring)
    num_keys: Optional[int] = None           # schlag: S, the key set; null: the training num_pairs


def pool_size(cfg: Config) -> int:
    """P, the tokens available at each key position (see the module docstring)."""
    n, length = cfg.num_pairs, cfg.key_len
    least = 1
    while least**length < n:
        least += 1
    wanted = math.ceil(round((1.0 - float(cfg.key_overlap)) * n, 9))
    return max(wanted, least)


def num_queries(cfg: Config) -> int:
    return cfg.num_pairs if cfg.num_queries is None else cfg.num_queries


def with_key_set(cfg: Config) -> Config:
    """cfg with the schlag regime's key set S fixed (num_keys null: the training num_pairs), so
    that its evaluation settings draw from the keys its training setting drew from."""
    if cfg.key_regime == "schlag" and cfg.num_keys is None:
        return dataclasses.replace(cfg, num_keys=cfg.num_pairs)
    return cfg


def key_range(cfg: Config) -> tuple[int, int]:
    """[low, high) of the token ids a sequence's keys are drawn from."""
    if cfg.key_regime == "schlag":
        return 1, 1 + with_key_set(cfg).num_keys
    return 1, cfg.vocab_size // 2


def seq_len(cfg: Config) -> int:
    """The sequence length of a setting (derived when cfg.seq_len is None)."""
    used = cfg.num_pairs * (cfg.key_len + 1) + num_queries(cfg) * cfg.key_len
    return used if cfg.seq_len is None else cfg.seq_len


def _validate_setting(cfg: Config, where: str) -> None:
    check_int(NAME, f"{where}num_pairs", cfg.num_pairs)
    check_int(NAME, "vocab_size", cfg.vocab_size, minimum=4)
    check_int(NAME, "key_len", cfg.key_len)
    if cfg.num_queries is not None:
        check_int(NAME, "num_queries", cfg.num_queries)
    if cfg.seq_len is not None:
        check_int(NAME, "seq_len", cfg.seq_len)
    require(cfg.key_regime in KEY_REGIMES,
            f"{NAME}: key_regime must be one of {', '.join(KEY_REGIMES)}, got {cfg.key_regime!r}")
    overlap = check_float(NAME, "key_overlap", cfg.key_overlap)
    require(0.0 <= overlap < 1.0, f"{NAME}: key_overlap must be in [0, 1), got {cfg.key_overlap}")
    require(overlap == 0.0 or cfg.key_len >= 2,
            f"{NAME}: key_overlap={cfg.key_overlap} needs key_len >= 2 "
            f"(single-token keys share nothing)")
    n, v, length = cfg.num_pairs, cfg.vocab_size, cfg.key_len
    p = pool_size(cfg)
    key_tokens = v // 2 - 1
    if cfg.key_regime == "schlag":
        _validate_key_set(cfg, where, key_tokens)
    else:
        require(cfg.num_keys is None, f"{NAME}: num_keys={cfg.num_keys} sets the key set of key_regime=schlag; "
                                      f"key_regime={cfg.key_regime} draws from the whole key half")
    require(length * p <= key_tokens,
            f"{NAME}: {where}num_pairs={n} needs key_len*P = {length}*{p} = {length * p} distinct "
            f"key tokens but vocab_size={v} has {key_tokens} in [1, {v // 2}); "
            f"raise vocab_size or key_overlap")
    require(n <= v - v // 2, f"{NAME}: {where}num_pairs={n} distinct values do not fit in the "
                             f"value half [{v // 2}, {v}) of vocab_size={v}; raise vocab_size")
    used = n * (length + 1) + num_queries(cfg) * length
    require(cfg.seq_len is None or used <= cfg.seq_len,
            f"{NAME}: {where}num_pairs={n} pairs and {num_queries(cfg)} queries need {used} positions, "
            f"seq_len={cfg.seq_len}; raise seq_len or set it to null")


def _validate_key_set(cfg: Config, where: str, key_tokens: int) -> None:
    """The schlag regime's own limits: single-token keys, and S keys that hold N and fit the key half."""
    require(cfg.key_len == 1 and float(cfg.key_overlap) == 0.0,
            f"{NAME}: key_regime=schlag takes single-token keys (key_len 1, key_overlap 0), got "
            f"key_len={cfg.key_len}, key_overlap={cfg.key_overlap}")
    keys = with_key_set(cfg).num_keys
    check_int(NAME, "num_keys", keys)
    require(keys <= key_tokens, f"{NAME}: num_keys={keys} keys do not fit in the key half [1, {cfg.vocab_size // 2}) "
                                f"of vocab_size={cfg.vocab_size}; raise vocab_size")
    require(cfg.num_pairs <= keys, f"{NAME}: {where}num_pairs={cfg.num_pairs} distinct keys cannot be drawn from "
                                   f"key_regime=schlag's {keys} keys (num_keys, null: the training num_pairs); "
                                   f"test at N <= {keys} or raise num_keys")


def validate(cfg: Config) -> None:
    """Raise ValueError (one line) unless the training and every evaluation setting is valid."""
    cfg = as_config(Config, cfg, NAME)
    validate_settings(NAME, cfg, _validate_setting, eval_settings)


def eval_settings(cfg: Config) -> list[Config]:
    """One setting per (entry of test_num_pairs, entry of test_seq_len), N varying fastest
    (defaults: the training N and seq_len)."""
    return eval_grid(with_key_set(as_config(Config, cfg, NAME)), "seq_len", "num_pairs")


def max_seq_len(cfg: Config) -> int:
    return longest(cfg, seq_len, eval_settings(cfg))


def _key_digits(codes: torch.Tensor, base: int, length: int) -> torch.Tensor:
    """(B, N) codes -> (B, N, key_len) pool indices, injective for codes < base**length."""
    digits, rest = [], codes
    for _ in range(length):
        digits.append(rest % base)
        rest = rest // base
    first = digits[0]
    cols = [first] + [(first + m) % base for m in digits[1:]]
    return torch.stack(cols, dim=-1)


def make_batch(cfg: Config, batch_size: int, *, seed: int, device: torch.device | str = "cpu",
               split: str = "train") -> Batch:
    cfg = as_config(Config, cfg, NAME)
    _validate_setting(cfg, "")
    check_call(NAME, batch_size, seed, split)
    b, n, v, length = batch_size, cfg.num_pairs, cfg.vocab_size, cfg.key_len
    q, t, p = num_queries(cfg), seq_len(cfg), pool_size(cfg)
    gen = make_generator(seed, split, device)
    dev = gen.device

    codes = permutation(gen, b, n)                                      # (B, N)
    digits = _key_digits(codes, p, length)                              # (B, N, L)
    pools = sample_distinct(gen, b, length * p, *key_range(cfg)).view(b, length, p)  # (B, L, P)
    keys = pools.unsqueeze(1).expand(b, n, length, p)                  # (B, N, L, P)
    keys = keys.gather(3, digits.unsqueeze(-1)).squeeze(-1)             # (B, N, L)
    values = sample_distinct(gen, b, n, v // 2, v)                      # (B, N)
    which = balanced_choice(gen, b, q, n)                               # (B, Q)

    context = torch.cat([keys, values.unsqueeze(-1)], dim=-1).view(b, n * (length + 1))
    asked = keys.gather(1, which.unsqueeze(-1).expand(b, q, length)).view(b, q * length)
    start = n * (length + 1)
    inputs = torch.full((b, t), PAD, dtype=torch.long, device=dev)      # (B, T)
    inputs[:, :start] = context
    first_query = t - q * length                                        # the gap of filler before it
    inputs[:, first_query:] = asked

    label_pos = first_query + torch.arange(q, device=dev) * length + (length - 1)  # (Q,) last key token
    targets, slice_value, target_pos = empty_labels(b, t, dev)
    targets[:, label_pos] = values.gather(1, which)
    slice_value[:, label_pos] = n
    target_pos[:, label_pos] = which * (length + 1) + length
    return Batch(inputs, targets, slice_value, target_pos, SLICE_NAME)
