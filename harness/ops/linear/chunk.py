"""The chunk form of causal linear attention as one autograd Function with a hand-written backward.

Per chunk n of C positions (q, k, v the chunk's rows; S_n, z_n the state entering it):

    num = q S_n + tril(q k^T) v        den = q z_n + rowsum(tril(q k^T))
    S_{n+1} = S_n + k^T v              z_{n+1} = z_n + sum of the chunk's keys

and o = num / floor(den) (or num unnormalised). Every product is a batched matmul over many
chunks at once; only the state recurrence is a loop, over chunks (not tokens), one add each.
The backward pass has the same structure: with dnum, dden from the read-out,
dA = tril(dnum v^T + dden 1^T) and G_n the gradient reaching the state that leaves chunk n
(a reverse scan of the chunks' q^T dnum),

    dq = dA k + dnum S_n^T + dden z_n^T     dk = dA^T q + v G_n^T + g_n     dv = A^T dnum + k G_n

(g_n the same for z). Autograd through the forward would keep every intermediate it made and
walk several more elementwise passes; here the saved tensors are the inputs, the output, the
denominators, the masked in-chunk weights A (C per token) and the entering states
(Dk Dv / C per token), so memory stays linear in T.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .. import fused_cpu
from ..common.chunking import chunk_blocks
from ..common.members import FoldsMembers
from ..common.guards import check_finite_denominator, floor_denominator
from ..common.precision import autocast_off, compute_dtype
from ..common.prefix import scan_states


class LinearChunk(FoldsMembers, torch.autograd.Function):
    """(q, k, v, S0, z0) -> (o, S, z) over chunked inputs.

    q, k: (M, N, C, Dk), v: (M, N, C, Dv), contiguous, one dtype; s0 (M, Dk, Dv) and z0
    (M, Dk) or None. o (M, N, C, Dv) is num / floor(den) (harness.ops.common.guards.floor_denominator,
    the read-out of every form), or num itself when ``eps`` is None; S (M, Dk, Dv) and
    z (M, Dk) the final state. ``exclusive`` drops the diagonal of A. The states come first
    (one product over all chunks, then the scan); everything else is chunk-local and runs
    block by block (harness.ops.common.chunking.chunk_blocks), the read-out included.
    """

    @staticmethod
    def forward(ctx, q, k, v, s0, z0, exclusive: bool, eps: float | None, length: int):
        m, n, c, dk = q.shape
        dv = v.shape[-1]
        mn, normalize = m * n, eps is not None
        q3, k3, v3 = q.view(mn, c, dk), k.view(mn, c, dk), v.view(mn, c, dv)
        starts, s_final = scan_states(torch.bmm(k3.transpose(1, 2), v3).view(m, n, dk, dv), None, s0)
        z_starts, z_final = scan_states(k.sum(dim=2).unsqueeze(-1), None,
                                        None if z0 is None else z0.unsqueeze(-1))  # (M, N, Dk, 1)
        s3, z3 = starts.view(mn, dk, dv), z_starts.view(mn, 1, dk)
        a = q.new_empty(mn, c, c)  # tril(q k^T) per chunk, kept for the backward pass
        o = q.new_empty(mn, c, dv)
        den = q.new_empty(mn, c) if normalize else None
        for b in chunk_blocks(mn, q.device):
            ab = torch.bmm(q3[b], k3[b].transpose(1, 2), out=a[b]).tril_(-1 if exclusive else 0)
            ob = torch.bmm(q3[b], s3[b], out=o[b]).baddbmm_(ab, v3[b])  # inter-chunk read + intra-chunk
            if normalize:  # rowsum(A) + q . z_n (a multiply and a sum beat a matrix-vector product on CPU)
                db = torch.sum(ab, dim=-1, out=den[b]).add_((q3[b] * z3[b]).sum(dim=-1))
                ob.mul_(floor_denominator(db, eps).reciprocal_().unsqueeze(-1))
        if normalize:
            check_finite_denominator(den.view(m, n * c)[:, :length], "linear_attention")  # no padding
        ctx.save_for_backward(q, k, v, a, starts, z_starts, o, den)
        ctx.exclusive, ctx.eps = exclusive, eps
        return o.view(m, n, c, dv), s_final, z_final.squeeze(-1)

    @staticmethod
    @once_differentiable
    def backward(ctx, do, ds_final, dz_final):
        with autocast_off(do.device.type):
            return LinearChunk._backward(ctx, do, ds_final, dz_final)

    @staticmethod
    def _backward(ctx, do, ds_final, dz_final):
        q, k, v, a, starts, z_starts, o, den = ctx.saved_tensors
        m, n, c, dk = q.shape
        dv = v.shape[-1]
        mn, normalize = m * n, ctx.eps is not None
        q3, k3, v3 = q.view(mn, c, dk), k.view(mn, c, dk), v.view(mn, c, dv)
        do3 = do.reshape(mn, c, dv)
        blocks = chunk_blocks(mn, q.device)

        # Through the read-out: o = num r, r = 1 / floor(den); the floor is flat for |den| < eps.
        # dnum = do r, dden = -(do . o) r where the floor passes den through. Then the
        # gradients reaching each chunk's outgoing state: reverse scans of q^T dnum and q^T dden.
        dnum3, dden3 = (q.new_empty(mn, c, dv), q.new_empty(mn, c, 1)) if normalize else (do3, None)
        h = q.new_empty(mn, dk, dv)
        hz = q.new_zeros(mn, 1, dk)  # q^T dden per chunk
        for b in blocks:
            if normalize:
                r = floor_denominator(den[b], ctx.eps).reciprocal_().unsqueeze(-1)  # (g, C, 1)
                torch.mul(do3[b], r, out=dnum3[b])
                passes = (den[b] >= ctx.eps) | (den[b] <= -ctx.eps)
                torch.mul((do3[b] * o[b]).sum(dim=-1, keepdim=True), r, out=dden3[b]).neg_().mul_(passes.unsqueeze(-1))
                torch.sum(q3[b] * dden3[b], dim=1, keepdim=True, out=hz[b])
            torch.bmm(q3[b].transpose(1, 2), dnum3[b], out=h[b])
        g, ds0 = scan_states(h.view(m, n, dk, dv), None, ds_final, reverse=True)
        gz, dz0 = scan_states(hz.view(m, n, dk, 1), None, None if dz_final is None else dz_final.unsqueeze(-1),
                              reverse=True)
        g3, s3 = g.view(mn, dk, dv), starts.view(mn, dk, dv)
        gz3, z3 = gz.view(mn, 1, dk), z_starts.view(mn, 1, dk)

        dq, dkk, dvv = torch.empty_like(q3), torch.empty_like(k3), torch.empty_like(v3)
        da = q.new_empty(blocks[0].stop - blocks[0].start, c, c)  # one block's dA, reused
        for b in blocks:
            dab = torch.bmm(dnum3[b], v3[b].transpose(1, 2), out=da[: b.stop - b.start])
            if normalize:
                dab.add_(dden3[b])
            dab.tril_(-1 if ctx.exclusive else 0)
            torch.bmm(dab, k3[b], out=dq[b]).baddbmm_(dnum3[b], s3[b].transpose(1, 2))
            torch.bmm(dab.transpose(1, 2), q3[b], out=dkk[b]).baddbmm_(v3[b], g3[b].transpose(1, 2)).add_(gz3[b])
            torch.bmm(a[b].transpose(1, 2), dnum3[b], out=dvv[b]).baddbmm_(k3[b], g3[b])
            if normalize:
                dq[b].addcmul_(dden3[b], z3[b])
        need = ctx.needs_input_grad
        return (dq.view(q.shape), dkk.view(k.shape), dvv.view(v.shape),
                ds0 if need[3] else None, dz0.squeeze(-1) if need[4] else None, None, None, None)


class LinearChunkCPU(FoldsMembers, torch.autograd.Function):
    """:class:`LinearChunk` through the fused CPU kernel (harness/ops/linear/linear_cpu.cpp): same
    signature and results; A is recomputed in the backward pass instead of saved."""

    @staticmethod
    def forward(ctx, q, k, v, s0, z0, exclusive: bool, eps: float | None, length: int):
        m, n, c, _ = q.shape
        normalize = eps is not None
        empty = q.new_empty(0)
        o, starts, z_starts, den, s_final, z_final = fused_cpu.kernels().forward(
            q, k, v, empty if s0 is None else s0, empty if z0 is None else z0, normalize,
            eps if normalize else 0.0, exclusive)
        if normalize:
            check_finite_denominator(den.view(m, n * c)[:, :length], "linear_attention")  # no padding
        ctx.save_for_backward(q, k, v, o, starts, z_starts, den)
        ctx.exclusive, ctx.eps = exclusive, eps
        return o, s_final, z_final

    @staticmethod
    @once_differentiable
    def backward(ctx, do, ds_final, dz_final):
        q, k, v, o, starts, z_starts, den = ctx.saved_tensors
        normalize = ctx.eps is not None
        dq, dk, dv, ds0, dz0 = fused_cpu.kernels().backward(
            q, k, v, o, starts, z_starts, den, do, ds_final, dz_final, normalize,
            ctx.eps if normalize else 0.0, ctx.exclusive)
        need = ctx.needs_input_grad
        return dq, dk, dv, ds0 if need[3] else None, dz0 if need[4] else None, None, None, None


def linear_chunk(q, k, v, s0, z0, exclusive: bool, eps: float | None, length: int | None = None):
    """Apply :class:`LinearChunk` (see there) in one dtype (autocast's, if on), inputs made contiguous;
    float32/64 CPU inputs go to its fused CPU kernel (:class:`LinearChunkCPU`, harness.ops.fused_cpu).

    ``length``: the positions before any zero padding of the last chunk (default: all)."""
    dtype = compute_dtype(q, k, v)
    q, k, v = (x.to(dtype).contiguous() for x in (q, k, v))
    s0, z0 = (None if x is None else x.to(dtype) for x in (s0, z0))
    with autocast_off(q.device.type):
        length = q.shape[1] * q.shape[2] if length is None else length
        fn = LinearChunkCPU if fused_cpu.applies(q) else LinearChunk
        return fn.apply(q, k, v, s0, z0, exclusive, eps, length)
