"""Prefix sums over time and the chunk-to-chunk state scan.

``torch.cumsum`` runs a sequential scalar loop on CPU (slowest along a non-innermost
dimension). The scans here loop over the scanned dimension instead, each step one vectorised
add of a whole slice into a preallocated output, which is several times faster for the shapes
the chunk and parallel forms use (a few to a few thousand steps of thousands of elements).

:func:`scan_states` is the state recurrence between chunks, S_{n+1} = a_n * S_n + U_n, run
forwards for the outputs and backwards for the gradients. It is called inside hand-written
autograd Functions, so it keeps no graph; low-precision states (bf16 under autocast) are
accumulated in float32.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .members import FoldsMembers, member_first


def scan_add(x: torch.Tensor, dim: int, *, reverse: bool = False) -> torch.Tensor:
    """Inclusive cumulative sum along dim (from the end when reverse), one slice add per step."""
    dim = dim % x.dim()
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    n = x.size(dim)
    order = range(n - 1, -1, -1) if reverse else range(n)
    prev = None
    for i in order:
        cur = out.select(dim, i)
        if prev is None:
            cur.copy_(x.select(dim, i))
        else:
            torch.add(prev, x.select(dim, i), out=cur)
        prev = cur
    return out


class _Cumsum(FoldsMembers, torch.autograd.Function):
    @staticmethod
    def fold_members(size, in_dims, args):  # a group's members as a new leading dimension
        x, dim = args
        return (member_first(x, in_dims[0], size), dim + 1), None

    @staticmethod
    def unfold_members(size, y, how):
        return y, 0

    @staticmethod
    def forward(ctx, x, dim):
        ctx.dim = dim
        return scan_add(x, dim)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        return scan_add(grad, ctx.dim, reverse=True), None


def cumsum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Inclusive cumulative sum along dim: torch.cumsum's sums, accumulated in the input dtype."""
    dim = dim % x.dim()
    inner = 1
    for d in range(dim + 1, x.dim()):
        inner *= x.size(d)
    if inner < 16 or x.size(dim) > 16384:
        return torch.cumsum(x, dim=dim)  # short rows: the library kernel is fine
    return _Cumsum.apply(x, dim)


def _advance(u, a, s, out=None):
    """u + a * s (u + s without a), written into out when given."""
    if a is None:
        return torch.add(u, s, out=out) if out is not None else u + s
    return torch.addcmul(u, a, s, out=out) if out is not None else torch.addcmul(u, a, s)


def scan_states(updates: torch.Tensor, decays: torch.Tensor | None, s0: torch.Tensor | None,
                *, reverse: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The state entering each chunk, and the state after the last one. No autograd.

    updates: (M, N, X, Y), chunk n's own contribution U_n; decays: (M, N, G, 1) with G = 1
    or X, the factor chunk n applies to the state it receives (None: no decay); s0: (M, X, Y)
    or None (zeros). Forwards: starts_0 = s0, starts_{n+1} = a_n * starts_n + U_n, and the
    second result is a_{N-1} * starts_{N-1} + U_{N-1}. Reverse runs the same recurrence from
    the last chunk to the first (the gradient of the forward scan): starts_{N-1} = s0,
    starts_{n-1} = a_n * starts_n + U_n, and the second result is a_0 * starts_0 + U_0.
    """
    n = updates.shape[1]
    order = list(range(n - 1, -1, -1)) if reverse else list(range(n))
    decay = (lambda i: None) if decays is None else (lambda i: decays[:, i])
    starts = torch.empty_like(updates, memory_format=torch.contiguous_format)
    if updates.dtype in (torch.float16, torch.bfloat16):
        # A long sum of low-precision states drifts: run it in float32, store the compute dtype.
        state = updates.new_zeros(starts[:, 0].shape, dtype=torch.float32) if s0 is None else s0.float()
        for i in order:
            starts[:, i].copy_(state)
            state = _advance(updates[:, i].float(), decay(i), state)
        return starts, state.to(updates.dtype)
    if s0 is None:
        starts[:, order[0]].zero_()
    else:
        starts[:, order[0]].copy_(s0)
    for prev, nxt in zip(order[:-1], order[1:]):  # written in place: one add per chunk
        _advance(updates[:, prev], decay(prev), starts[:, prev], out=starts[:, nxt])
    last = order[-1]
    return starts, _advance(updates[:, last], decay(last), starts[:, last])
