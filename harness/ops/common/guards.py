"""Numerical guards and argument checks shared by every mixer family.

The denominator floor of normalised linear attention is part of the model: every
form divides through :func:`floor_denominator`, so parallel, recurrent, chunk, step and the
naive reference treat a vanishing denominator identically. A non-finite denominator means
the feature map overflowed; dividing by it would hide the problem, so it raises instead.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Optional

import torch

# the forms of a mixer, the one list (a model's model.form, the cost table's cost.forms, the cores)
FORMS = ("chunk", "parallel", "recurrent")

_finite_checks = True
_watch: Optional[Callable[[torch.Tensor], None]] = None


def set_finite_checks(enabled: bool) -> None:
    """Turn the non-finite denominator check on or off for the whole process.

    The check reads a tensor back to the host (a device sync per call, per token when
    decoding with a step function); switch it off in tight loops once a setup is known to be
    sound. It is always skipped while ``torch.compile`` traces.
    """
    global _finite_checks
    _finite_checks = bool(enabled)


def finite_checks_enabled() -> bool:
    return _finite_checks


def floor_denominator(den: torch.Tensor, eps: float) -> torch.Tensor:
    """|den| floored at eps with its sign kept; an exact zero becomes +eps.

    A tiny denominator of either sign is pushed away from zero rather than divided by, and
    its gradient is zero inside the floor (the floor is a constant there).
    """
    return torch.where(den < 0, den.clamp(max=-eps), den.clamp(min=eps))


@contextmanager
def watching_denominators(record: Callable[[torch.Tensor], None]) -> Iterator[None]:
    """Hand every denominator phi(q).z computed inside the block to ``record`` (detached).

    A training loop checks on the device and reads the verdict at its next sync, instead of a
    host sync per call here; the denominators it receives cover real positions only (no chunk
    padding). Outside such a block a non-finite denominator raises on the spot.
    """
    global _watch
    previous, _watch = _watch, record
    try:
        yield
    finally:
        _watch = previous


def check_finite_denominator(den: torch.Tensor, where: str) -> None:
    """Raise FloatingPointError when any denominator is inf or NaN (see set_finite_checks);
    inside :func:`watching_denominators` record it instead."""
    if torch.compiler.is_compiling():
        return
    if _watch is not None:
        _watch(den.detach())
        return
    if not _finite_checks:
        return
    if not bool(torch.isfinite(den).all()):
        bad = int((~torch.isfinite(den)).sum())
        raise FloatingPointError(
            f"{where}: {bad} non-finite normalisation denominator(s) phi(q).z; the feature-mapped "
            "q or k overflowed (or hold NaN). Scale q/k down, use a stabilised feature map, or "
            "switch this check off with harness.ops.set_finite_checks(False)."
        )


def check_eps(eps: float) -> None:
    if not eps > 0:
        raise ValueError(f"eps must be > 0 (the denominator floor), got {eps!r}")


def check_form(form: str) -> None:
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")


def check_chunk_size(chunk_size: int) -> None:
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, where: str) -> None:
    """q, k: (B, H, T, Dk); v: (B, H, T, Dv); T >= 1."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"{where}: q, k, v must be (batch, heads, time, dim), got shapes "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape != k.shape:
        raise ValueError(f"{where}: q and k must have the same shape, got {tuple(q.shape)} and {tuple(k.shape)}")
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(f"{where}: v must share (batch, heads, time) with q, got {tuple(v.shape)} and {tuple(q.shape)}")
    if q.shape[2] < 1:
        raise ValueError(f"{where}: the sequence must hold at least one token")


def check_qkv_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, where: str) -> None:
    """q, k: (B, H, Dk); v: (B, H, Dv) — one token."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(
            f"{where}: q, k, v must be (batch, heads, dim) for one token, got shapes "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape != k.shape or v.shape[:2] != q.shape[:2]:
        raise ValueError(f"{where}: mismatched shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")


def query_positions(q: torch.Tensor, rows: Optional[torch.Tensor]) -> torch.Tensor:
    """The positions whose weight rows are asked for: ``rows`` ((R,) long, each in [0, T)) on
    q's device, or every position 0..T-1 when rows is None."""
    t = q.shape[2]
    if rows is None:
        return torch.arange(t, device=q.device)
    rows = torch.as_tensor(rows, device=q.device).long().reshape(-1)
    if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= t):
        raise ValueError(f"rows must be positions in [0, {t}), got {rows.min().item()}..{rows.max().item()}")
    return rows
