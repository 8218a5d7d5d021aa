"""Multi-query associative recall (MQAR), the layout of Zoology (Arora et al. 2023).

Vocabulary: token 0 is the filler; keys come from [1, V//2), values from [V//2, V).
Each example writes N pairs (distinct keys, distinct values) first, then asks queries:
a query is a stored key, and the model must predict its value *at the query position*.
Labels exist only at query positions.

    V=16, N=2, seq_len=9, num_queries=3, power_a=1 (one possible draw):

    position     0   1   2   3 | 4   5   6   7   8
    inputs       3  12   5   9 | 5   0   3   5   0
    targets      .   .   .   . | 9   .  12   9   .
    target_pos   .   .   .   . | 3   .   1   3   .
    slice_value  .   .   .   . | 2   .   2   2   .

(`.` is IGNORE in targets, -1 in target_pos/slice_value.) target_pos is the position of the
value token that answers the query: inputs[b, target_pos[b, t]] == targets[b, t].

Queries: `num_queries=None` asks each stored key once (Q = N, as Zoology). Queries sit at
distinct offsets s from the end of the pairs drawn with p(s) ∝ (s+1)^(power_a-1) (Zoology's
power law: short gaps dominate at power_a=0.01), and the other positions hold the filler 0.
`num_queries = seq_len - 2N` fills every position after the pairs with a query: more labels
per example, but for a linear state each query is also a write (the key before it paired with
this key), so N pairs compete with T - 2N such writes and normalised kernels stall near 1/N.
Which key each query asks is balanced: with Q <= N the queried keys are distinct; with Q > N
each key is asked floor(Q/N) or ceil(Q/N) times, in random order. Values never reappear after the pairs, so
target_pos is the only place the answer can be read from.

Distractors (`filler="random"`, Zoology's default MQAR, its `random_non_queries`): every
position after the pairs that is not a query holds a random token instead of 0 (each one
with probability `filler_rate`), so keys and values that are not stored pairs appear between
the queries, and a linear state takes a write of noise at each of them.

    filler=random, V=16, N=2, seq_len=9, num_queries=2 (one possible draw; keys 3, 5):

    position     0   1   2   3 | 4   5   6   7   8
    inputs       3  12   5   9 | 7   5  14   3   1
    targets      .   .   .   . | .   9   .  12   .
    target_pos   .   .   .   . | .   3   .   1   .

Labels stay unambiguous: the random tokens are drawn from [1, V) minus the example's own
stored keys and values, so a stored key occurs only in its pair and at its queries (a query
is never mistaken for a later write of its key) and a stored value only in its pair
(target_pos stays the one place the answer can be read from). Other keys and values, which
no query asks, do appear: those are the distractors. The random tokens are drawn after
everything else, so with the same seed the pairs and queries are those of the zero layout.

Evaluation: `eval_settings` gives one setting per entry of `test_num_pairs` (default the
training N) and of `test_seq_len` (default the training length), every N at every length;
accuracy is sliced by N ("num_pairs"), each row with its length.

A training mixture (`mixture`, Based's and Zoology's frontier protocol): a list of
[seq_len, num_pairs] settings, or [seq_len, num_pairs, weight] (relative shares; Based trains
on 100,000 examples of (64, 4) and 20,000 of each longer setting, weights 5, 1, 1, 1, 1). Each
training example draws its setting from the mixture (from the batch's own generator, so the
batch is fixed by its seed), is generated at that setting's length exactly as a batch of that
setting alone would lay it out, and is right-padded to the mixture's longest length with PAD,
whose labels are IGNORE:

    mixture=[[6,1],[9,2]], V=16 (two examples of one batch):

    position     0   1   2   3   4   5 | 6   7   8
    inputs       3  12   0   3   0   0 | 0   0   0     (6, 1), then padding
    inputs       3  12   5   9   5   0   3   0   0     (9, 2)

Every label of an example lies inside its own length, and the padding comes after all of them,
so a causal model's outputs at the labelled positions are those of the unpadded example (the
padding is not there yet when they are computed); only the shapes of the computation change,
which moves float32 results by rounding alone (tests/test_tasks.py holds it in float64).
Validation uses the mixture too: `val_settings` gives one setting per mixture entry, each at
its own length (so validation accuracy is per training setting). The test settings stay
`test_seq_len` x `test_num_pairs` (their defaults, `seq_len` and `num_pairs`, are then only
that: with a mixture they are not a training setting).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from harness.tasks.base import (IGNORE, PAD, Batch, as_config, balanced_choice, check_call, check_float,
                                check_int, empty_labels, eval_grid, fail, longest, make_generator,
                                power_law_offsets, require, sample_distinct, sample_excluding, uniform,
                                validate_settings)

NAME = "recall"
MAX_POWER_A = 8.0
SLICE_NAME = "num_pairs"


@dataclass
class Config:
    seq_len: int = 64
    vocab_size: int = 256
    num_pairs: int = 4
    num_queries: Optional[int] = None        # None: num_pairs (each stored key asked once)
    power_a: float = 0.01                    # gap law p(s) ∝ (s+1)^(power_a-1); 1 = uniform
    filler: str = "zero"                     # zero (0 between the queries) | random (distractors)
    filler_rate: float = 1.0                 # filler=random: the share of filler positions made random
    test_seq_len: list[int] = field(default_factory=list)    # empty: [seq_len]
    test_num_pairs: list[int] = field(default_factory=list)  # empty: [num_pairs]
    # training settings [seq_len, num_pairs] (or [seq_len, num_pairs, weight]) each example draws
    # from; empty: the one setting (seq_len, num_pairs)
    mixture: list[Any] = field(default_factory=list)


FILLERS = ("zero", "random")


def _num_queries(cfg: Config) -> int:
    return cfg.num_pairs if cfg.num_queries is None else cfg.num_queries


def _validate_setting(cfg: Config, where: str) -> None:
    check_int(NAME, f"{where}seq_len", cfg.seq_len)
    check_int(NAME, "vocab_size", cfg.vocab_size, minimum=4)
    check_int(NAME, f"{where}num_pairs", cfg.num_pairs)
    a = check_float(NAME, "power_a", cfg.power_a)
    # Above MAX_POWER_A, (s+1)^(power_a-1) overflows float32 at long gaps (power_law_offsets).
    require(0 < a <= MAX_POWER_A, f"{NAME}: power_a must be in (0, {MAX_POWER_A}] (1: uniform gaps), got {cfg.power_a}")
    n, t, v = cfg.num_pairs, cfg.seq_len, cfg.vocab_size
    keys, values = v // 2 - 1, v - v // 2
    require(n <= keys, f"{NAME}: {where}num_pairs={n} distinct keys do not fit in the key half "
                       f"[1, {v // 2}) of vocab_size={v} ({keys} keys); raise vocab_size")
    require(n <= values, f"{NAME}: {where}num_pairs={n} distinct values do not fit in the value half "
                         f"[{v // 2}, {v}) of vocab_size={v} ({values} values); raise vocab_size")
    if cfg.num_queries is not None:
        check_int(NAME, "num_queries", cfg.num_queries)
    q = _num_queries(cfg)
    default = " (num_queries defaults to num_pairs)" if cfg.num_queries is None else ""
    require(2 * n + q <= t, f"{NAME}: 2*num_pairs + num_queries = {2 * n + q} exceeds "
                            f"{where}seq_len={t}{default}")
    require(cfg.filler in FILLERS, f"{NAME}: unknown filler {cfg.filler!r}; valid: {', '.join(FILLERS)}")
    rate = check_float(NAME, "filler_rate", cfg.filler_rate)
    require(0.0 <= rate <= 1.0, f"{NAME}: filler_rate must be in [0, 1], got {cfg.filler_rate}")


def _mixture_entries(cfg: Config) -> list[tuple[int, int, float]]:
    """(seq_len, num_pairs, weight) of every mixture entry; ValueError (one line) for a malformed one."""
    if not isinstance(cfg.mixture, (list, tuple)):
        fail(f"{NAME}: mixture must be a list of [seq_len, num_pairs] or [seq_len, num_pairs, weight] "
             f"(e.g. [[64,4],[128,8]]), got {cfg.mixture!r}")
    entries = []
    for i, entry in enumerate(cfg.mixture):
        entry = list(entry) if isinstance(entry, Sequence) and not isinstance(entry, str) else entry
        if not isinstance(entry, list) or len(entry) not in (2, 3):
            fail(f"{NAME}: mixture[{i}] must be [seq_len, num_pairs] or [seq_len, num_pairs, weight], got {entry!r}")
        check_int(NAME, f"mixture[{i}] seq_len", entry[0])
        check_int(NAME, f"mixture[{i}] num_pairs", entry[1])
        weight = check_float(NAME, f"mixture[{i}] weight", entry[2]) if len(entry) == 3 else 1.0
        require(weight > 0, f"{NAME}: mixture[{i}] weight must be > 0, got {weight:g}")
        entries.append((entry[0], entry[1], weight))
    return entries


def mixture_settings(cfg: Config) -> list[Config]:
    """The training settings of the mixture, each a plain Config (no mixture, no test lists)."""
    cfg = as_config(Config, cfg, NAME)
    return [dataclasses.replace(cfg, seq_len=t, num_pairs=n, mixture=[], test_seq_len=[], test_num_pairs=[])
            for t, n, _ in _mixture_entries(cfg)]


def validate(cfg: Config) -> None:
    """Raise ValueError (one line) unless the training, every mixture and every evaluation setting is valid."""
    cfg = as_config(Config, cfg, NAME)
    validate_settings(NAME, cfg, _validate_setting, eval_settings)
    for i, setting in enumerate(mixture_settings(cfg)):
        _validate_setting(setting, f"mixture[{i}] ")


def eval_settings(cfg: Config) -> list[Config]:
    """One setting per (test N, test length), N varying fastest; each a plain training-style Config."""
    return eval_grid(as_config(Config, cfg, NAME), "seq_len", "num_pairs", clear=["mixture"])


def val_settings(cfg: Config) -> list[Config]:
    """The validation settings: one per mixture entry (the settings the model trains on), or
    eval_settings without a mixture."""
    cfg = as_config(Config, cfg, NAME)
    return mixture_settings(cfg) if cfg.mixture else eval_settings(cfg)


def seq_len(cfg: Config) -> int:
    """The length of this config's training examples, from the config alone (no example is
    generated): a mixture's examples are padded to its longest setting."""
    cfg = as_config(Config, cfg, NAME)
    return max(s.seq_len for s in mixture_settings(cfg)) if cfg.mixture else cfg.seq_len


def max_seq_len(cfg: Config) -> int:
    """The longest sequence of the training and evaluation settings (for positional tables)."""
    cfg = as_config(Config, cfg, NAME)
    return longest(cfg, lambda s: s.seq_len, eval_settings(cfg) + mixture_settings(cfg))


def make_batch(cfg: Config, batch_size: int, *, seed: int, device: torch.device | str = "cpu",
               split: str = "train") -> Batch:
    cfg = as_config(Config, cfg, NAME)
    _validate_setting(cfg, "")
    check_call(NAME, batch_size, seed, split)
    gen = make_generator(seed, split, device)
    if cfg.mixture:
        return _mixture_batch(cfg, batch_size, gen)
    return _generate(cfg, batch_size, gen)


def _mixture_batch(cfg: Config, b: int, gen: torch.Generator) -> Batch:
    """b examples, each of a setting drawn from the mixture with its weight, generated at its own
    length (one vectorised call per setting) and right-padded with PAD / IGNORE to the
    mixture's longest length (see the module docstring for why the padding changes nothing)."""
    settings = mixture_settings(cfg)
    for i, setting in enumerate(settings):
        _validate_setting(setting, f"mixture[{i}] ")
    weights = torch.tensor([w for _, _, w in _mixture_entries(cfg)], dtype=torch.float32, device=gen.device)
    which = torch.multinomial(weights, b, replacement=True, generator=gen)  # (B,) setting of each example
    t = max(s.seq_len for s in settings)
    inputs = torch.full((b, t), PAD, dtype=torch.long, device=gen.device)
    targets, slice_value, target_pos = empty_labels(b, t, gen.device)
    for i, setting in enumerate(settings):
        rows = (which == i).nonzero().squeeze(1)  # (B_i,)
        if rows.numel() == 0:
            continue
        part = _generate(setting, rows.numel(), gen)  # (B_i, T_i), labels only inside T_i
        width = setting.seq_len
        for full, piece in ((inputs, part.inputs), (targets, part.targets), (slice_value, part.slice_value),
                            (target_pos, part.target_pos)):
            full[rows, :width] = piece
    return Batch(inputs, targets, slice_value, target_pos, SLICE_NAME)


def _generate(cfg: Config, b: int, gen: torch.Generator) -> Batch:
    """A batch of b examples of the one setting cfg (seq_len, num_pairs), drawn from gen."""
    t, n, v = cfg.seq_len, cfg.num_pairs, cfg.vocab_size
    q = _num_queries(cfg)
    dev = gen.device

    keys = sample_distinct(gen, b, n, 1, v // 2)                        # (B, N)
    values = sample_distinct(gen, b, n, v // 2, v)                      # (B, N)
    which = balanced_choice(gen, b, q, n)                               # (B, Q) pair asked
    if q == t - 2 * n:
        offsets = torch.arange(q, device=dev).expand(b, q)              # (B, Q) every position
    else:
        offsets = power_law_offsets(gen, b, q, t - 2 * n, float(cfg.power_a))  # (B, Q)
    query_pos = 2 * n + offsets                                         # (B, Q)

    inputs = torch.full((b, t), PAD, dtype=torch.long, device=dev)      # (B, T)
    inputs[:, 0:2 * n:2] = keys
    inputs[:, 1:2 * n:2] = values
    inputs.scatter_(1, query_pos, keys.gather(1, which))
    targets, slice_value, target_pos = empty_labels(b, t, dev)
    targets.scatter_(1, query_pos, values.gather(1, which))
    slice_value.scatter_(1, query_pos, n)
    target_pos.scatter_(1, query_pos, 2 * which + 1)
    if cfg.filler == "random":  # drawn last: pairs and queries stay those of the zero layout
        stored = torch.cat([keys, values], dim=1)                        # (B, 2N) never drawn
        tokens = sample_excluding(gen, (b, t), 1, v, stored)             # (B, T)
        filler = (uniform(gen, b, t) < float(cfg.filler_rate)) & (targets == IGNORE)
        filler[:, :2 * n] = False                                        # (B, T) after the pairs, not a query
        inputs = torch.where(filler, tokens, inputs)
    return Batch(inputs, targets, slice_value, target_pos, SLICE_NAME)
