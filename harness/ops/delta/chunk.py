"""The delta rule inside one block of positions (a chunk, or the whole sequence), and the chunk form.

For a block of C positions entering with state S_0 (Dk, Dv), b_i = x_1 + ... + x_i the log
decay from the block start (x = log a; b = 0 without decay). Unrolling
S_i = a_i S_{i-1} + k_i u_i^T, where u_i = beta_i (v_i - (a_i S_{i-1})^T k_i) is the
correction actually written:

    S_i = e^{b_i} S_0 + sum_{j<=i} e^{b_i - b_j} k_j u_j^T.                         (1)

Putting (1) at i-1 into u_i gives one lower-triangular system for all corrections at once
(the UT transform of DeltaNet, Yang et al. 2024):

    u_i + beta_i sum_{j<i} e^{b_i - b_j} (k_i.k_j) u_j = beta_i (v_i - e^{b_i} S_0^T k_i),

    (I + L) U = diag(beta) (V - (e^b * K) S_0),   L_ij = beta_i e^{b_i - b_j} k_i.k_j (j < i).

With W = (I + L)^{-1} diag(beta) (e^b * K) and U' = (I + L)^{-1} diag(beta) V (the WY
representation: W and U' depend on the block alone, S_0 enters linearly):

    U = U' - W S_0
    o_i = S_i^T q_i = e^{b_i} S_0^T q_i + sum_{j<=i} e^{b_i - b_j} (q_i.k_j) u_j
    S_C = e^{b_C} S_0 + sum_j e^{b_C - b_j} k_j u_j^T

Every exponent is <= 0 for log decays <= 0 (segment sums, never ratios of cumulative
products), and I + L is unit lower triangular: no loop over positions is needed. A chunk's
(C, C) inverse is built by exact block inversion, level by level ([[A, 0], [B, D]]^{-1} =
[[A^{-1}, 0], [-D^{-1} B A^{-1}, D^{-1}]], log2 C levels of batched matmuls over all chunks);
torch.linalg.solve_triangular does the same arithmetic, but on CPU it makes one threaded
LAPACK call per small matrix: with two threads on cores shared with other processes it ran
10-100x slower than these matmuls in the same process (with one thread the two were alike).
The whole-sequence block (the parallel form, delta_weights) is one large system per head,
where the library solve is the efficient choice.

The chunk form computes W and U' for every chunk at once, then walks the chunks carrying S
(one pair of batched matmuls per chunk: U_n = U'_n - W_n S_n, S_{n+1} = ...), then the
outputs of every chunk at once. Its backward pass is autograd's. On CPU (float32/64) the fused
kernel runs the same arithmetic one sequence per thread, chunk by chunk, with a hand-written
backward pass (:class:`DeltaChunkCPU`); this batched form is its oracle.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from .. import fused_cpu
from ..common.members import FoldsMembers
from ..common.segments import segsum, suffix_sum


class Block(NamedTuple):
    """The block-local factors of (1), for blocks laid out (..., C, D) with beta, x (..., C)."""

    decay: torch.Tensor             # (..., C, C) e^{b_i - b_j} for j <= i, 0 above (or (C, C) ones without decay)
    q_in: torch.Tensor              # (..., C, Dk) e^{b_i} q_i: queries reading the entering state
    k_in: torch.Tensor              # (..., C, Dk) e^{b_i} k_i: keys correcting against the entering state
    k_out: torch.Tensor             # (..., C, Dk) e^{b_C - b_j} k_j: keys as they leave the block
    end_decay: Optional[torch.Tensor]  # (...,) e^{b_C}: what the block does to the state it receives; None: 1
    lower: torch.Tensor             # (..., C, C) L, strictly lower triangular


def block_factors(q: torch.Tensor, k: torch.Tensor, beta: torch.Tensor, x: Optional[torch.Tensor]) -> Block:
    """The factors of the module docstring for blocks q, k (..., C, Dk), beta (..., C) and log
    decays x (..., C) or None."""
    c = q.shape[-2]
    if x is None:
        decay = torch.ones(c, c, dtype=q.dtype, device=q.device).tril()  # (C, C)
        q_in, k_in, k_out, end_decay = q, k, k, None
    else:
        decay = torch.exp(segsum(x))  # (..., C, C): e^{b_i - b_j}, j <= i
        into = torch.exp(torch.cumsum(x, dim=-1)).unsqueeze(-1)  # (..., C, 1): e^{b_i}
        q_in, k_in = q * into, k * into
        k_out = k * torch.exp(suffix_sum(x, dim=-1)).unsqueeze(-1)  # e^{b_C - b_j}, each segment summed alone
        end_decay = into[..., -1, 0]
    kk = torch.matmul(k, k.transpose(-1, -2))  # (..., C, C)
    lower = (kk * decay).tril(-1) * beta.unsqueeze(-1)  # row i scaled by beta_i
    return Block(decay, q_in, k_in, k_out, end_decay, lower)


def unit_lower_inverse(lower: torch.Tensor) -> torch.Tensor:
    """(I + L)^{-1} for L (..., C, C) strictly lower triangular, by exact block inversion.

    L is zero-padded to P = 2^ceil(log2 C) (the padded inverse is block-diagonal, its top-left
    (C, C) block the inverse asked for). Bottom-up: the inverses of the diagonal blocks of size
    s give those of size 2s, [[A^{-1}, 0], [-D^{-1} B A^{-1}, D^{-1}]], two batched matmuls a
    level; assembled with cat (no in-place writes), so autograd differentiates it.
    """
    c = lower.shape[-1]
    p = 1 << (c - 1).bit_length()
    batch = lower.shape[:-2]
    m = lower.reshape(-1, c, c)
    if p != c:
        m = F.pad(m, (0, p - c, 0, p - c))
    inv = torch.ones(m.shape[0], p, 1, 1, dtype=m.dtype, device=m.device)  # the (1, 1) diagonal blocks
    s = 1
    while s < p:
        n = p // (2 * s)
        diag = torch.diagonal(m.view(-1, n, 2 * s, n, 2 * s), dim1=1, dim2=3).permute(0, 3, 1, 2)  # (M, n, 2s, 2s)
        a_inv, d_inv = inv[:, 0::2], inv[:, 1::2]  # (M, n, s, s) each
        x = -torch.matmul(d_inv, torch.matmul(diag[:, :, s:, :s], a_inv))
        inv = torch.cat([torch.cat([a_inv, torch.zeros_like(a_inv)], dim=-1), torch.cat([x, d_inv], dim=-1)], dim=-2)
        s *= 2
    return inv[:, 0, :c, :c].reshape(*batch, c, c)


def solve_unit_lower(lower: torch.Tensor, rhs: torch.Tensor, *, left: bool = True) -> torch.Tensor:
    """(I + L)^{-1} rhs (left) or rhs (I + L)^{-1} (not left), L strictly lower triangular.

    unitriangular=True makes the solver take the diagonal as ones without reading it, so L
    is passed as it is (its zero diagonal never enters).
    """
    return torch.linalg.solve_triangular(lower, rhs, upper=False, left=left, unitriangular=True)


def block_corrections(blk: Block, v: torch.Tensor, beta: torch.Tensor, *,
                      many: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(W, U') of the module docstring: (..., C, Dk) and (..., C, Dv), one triangular solve:
    the block inverse for many small systems (chunks), the library's for one per head."""
    dk = blk.k_in.shape[-1]
    rhs = torch.cat([blk.k_in, v], dim=-1) * beta.unsqueeze(-1)  # (..., C, Dk + Dv)
    if many:
        wu = torch.matmul(unit_lower_inverse(blk.lower), rhs)
    else:
        wu = solve_unit_lower(blk.lower, rhs)
    w, u = wu.split([dk, v.shape[-1]], dim=-1)
    return w, u


def block_output(blk: Block, q: torch.Tensor, k: torch.Tensor, u: torch.Tensor,
                 s_in: Optional[torch.Tensor]) -> torch.Tensor:
    """o (..., C, Dv) of blocks with corrections u (..., C, Dv) and entering states s_in (..., Dk, Dv) or None."""
    o = torch.matmul(torch.matmul(q, k.transpose(-1, -2)) * blk.decay, u)
    return o if s_in is None else o + torch.matmul(blk.q_in, s_in)


def block_state(k_out: torch.Tensor, end_decay: Optional[torch.Tensor], u: torch.Tensor,
                s_in: Optional[torch.Tensor]) -> torch.Tensor:
    """The state leaving a block, e^{b_C} S_in + sum_j e^{b_C - b_j} k_j u_j^T: (..., Dk, Dv)."""
    s = torch.matmul(k_out.transpose(-1, -2), u)
    if s_in is None:
        return s
    return s + (s_in if end_decay is None else end_decay[..., None, None] * s_in)


class DeltaChunkCPU(FoldsMembers, torch.autograd.Function):
    """The chunk form through the fused CPU kernel (harness/ops/delta/delta_cpu.cpp), with a
    hand-written backward pass: each thread walks whole sequences chunk by chunk (per chunk the
    module docstring's products, U by one triangular solve), recomputing a chunk's factors in
    the backward pass instead of saving them, except learned decays' masks (a chunk's lower
    triangle), whose exponentials would otherwise be paid twice. q, k (M, N, C, Dk),
    v (M, N, C, Dv), beta and x (M, N, C) (x None: no decay), s0 (M, Dk, Dv) or None,
    contiguous, one dtype; the log decays' gradient comes back summed over time (see the
    kernel's comment for its identity)."""

    @staticmethod
    def forward(ctx, q, k, v, beta, x, s0):
        empty = q.new_empty(0)
        x_ = empty if x is None else x
        # learned log decays (their gradient wanted) keep their masks for the backward pass
        o, starts, s_final, masks = fused_cpu.kernels().delta_forward(q, k, v, beta, x_, empty if s0 is None else s0,
                                                                      ctx.needs_input_grad[4])
        ctx.save_for_backward(q, k, v, beta, x_, starts, s_final, masks)
        ctx.gated = x is not None
        return o, s_final

    @staticmethod
    @once_differentiable
    def backward(ctx, do, ds_final):
        q, k, v, beta, x, starts, s_final, masks = ctx.saved_tensors
        dq, dk, dv, dbeta, dx, ds0 = fused_cpu.kernels().delta_backward(q, k, v, beta, x, starts, s_final, do, ds_final,
                                                                        masks)
        need = ctx.needs_input_grad
        return dq, dk, dv, dbeta, dx if ctx.gated and need[4] else None, ds0 if need[5] else None


def delta_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, x: Optional[torch.Tensor],
                s0: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunk form over chunked inputs: q, k (B, H, N, C, Dk), v (B, H, N, C, Dv), beta and x
    (B, H, N, C) (x None: no decay), s0 (B, H, Dk, Dv) or None. Returns o (B, H, N, C, Dv) and
    the final state (B, H, Dk, Dv). float32/64 CPU inputs go to the fused kernel
    (:class:`DeltaChunkCPU`); the batched form below is its oracle."""
    if fused_cpu.applies(q, k, v, beta, *(t for t in (x, s0) if t is not None)):
        b, h, n, c, dk = q.shape
        flat = lambda t: t.reshape(b * h, *t.shape[2:]).contiguous()  # noqa: E731  (B*H, ...)
        o, s = DeltaChunkCPU.apply(flat(q), flat(k), flat(v), flat(beta), None if x is None else flat(x),
                                   None if s0 is None else flat(s0))
        return o.view(b, h, n, c, -1), s.view(b, h, dk, -1)
    blk = block_factors(q, k, beta, x)
    w, u_own = block_corrections(blk, v, beta, many=True)  # (B, H, N, C, Dk), (B, H, N, C, Dv)
    state, starts, us = s0, [], []
    for n in range(q.shape[2]):  # one step per chunk: the state is the only thing carried
        u = u_own[:, :, n] if state is None else u_own[:, :, n] - torch.matmul(w[:, :, n], state)  # (B, H, C, Dv)
        end = None if blk.end_decay is None else blk.end_decay[:, :, n]
        starts.append(state)
        state = block_state(blk.k_out[:, :, n], end, u, state)  # (B, H, Dk, Dv)
        us.append(u)
    if starts[0] is None:
        starts[0] = torch.zeros_like(state)
    u, starts = torch.stack(us, dim=2), torch.stack(starts, dim=2)  # (B, H, N, C, Dv), (B, H, N, Dk, Dv)
    return block_output(blk, q, k, u, starts), state
