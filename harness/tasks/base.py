"""What every task shares: the Batch it returns, the seeded generator, and sampling functions.

All sampling is vectorised across the batch: "k distinct items per example" is the top-k of
independent uniforms (a uniformly random ordered k-subset), never a Python loop per example.
Random draws happen in a fixed order, so a (seed, split, device) triple fixes the batch.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, NoReturn, Optional, TypeVar

import torch

from harness.checks import require

IGNORE = -100      # target value where there is no loss (torch's cross_entropy default)
PAD = 0            # token 0 is never a key, value or trigger: it is the filler/padding token
NO_SLICE = -1      # slice_value and target_pos where there is no label
SPLITS = ("train", "test", "val")  # val: the split learning rates are chosen on; test is reported


class Batch(NamedTuple):
    """One batch of a task; all tensors (B, T) long on the requested device.

    inputs:       token ids.
    targets:      the token to predict at each position, IGNORE where there is no loss.
    slice_value:  the value of the variable the accuracy is sliced by (N for recall and
                  interference, key->query distance for induction) at labelled positions,
                  NO_SLICE elsewhere.
    target_pos:   where the answer can be read from: inputs[b, target_pos[b, t]] == targets[b, t]
                  at every labelled position t, NO_SLICE elsewhere.
    slice_name:   "num_pairs", "distance", ...
    other_slices: further variables the accuracy is sliced by, ((name, (B, T) long), ...), laid
                  out as slice_value (forgetting: the age of a key's last write beside whether
                  it was overwritten); empty for most tasks.
    stale:        where a wrong answer has a name: at a labelled position, the token a model
                  that kept an old association would give (forgetting: the earlier value of a
                  key written twice), IGNORE where there is none; None for a task without one.
                  Evaluation counts the predictions equal to it (a slice row's `stale`).
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    slice_value: torch.Tensor
    target_pos: torch.Tensor
    slice_name: str
    other_slices: tuple = ()
    stale: Optional[torch.Tensor] = None

    @property
    def label_mask(self) -> torch.Tensor:
        return self.targets != IGNORE  # (B, T) bool

    def slices(self) -> list[tuple[str, torch.Tensor]]:
        """Every slicing variable: (slice_name, slice_value) first, then other_slices."""
        return [(self.slice_name, self.slice_value), *self.other_slices]

    def to(self, device: torch.device | str) -> "Batch":
        return Batch(self.inputs.to(device), self.targets.to(device), self.slice_value.to(device),
                     self.target_pos.to(device), self.slice_name,
                     tuple((name, value.to(device)) for name, value in self.other_slices),
                     None if self.stale is None else self.stale.to(device))


def batch_field(batch, name: str):
    """A field of a Batch or of a mapping with the same keys."""
    return batch[name] if isinstance(batch, dict) else getattr(batch, name)


def label_positions(targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The labelled positions of each row and their targets, each (B, K) long.

    K is the most labels any row has; a row's labelled positions come first, in order, and a
    row with fewer labels is padded with unlabelled positions (their target is IGNORE, so they
    carry no loss). The model's head then runs at K positions per row instead of T
    (LanguageModel.forward(inputs, positions)). Reading K is one host sync.
    """
    labelled = targets != IGNORE  # (B, T)
    k = int(labelled.sum(dim=1).max()) if targets.numel() else 0
    order = torch.argsort((~labelled).to(torch.int8), dim=1, stable=True)[:, :k]  # (B, K) labelled first
    return order, targets.gather(1, order)


# ---------------------------------------------------------------------------------------------
# validation: every failure is one readable line, raised as ValueError

def fail(message: str) -> NoReturn:
    raise ValueError(message)


def check_int(task: str, name: str, value: object, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        fail(f"{task}: {name} must be an integer, got {value!r}")
    if value < minimum:
        fail(f"{task}: {name} must be >= {minimum}, got {value}")


def check_float(task: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        fail(f"{task}: {name} must be a finite number, got {value!r}")
    return float(value)


def check_call(task: str, batch_size: object, seed: object, split: object) -> None:
    """The arguments of make_batch that are not part of the config."""
    check_int(task, "batch_size", batch_size)
    if isinstance(seed, bool) or not isinstance(seed, int):
        fail(f"{task}: seed must be an integer, got {seed!r}")
    if split not in SPLITS:
        fail(f"{task}: unknown split {split!r}; valid: {', '.join(SPLITS)}")


C = TypeVar("C")


def as_config(cls: type[C], cfg: object, task: str) -> C:
    """Accept the task's Config or a mapping of its fields (e.g. an OmegaConf node).

    Unknown keys are an error rather than silently dropped; a `name` key equal to the task's
    name (the Hydra group choice) is allowed.
    """
    if isinstance(cfg, cls):
        return cfg
    if not isinstance(cfg, Mapping):
        fail(f"{task}: expected a {cls.__name__} or a mapping of its fields, got {type(cfg).__name__}")
    fields = {f.name for f in dataclasses.fields(cls)}
    values = {}
    for key, value in cfg.items():
        if key == "name" and value == task:
            continue
        if key not in fields:
            fail(f"{task}: unknown config field {key!r}; valid: {', '.join(sorted(fields))}")
        if isinstance(value, Sequence) and not isinstance(value, str):
            value = list(value)
        values[key] = value
    return cls(**values)


# ---------------------------------------------------------------------------------------------
# seeded sampling, vectorised over the batch

def make_generator(seed: int, split: str, device: torch.device | str) -> torch.Generator:
    """A generator for (seed, split): train, test and val draw from disjoint streams.

    Train and test use stream 2*seed + (0 or 1), which is injective in (seed, split) below
    2**63; val uses 2**63 + seed (torch seeds take 64 bits), above every train or test stream.
    So no seed of one split ever reproduces a batch of another, and adding val left the train
    and test batches of every seed as they were. Batches are identical for identical (seed,
    split, device); a CPU and a CUDA generator give different (equally valid) batches.
    """
    if split == "val":
        stream = 2**63 + seed % (2**63)
    else:
        stream = (2 * seed + SPLITS.index(split)) % (2**63)
    gen = torch.Generator(device=torch.device(device))
    gen.manual_seed(stream)
    return gen


def uniform(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.rand(*shape, generator=gen, device=gen.device)


def randint(gen: torch.Generator, low: int, high: int, *shape: int) -> torch.Tensor:
    """Integers uniform in [low, high)."""
    return torch.randint(low, high, shape, generator=gen, device=gen.device)


def sample_distinct(gen: torch.Generator, batch: int, k: int, low: int, high: int) -> torch.Tensor:
    """(batch, k) integers from [low, high), distinct within each row, in random order."""
    scores = uniform(gen, batch, high - low)                   # (B, R)
    return scores.topk(k, dim=1).indices + low                 # (B, k)


def permutation(gen: torch.Generator, batch: int, n: int) -> torch.Tensor:
    """(batch, n): an independent random permutation of 0..n-1 per row."""
    return uniform(gen, batch, n).argsort(dim=1)


def balanced_choice(gen: torch.Generator, batch: int, q: int, n: int) -> torch.Tensor:
    """(batch, q) indices into 0..n-1, each used floor(q/n) or ceil(q/n) times, random order.

    With q <= n the indices of a row are distinct (a random q-subset), as when every stored
    key is queried at most once.
    """
    perm = permutation(gen, batch, n)                                   # (B, n)
    cycle = torch.arange(q, device=gen.device) % n                     # (q,)
    chosen = perm[:, cycle]                                             # (B, q)
    order = permutation(gen, batch, q)                                  # (B, q)
    return chosen.gather(1, order)


def power_law_offsets(gen: torch.Generator, batch: int, k: int, space: int,
                      power_a: float) -> torch.Tensor:
    """(batch, k) distinct offsets in 0..space-1, drawn with p(s) ∝ (s+1)^(power_a-1), sorted.

    The gap law of Zoology's MQAR: with power_a = 0.01 short gaps are much likelier than long
    ones (p ∝ 1/s roughly); power_a = 1 is uniform.
    """
    s = torch.arange(1, space + 1, device=gen.device, dtype=torch.float32)  # (space,)
    p = s ** (power_a - 1)                                              # unnormalised weights
    picks = torch.multinomial(p.expand(batch, space), k, replacement=False, generator=gen)
    return picks.sort(dim=1).values                                     # (B, k)


def sample_excluding(gen: torch.Generator, shape: tuple[int, int], low: int, high: int,
                     excluded: torch.Tensor) -> torch.Tensor:
    """(B, L) integers uniform over [low, high) minus each row's ``excluded`` tokens ((B, E),
    distinct within a row and inside [low, high)).

    One uniform draw u in [0, high - low - E) per entry, mapped to the u-th allowed token:
    a_u = low + u + #{i : e_i - low - i <= u} over the row's sorted exclusions e_0 < e_1 < ...
    (e_i - low - i allowed tokens lie below e_i), by one searchsorted: vectorised, no rejection.
    """
    b, length = shape
    e = excluded.sort(dim=1).values                                     # (B, E)
    room = high - low - e.shape[1]
    u = (uniform(gen, b, length) * room).long().clamp_(max=room - 1)   # (B, L) in [0, room)
    below = e - low - torch.arange(e.shape[1], device=e.device)         # (B, E) allowed tokens below e_i
    return low + u + torch.searchsorted(below.contiguous(), u, right=True)


def lengths(cfg) -> list[int]:
    """The evaluation lengths of a config with a seq_len and a test_seq_len list (empty: seq_len)."""
    return list(cfg.test_seq_len) or [cfg.seq_len]


# ---------------------------------------------------------------------------------------------
# the protocol's settings, shared: each task says which of its fields the evaluation varies

def eval_grid(cfg: C, *fields: str, clear: Sequence[str] = ()) -> list[C]:
    """One evaluation setting per combination of the config's test lists, each a plain
    training-style config: for each of ``fields`` its ``test_<field>`` entries (empty: the
    training value), the first field varying slowest; every ``test_*`` list, and each field of
    ``clear``, emptied in the settings."""
    values = [list(getattr(cfg, f"test_{name}")) or [getattr(cfg, name)] for name in fields]
    empty = {f.name: [] for f in dataclasses.fields(cfg) if f.name.startswith("test_") or f.name in clear}
    return [dataclasses.replace(cfg, **empty, **dict(zip(fields, combo))) for combo in itertools.product(*values)]


def longest(cfg, seq_len: Callable, settings: Sequence) -> int:
    """The longest sequence of ``cfg`` and of each of ``settings`` by the task's ``seq_len``: what
    positional tables and the resource estimate are sized by."""
    return max(int(seq_len(s)) for s in [cfg, *settings])


def check_lengths(task: str, cfg) -> None:
    """test_seq_len: a list of lengths, each an integer >= 1."""
    if not isinstance(cfg.test_seq_len, (list, tuple)):
        fail(f"{task}: test_seq_len must be a list of lengths (e.g. [64,1024]), got {cfg.test_seq_len!r}")
    for t in cfg.test_seq_len:
        check_int(task, "test_seq_len entry", t)


def empty_labels(batch: int, seq_len: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """targets, slice_value, target_pos with no labelled position yet; each (B, T) long."""
    def full(value: int) -> torch.Tensor:
        return torch.full((batch, seq_len), value, dtype=torch.long, device=device)

    return full(IGNORE), full(NO_SLICE), full(NO_SLICE)


def validate_settings(name: str, cfg, validate_setting: Callable, eval_settings: Callable) -> None:
    """Validate the training setting of cfg and each of its evaluation settings (one per entry
    of cfg.test_num_pairs and of cfg.test_seq_len, where the task has them):
    ``validate_setting(setting, where)`` raises with ``where`` ("" or "test ") naming which one failed."""
    for n in getattr(cfg, "test_num_pairs", []):
        check_int(name, "test_num_pairs entry", n)
    if hasattr(cfg, "test_seq_len"):
        check_lengths(name, cfg)
    validate_setting(cfg, "")
    for setting in eval_settings(cfg):
        validate_setting(setting, "test ")
