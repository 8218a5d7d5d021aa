"""The chunk form of decayed linear attention as one autograd Function with a hand-written backward.

Per chunk of C positions, with b_i = x_1 + ... + x_i the log decay from the chunk start
(x = log a) and S_n the state entering the chunk:

    o_i = (q_i * e^{b_i}) S_n + sum_{j<=i} A_ij v_j
    S_{n+1} = e^{b_C} * S_n + sum_j (k_j * e^{b_C - b_j}) v_j^T

Every exponent is <= 0 for log decays <= 0, so nothing overflows however strong the decay
(the entries above the diagonal of a scalar decay mask are zeroed before use).

In-chunk weights A_ij = sum_d q_id k_jd e^{b_id - b_jd} (j <= i):
  - scalar decay: (q k^T) * exp(b_i - b_j), one (C, C) mask per chunk;
  - per-dimension gate: no mask exists. Splitting the chunk in halves, the pairs (i, j) with
    i in the right half R and j in the left half L factor exactly through the boundary r
    between them: A_RL = (q_R * e^{b_R - b_r}) (k_L * e^{b_r - b_L})^T, both factors <= 1.
    Halving again covers the pairs inside each half, down to single positions: log2(C)
    levels of batched matmuls plus the diagonal q_i . k_i, with C Dk exponentials per level
    and chunk instead of the C^2 Dk of a (C, C, Dk) decay tensor. C is a power of two.

Backward: dq, dk, dv follow the same chunkwise structure (a reverse scan carries the
gradient of the state). The log decays need no pass of their own: o depends on (q, k, B),
B the global cumulative log decay, only through q e^{B} and k e^{-B}, so
dB_t = q_t . dq_t - k_t . dk_t (per dimension for a gate), plus <dS_T, S_T> at the last
position when the final state has a gradient, and dx_t = sum_{s >= t} dB_s.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .. import fused_cpu
from ..common.chunking import chunk_blocks
from ..common.members import FoldsMembers
from ..common.precision import autocast_off, compute_dtype
from ..common.prefix import scan_add, scan_states


def _pair_block(a: torch.Tensor, s: int) -> torch.Tensor:
    """View of the (right half, left half) block of every 2s-block on a's diagonal: (M, C, C) -> (M, C/2s, s, s)."""
    m, c, _ = a.shape
    p = c // (2 * s)
    rows_r_cols_l = a.view(m, p, 2, s, p, 2, s)[:, :, 1, :, :, 0, :]  # (M, p, s, p, s)
    return torch.diagonal(rows_r_cols_l, dim1=1, dim2=3).permute(0, 3, 1, 2)


def _levels(c: int):
    s = c // 2
    while s >= 1:
        yield s
        s //= 2


def _exp_into(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out = exp(x), x in the log decays' precision, out in the compute dtype."""
    return torch.exp(x, out=out) if x.dtype == out.dtype else out.copy_(torch.exp(x))


def _level_factors(b: torch.Tensor, s: int, fq: torch.Tensor, fk: torch.Tensor) -> None:
    """fq = e^{b_R - b_r}, fk = e^{b_r - b_L} at level s, each (M, C/2s, s, Dk), all entries <= 1."""
    m, c, dk = b.shape
    b5 = b.view(m, c // (2 * s), 2, s, dk)
    ref = b5[:, :, 0, s - 1:s]  # b at the boundary r: the last position of the left half
    _exp_into(b5[:, :, 1] - ref, fq)
    _exp_into(ref - b5[:, :, 0], fk)


def level_factor_buffers(mn: int, c: int, dk: int, like: torch.Tensor) -> list[torch.Tensor]:
    """Empty (fq, fk) pairs for every level of chunks of length c, (M*N, C/2s, s, Dk) each."""
    return [like.new_empty(mn, c // (2 * s), s, dk) for s in _levels(c) for _ in (0, 1)]


def _halves(x: torch.Tensor, s: int):
    """(right halves, left halves) of every 2s-block: (M, C, D) -> two (M, C/2s, s, D) views."""
    m, c, d = x.shape
    x5 = x.view(m, c // (2 * s), 2, s, d)
    return x5[:, :, 1], x5[:, :, 0]


def _row_products(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x y^T for (..., s, D) and (..., s, D) -> (..., s, s); a multiply and a sum when s = 1."""
    if x.shape[-2] == 1:
        return (x * y).sum(dim=-1, keepdim=True)
    return torch.matmul(x, y.transpose(-1, -2))


def _mix_rows(w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """w y for (..., s, s) and (..., s, D) -> (..., s, D). Batched matmuls of 1 x 1 or 2 x 2
    factors are mostly call overhead on CPU: below s = 4 the sum over j is written out."""
    s = w.shape[-1]
    if s > 2:
        return torch.matmul(w.contiguous(), y)
    out = w[..., 0:1] * y[..., 0:1, :]
    for j in range(1, s):
        out.addcmul_(w[..., j:j + 1], y[..., j:j + 1, :])
    return out


def gated_weights(q: torch.Tensor, k: torch.Tensor, b: torch.Tensor, a: torch.Tensor, factors: list) -> None:
    """In-chunk weights for a per-dimension gate (see the module docstring), written into a.

    q, k: (M, C, Dk); b: (M, C, Dk) log decay from the chunk start; a: (M, C, C), filled with
    the weights (zero above the diagonal); factors: the buffers of :func:`level_factor_buffers`,
    filled with the per-level factors the backward pass reuses.
    """
    a.zero_()
    torch.diagonal(a, dim1=1, dim2=2).copy_((q * k).sum(dim=-1))
    for i, s in enumerate(_levels(q.shape[1])):
        fq, fk = factors[2 * i], factors[2 * i + 1]
        _level_factors(b, s, fq, fk)
        q_r, k_l = _halves(q, s)[0] * fq, _halves(k, s)[1] * fk
        _pair_block(a, s).copy_(_row_products(q_r, k_l))


def gated_weights_backward(da: torch.Tensor, q: torch.Tensor, k: torch.Tensor, factors: list,
                           dq: torch.Tensor, dk: torch.Tensor) -> None:
    """dq, dk (M, C, Dk) of sum(da * A) for the A of :func:`gated_weights`, written into dq and dk;
    da is zero above the diagonal."""
    diag = torch.diagonal(da, dim1=1, dim2=2).unsqueeze(-1).contiguous()  # (M, C, 1)
    torch.mul(diag, k, out=dq)
    torch.mul(diag, q, out=dk)
    for i, s in enumerate(_levels(q.shape[1])):
        fq, fk = factors[2 * i], factors[2 * i + 1]
        q_r, k_l = _halves(q, s)[0] * fq, _halves(k, s)[1] * fk
        dblock = _pair_block(da, s)  # (M, p, s, s)
        _halves(dq, s)[0].addcmul_(_mix_rows(dblock, k_l), fq)
        _halves(dk, s)[1].addcmul_(_mix_rows(dblock.transpose(-1, -2), q_r), fk)


def _reverse_cumsum_time(x: torch.Tensor) -> torch.Tensor:
    """sum over s >= t along the flattened (N, C) time axes of x (M, N, C, G)."""
    m, n, c, g = x.shape
    if g == 1:  # one row per (batch, head): the library kernel along the innermost axis
        flat = x.view(m, n * c)
        return torch.flip(torch.cumsum(torch.flip(flat, (1,)), dim=1), (1,)).view(m, n, c, 1)
    within = scan_add(x, 2, reverse=True)  # (M, N, C, G): suffix sums inside each chunk
    totals = within[:, :, 0]  # (M, N, G): each chunk's total
    later = scan_add(totals, 1, reverse=True) - totals  # sum of the chunks after n
    return within.add_(later.unsqueeze(2))


class DecayChunk(FoldsMembers, torch.autograd.Function):
    """(q, k, v, x, S0) -> (o, S) over chunked inputs.

    q, k: (M, N, C, Dk), v: (M, N, C, Dv), contiguous, one dtype; x: (M, N, C, G) log
    decays, G = 1 (scalar per head) or Dk (per key dimension; C a power of two); s0
    (M, Dk, Dv) or None. o (M, N, C, Dv), S (M, Dk, Dv) the final state. The states come
    first (the chunks' updates, then the scan); everything else is chunk-local and runs
    block by block (harness.ops.common.chunking.chunk_blocks).
    """

    @staticmethod
    def forward(ctx, q, k, v, x, s0):
        m, n, c, dk = q.shape
        dv = v.shape[-1]
        mn, per_dim = m * n, x.shape[-1] > 1
        q3, k3, v3 = q.view(mn, c, dk), k.view(mn, c, dk), v.view(mn, c, dv)
        b = scan_add(x, 2) if per_dim else torch.cumsum(x, dim=2)  # (M, N, C, G): log decay from the chunk start
        b_end = b[:, :, -1:]  # (M, N, 1, G)
        fq = torch.exp(b).to(q.dtype)  # queries read the entering state decayed to their position
        fk = torch.exp(b_end - b).to(q.dtype)  # keys enter the leaving state decayed to the chunk end
        decays = torch.exp(b_end).transpose(-1, -2)  # (M, N, G, 1): what a chunk does to the state it receives
        fq3, fk3, b3 = fq.view(mn, c, -1), fk.view(mn, c, -1), b.view(mn, c, -1)
        blocks = chunk_blocks(mn, q.device)

        updates = q.new_empty(mn, dk, dv)
        for bl in blocks:
            torch.bmm((k3[bl] * fk3[bl]).transpose(1, 2), v3[bl], out=updates[bl])
        starts, s_final = scan_states(updates.view(m, n, dk, dv), decays, s0)
        s3 = starts.view(mn, dk, dv)

        a, o = q.new_empty(mn, c, c), q.new_empty(mn, c, dv)
        extra = level_factor_buffers(mn, c, dk, q) if per_dim else [q.new_empty(mn, c, c)]  # factors or mask
        for bl in blocks:
            torch.bmm(q3[bl] * fq3[bl], s3[bl], out=o[bl])  # the entering state, read
            if per_dim:
                gated_weights(q3[bl], k3[bl], b3[bl], a[bl], [f[bl] for f in extra])
            else:
                bb = b3[bl]
                mask = _exp_into(bb - bb.transpose(1, 2), extra[0][bl]).tril_()  # e^{b_i - b_j}, j <= i
                torch.bmm(q3[bl], k3[bl].transpose(1, 2), out=a[bl]).mul_(mask)
            o[bl].baddbmm_(a[bl], v3[bl])
        ctx.save_for_backward(q, k, v, fq, fk, decays, a, starts, s_final, *extra)
        ctx.per_dim, ctx.x_dtype = per_dim, x.dtype
        return o.view(m, n, c, dv), s_final

    @staticmethod
    @once_differentiable
    def backward(ctx, do, ds_final):
        with autocast_off(do.device.type):
            return DecayChunk._backward(ctx, do, ds_final)

    @staticmethod
    def _backward(ctx, do, ds_final):
        q, k, v, fq, fk, decays, a, starts, s_final, *extra = ctx.saved_tensors
        m, n, c, dk = q.shape
        dv = v.shape[-1]
        mn = m * n
        q3, k3, v3 = q.view(mn, c, dk), k.view(mn, c, dk), v.view(mn, c, dv)
        fq3, fk3 = fq.view(mn, c, -1), fk.view(mn, c, -1)
        do3 = do.reshape(mn, c, dv)
        blocks = chunk_blocks(mn, q.device)

        # Gradients reaching each chunk's outgoing state: a reverse scan of (q e^b)^T do.
        h = q.new_empty(mn, dk, dv)
        for bl in blocks:
            torch.bmm((q3[bl] * fq3[bl]).transpose(1, 2), do3[bl], out=h[bl])
        g, ds0 = scan_states(h.view(m, n, dk, dv), decays, ds_final, reverse=True)
        g3, s3 = g.view(mn, dk, dv), starts.view(mn, dk, dv)

        xd = ctx.x_dtype  # log decay gradients in their own precision (float32 under bf16 autocast)
        want_dx = ctx.needs_input_grad[3]
        dq, dk_, dv_ = torch.empty_like(q3), torch.empty_like(k3), torch.empty_like(v3)
        db = q.new_empty(mn, c, dk if ctx.per_dim else 1, dtype=xd) if want_dx else None
        da = q.new_empty(blocks[0].stop - blocks[0].start, c, c)  # one block's dA, reused
        for bl in blocks:
            dab = torch.bmm(do3[bl], v3[bl].transpose(1, 2), out=da[: bl.stop - bl.start])
            if ctx.per_dim:
                gated_weights_backward(dab.tril_(), q3[bl], k3[bl], [f[bl] for f in extra], dq[bl], dk_[bl])
            else:
                dab.mul_(extra[0][bl])  # through the decay mask (zero above the diagonal)
                torch.bmm(dab, k3[bl], out=dq[bl])
                torch.bmm(dab.transpose(1, 2), q3[bl], out=dk_[bl])
            torch.bmm(a[bl].transpose(1, 2), do3[bl], out=dv_[bl])
            dq[bl].addcmul_(torch.bmm(do3[bl], s3[bl].transpose(1, 2)), fq3[bl])
            dk_[bl].addcmul_(torch.bmm(v3[bl], g3[bl].transpose(1, 2)), fk3[bl])
            dv_[bl].baddbmm_(k3[bl] * fk3[bl], g3[bl])
            if want_dx:  # dB_t = q_t . dq_t - k_t . dk_t (per key dimension for a gate)
                part = torch.addcmul(q3[bl].to(xd) * dq[bl].to(xd), k3[bl].to(xd), dk_[bl].to(xd), value=-1)
                db[bl] = part if ctx.per_dim else part.sum(dim=-1, keepdim=True)

        dx = None
        if want_dx:
            db = db.view(m, n, c, -1)
            if ds_final is not None:
                db[:, -1, -1] += final_state_log_decay_grad(ds_final, s_final, ctx.per_dim, xd)
            dx = _reverse_cumsum_time(db)
        return (dq.view(q.shape), dk_.view(k.shape), dv_.view(v.shape), dx,
                ds0 if ctx.needs_input_grad[4] else None)


def final_state_log_decay_grad(ds_final, s_final, per_dim: bool, dtype) -> torch.Tensor:
    """<dS_T, S_T>, the final state's share of the last position's log-decay gradient: (M, G)."""
    last = (ds_final.to(dtype) * s_final.to(dtype)).sum(dim=-1)  # (M, Dk): per key dimension
    return last if per_dim else last.sum(dim=-1, keepdim=True)


class DecayChunkCPU(FoldsMembers, torch.autograd.Function):
    """:class:`DecayChunk` through the fused CPU kernels (harness/ops/decay/decay_cpu.cpp, gated_cpu.cpp): same
    signature and results, for scalar gates and per-dimension gates alike; the kernels recompute
    the in-chunk weights in the backward pass instead of saving them, except learned scalar
    gates' decay masks (the lower triangle of a chunk's (c x c) mask, half what the batched form
    holds), whose exponentials would otherwise be paid twice.

    A per-dimension gate enters the kernel as a = e^x (one vectorised exp here), every decay
    between two positions being a product of a's there (each factor <= 1: nothing overflows);
    its backward kernel returns the log decays' gradient summed over time already."""

    @staticmethod
    def forward(ctx, q, k, v, x, s0):
        m, n, c, _ = q.shape
        s0_ = q.new_empty(0) if s0 is None else s0
        ctx.per_dim = x.shape[-1] > 1
        if ctx.per_dim:
            a = torch.exp(x)
            o, starts, s_final = fused_cpu.kernels().gated_forward(q, k, v, a, s0_)
            ctx.save_for_backward(q, k, v, a, starts, s_final)
        else:
            # learned log decays (their gradient wanted: Mamba-2's gates) repeat nowhere, so the
            # forward keeps its decay masks for the backward pass; fixed ones (RetNet's) the
            # kernel reuses from head to head, and keeps none
            o, starts, s_final, masks = fused_cpu.kernels().decay_forward(q, k, v, x.view(m, n, c), s0_,
                                                                          ctx.needs_input_grad[3])
            ctx.save_for_backward(q, k, v, x, starts, s_final, masks)
        return o, s_final

    @staticmethod
    @once_differentiable
    def backward(ctx, do, ds_final):
        q, k, v, x_or_a, starts, s_final, *masks = ctx.saved_tensors
        m, n, c, _ = q.shape
        want_dx = ctx.needs_input_grad[3]
        if ctx.per_dim:
            dq, dk, dv, dx, ds0 = fused_cpu.kernels().gated_backward(q, k, v, x_or_a, starts, s_final, do, ds_final)
            return dq, dk, dv, dx if want_dx else None, ds0 if ctx.needs_input_grad[4] else None
        dq, dk, dv, db, ds0 = fused_cpu.kernels().decay_backward(q, k, v, x_or_a.view(m, n, c), starts, do, ds_final,
                                                                 *masks)
        dx = None
        if want_dx:
            db = db.view(m, n, c, 1)
            db[:, -1, -1] += final_state_log_decay_grad(ds_final, s_final, False, db.dtype)
            dx = _reverse_cumsum_time(db)
        return dq, dk, dv, dx, ds0 if ctx.needs_input_grad[4] else None


def decay_chunk(q, k, v, x, s0):
    """Apply :class:`DecayChunk` (see there) in one dtype (autocast's, if on), inputs made contiguous.
    The log decays x keep their own precision, at least float32. float32/64 CPU inputs (q and x
    in one dtype) go to the fused CPU kernels (:class:`DecayChunkCPU`, harness.ops.fused_cpu).
    """
    dtype = compute_dtype(q, k, v)
    q, k, v = (t.to(dtype).contiguous() for t in (q, k, v))
    x = x.to(torch.promote_types(x.dtype, torch.float32)).contiguous()
    s0 = None if s0 is None else s0.to(dtype)
    with autocast_off(q.device.type):
        if fused_cpu.applies(q, x):
            return DecayChunkCPU.apply(q, k, v, x, s0)
        return DecayChunk.apply(q, k, v, x, s0)
