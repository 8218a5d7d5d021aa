"""Prefix sums and the chunk-to-chunk state scan, with hand-written backward passes.

``torch.cumsum`` along a non-innermost dimension runs a slow scalar loop on CPU, and a
Python loop of autograd ops over chunks allocates a fresh tensor per chunk in both passes.
Both scans here loop over the scanned dimension with in-place adds into one preallocated
output, forward and backward, which is several times faster for the shapes the chunk and
parallel forms use (a few to a few thousand steps of thousands of elements each).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable


class _Cumsum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        ctx.dim = dim
        return _scan_add(x, dim, reverse=False)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        return _scan_add(grad, ctx.dim, reverse=True), None


def _scan_add(x: torch.Tensor, dim: int, *, reverse: bool) -> torch.Tensor:
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


def cumsum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Inclusive cumulative sum along dim: torch.cumsum's sums, accumulated in the input dtype."""
    dim = dim % x.dim()
    inner = 1
    for d in range(dim + 1, x.dim()):
        inner *= x.size(d)
    if inner < 16 or x.size(dim) > 16384:
        return torch.cumsum(x, dim=dim)  # short rows: the library kernel is fine
    return _Cumsum.apply(x, dim)


class _ChunkScan(torch.autograd.Function):
    """starts_n = S_n, S_{n+1} = a_n * S_n + U_n, S_0 = s0 (dim 2 indexes chunks)."""

    @staticmethod
    def forward(ctx, updates, decays, s0):
        # updates (B, H, N, X, Y); decays (B, H, N, G, 1) broadcast over (X, Y), or None; s0 (B, H, X, Y)
        n_chunks = updates.shape[2]
        starts = torch.empty_like(updates, memory_format=torch.contiguous_format)
        starts[:, :, 0] = s0
        for n in range(n_chunks):
            out = starts[:, :, n + 1] if n + 1 < n_chunks else None
            final = _advance(updates[:, :, n], None if decays is None else decays[:, :, n], starts[:, :, n], out)
        ctx.save_for_backward(starts if decays is not None else None, decays)
        ctx.has_decay = decays is not None
        return starts, final

    @staticmethod
    @once_differentiable
    def backward(ctx, g_starts, g_final):
        starts, decays = ctx.saved_tensors
        n_chunks = g_starts.shape[2]
        # g_updates[n] is the gradient with respect to S_{n+1}:
        # G_N = g_final, G_n = g_starts[n] + a_n * G_{n+1}.
        g_updates = torch.empty_like(g_starts, memory_format=torch.contiguous_format)
        g_updates[:, :, n_chunks - 1] = g_final
        for n in range(n_chunks - 1, 0, -1):
            a = None if decays is None else decays[:, :, n]
            _advance(g_starts[:, :, n], a, g_updates[:, :, n], g_updates[:, :, n - 1])
        g_s0 = _advance(g_starts[:, :, 0], None if decays is None else decays[:, :, 0], g_updates[:, :, 0], None)
        g_decays = None
        if ctx.has_decay:
            g_decays = (g_updates * starts).sum(dim=-1, keepdim=True).sum_to_size(decays.shape)
        return g_updates, g_decays, g_s0


def _advance(u, a, s, out):
    """u + a * s (u + s without a), written into out when given."""
    if a is None:
        return torch.add(u, s, out=out) if out is not None else u + s
    return torch.addcmul(u, a, s, out=out) if out is not None else torch.addcmul(u, a, s)


def chunk_scan(updates: torch.Tensor, decays: torch.Tensor | None, s0: torch.Tensor | None):
    """The state entering each chunk and the final state.

    updates: (B, H, N, X, Y), each chunk's own contribution U_n (already decayed to the
    chunk end); decays: (B, H, N, G, 1) with G = 1 or X, the factor a chunk applies to the
    state it receives (None: no decay); s0: (B, H, X, Y) or None (zeros).
    Returns starts (B, H, N, X, Y) with starts_n = S_n, and S_N.
    """
    if s0 is None:
        s0 = updates.new_zeros(updates.shape[:2] + updates.shape[3:])
    return _ChunkScan.apply(updates, decays, s0)
