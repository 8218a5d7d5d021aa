"""Kernel (linear) attention: S_i = S_{i-1} + k_i v_i^T, z_i = z_{i-1} + k_i, o_i = q_i S_i / q_i.z_i.

q and k arrive already feature-mapped (phi(q), phi(k); non-negative for normalised attention).
Each form computes the numerator q S and the denominator q.z of every position and hands
them to one read-out (:func:`_read_out`; the causal chunk form applies the same floor and
check inside its autograd Function, harness.ops.linear.chunk); the recurrent form and the
step carry S and z together as S' = [S | z] (Dk, Dv + 1), the state of a value with a
constant 1 appended.

Denominators: den = q_i.z_i (plus q_i.z0 from an initial state). |den| is floored at ``eps``
keeping its sign (an exact zero becomes +eps), identically in every form, the step function
and the naive reference; a position that sees no key at all (exclusive, first token, no
initial state) therefore reads 0. A non-finite den raises FloatingPointError (the feature
map overflowed) unless the check is off (:func:`harness.ops.set_finite_checks`).
"""

from __future__ import annotations

import torch

from ..common.chunking import from_chunks, to_chunks
from ..common.guards import (
    check_chunk_size,
    check_eps,
    check_finite_denominator,
    check_form,
    check_qkv,
    check_qkv_step,
    floor_denominator,
    query_positions,
)
from ..common.scan import scan
from .chunk import linear_chunk


def _augment(v: torch.Tensor) -> torch.Tensor:
    """v (..., Dv) -> v' = [v, 1] (..., Dv + 1): its state is [S | z]."""
    return torch.cat([v, v.new_ones(*v.shape[:-1], 1)], dim=-1)


def _check_state(state, q: torch.Tensor, dv: int):
    """(S (B, H, Dk, Dv), z (B, H, Dk) or None) -> (S, z) with z filled in; None stays None."""
    if state is None:
        return None
    s, z = state
    b, h, dk = q.shape[0], q.shape[1], q.shape[-1]
    if s.shape != (b, h, dk, dv):
        raise ValueError(f"initial state S must be (B, H, Dk, Dv) = {(b, h, dk, dv)}, got {tuple(s.shape)}")
    if z is None:
        z = s.new_zeros(b, h, dk)
    elif z.shape != (b, h, dk):
        raise ValueError(f"initial state z must be (B, H, Dk) = {(b, h, dk)}, got {tuple(z.shape)}")
    return s, z


def _read_out(num: torch.Tensor, den: torch.Tensor, normalize: bool, eps: float, where: str) -> torch.Tensor:
    """o = num / floor(den) (num (..., Dv), den (...)), or num itself when not normalising."""
    if not normalize:
        return num
    check_finite_denominator(den, where)
    return num * floor_denominator(den, eps).reciprocal().unsqueeze(-1)  # cheaper backward than a division


def _scores(q, k, causal: bool, exclusive: bool) -> torch.Tensor:
    """Masked q k^T (..., T, T): j <= i (causal), j < i (exclusive) or all j."""
    w = torch.matmul(q, k.transpose(-1, -2))
    if causal:
        w = w.tril_(diagonal=-1 if exclusive else 0)  # in place: matmul keeps q and k, not w
    return w


def _global(q, k, v, state):
    """causal=False, any form but parallel: one total state read by every position."""
    s = torch.matmul(k.transpose(-1, -2), v)  # (B, H, Dk, Dv)
    z = k.sum(dim=2)  # (B, H, Dk)
    if state is not None:
        s, z = s + state[0], z + state[1]
    return torch.matmul(q, s), torch.matmul(q, z.unsqueeze(-1)).squeeze(-1), s, z


# ---- the three forms: each returns num (B, H, T, Dv), den (B, H, T) and the final (S, z) ----

def _parallel(q, k, v, state, causal, exclusive):
    w = _scores(q, k, causal, exclusive)  # (B, H, T, T)
    num, den = torch.matmul(w, v), w.sum(dim=-1)  # rescanning the keys
    s, z = torch.matmul(k.transpose(-1, -2), v), k.sum(dim=2)
    if state is not None:
        num = num + torch.matmul(q, state[0])
        den = den + torch.matmul(q, state[1].unsqueeze(-1)).squeeze(-1)
        s, z = s + state[0], z + state[1]
    return num, den, s, z


def _step_core(state, x, exclusive):
    (sa,), (q, k, va) = state, x  # sa = [S | z] (B, H, Dk, Dv + 1); q, k (B, H, Dk); va (B, H, Dv + 1)
    update = k.unsqueeze(-1) * va.unsqueeze(-2)  # (B, H, Dk, Dv + 1)
    if exclusive:
        num = torch.matmul(q.unsqueeze(-2), sa).squeeze(-2)
        sa = sa + update
    else:
        sa = sa + update
        num = torch.matmul(q.unsqueeze(-2), sa).squeeze(-2)
    return (sa,), (num,)


def _accumulate_core(state, x):
    (sa,), (k, va) = state, x
    return (sa + k.unsqueeze(-1) * va.unsqueeze(-2),), ()


def _recurrent(q, k, v, state, causal, exclusive):
    b, h, _, dk = q.shape
    va = _augment(v)
    if state is None:
        sa = q.new_zeros(b, h, dk, va.shape[-1])
    else:
        sa = torch.cat([state[0], state[1].unsqueeze(-1)], dim=-1)
    if causal:
        (sa,), (num,) = scan(lambda st, x: _step_core(st, x, exclusive), (sa,), (q, k, va))
    else:  # accumulate the whole sequence, then every position reads the total
        (sa,), _ = scan(_accumulate_core, (sa,), (k, va))
        num = torch.matmul(q, sa)
    return num[..., :-1], num[..., -1], sa[..., :-1], sa[..., -1]


def _chunk(q, k, v, state, exclusive, chunk_size, eps):
    """The causal chunk form; unlike the others it returns o itself: the read-out (the same floor
    and check) runs inside harness.ops.linear.chunk, chunk by chunk."""
    b, h, t, dk = q.shape
    dv = v.shape[-1]
    c = min(chunk_size, t)
    qc, kc, vc = (to_chunks(x, c).flatten(0, 1) for x in (q, k, v))  # (B*H, N, C, D)
    s0 = z0 = None
    if state is not None:
        s0, z0 = state[0].reshape(b * h, dk, dv), state[1].reshape(b * h, dk)
    o, s, z = linear_chunk(qc, kc, vc, s0, z0, exclusive, eps, length=t)
    return from_chunks(o.view(b, h, o.shape[1], c, dv), t), s.view(b, h, dk, dv), z.view(b, h, dk)


def linear_attention(q, k, v, *, form="chunk", causal=True, exclusive=False, normalize=True, eps=1e-6,
                     chunk_size=64, initial_state=None, return_state=False):
    """Linear attention over feature-mapped q, k (B, H, T, Dk) and v (B, H, T, Dv).

    form: "parallel" (masked quadratic, O(T^2)), "recurrent" (a loop over time carrying the
    state) or "chunk" (exact inside chunks of ``chunk_size``, the state across chunks; any T).
    causal=False is the global (encoder) form: every position reads the whole sequence.
    exclusive=True reads the state before adding the current token (needs causal=True).
    normalize=False returns the raw numerator q S. initial_state: (S (B, H, Dk, Dv),
    z (B, H, Dk)), a state carried over from earlier tokens. Returns o (B, H, T, Dv), or
    (o, (S, z)) with the final state when return_state=True.

    Normalised: o_i = q_i S_i / floor(q_i.z_i), where |den| is floored at ``eps`` with its
    sign kept (0 -> +eps), the same in every form; a non-finite denominator raises
    FloatingPointError (switch off with harness.ops.set_finite_checks(False)).
    """
    check_qkv(q, k, v, "linear_attention")
    check_form(form)
    check_chunk_size(chunk_size)
    if normalize:
        check_eps(eps)
    if exclusive and not causal:
        raise ValueError("exclusive=True requires causal=True (a global form has no 'before')")
    state = _check_state(initial_state, q, v.shape[-1])
    if form == "chunk" and causal:
        o, s, z = _chunk(q, k, v, state, exclusive, chunk_size, eps if normalize else None)
        return (o, (s, z)) if return_state else o
    if form == "parallel":
        num, den, s, z = _parallel(q, k, v, state, causal, exclusive)
    elif form == "recurrent":
        num, den, s, z = _recurrent(q, k, v, state, causal, exclusive)
    else:  # chunk, causal=False: one global state
        num, den, s, z = _global(q, k, v, state)
    o = _read_out(num, den, normalize, eps, "linear_attention")
    return (o, (s, z)) if return_state else o


def linear_attention_step(q, k, v, state=None, *, exclusive=False, normalize=True, eps=1e-6):
    """Decode one token in O(1) time and memory: q, k (B, H, Dk), v (B, H, Dv).

    state: (S (B, H, Dk, Dv), z (B, H, Dk)) or None (empty). Returns (o (B, H, Dv), (S, z)).
    Same update, read-out and denominator floor as the recurrent form.
    """
    check_qkv_step(q, k, v, "linear_attention_step")
    if normalize:
        check_eps(eps)
    va = _augment(v)
    state = _check_state(state, q, v.shape[-1])
    if state is None:
        sa = q.new_zeros(*q.shape, va.shape[-1])
    else:
        sa = torch.cat([state[0], state[1].unsqueeze(-1)], dim=-1)
    (sa,), (num,) = _step_core((sa,), (q, k, va), exclusive)
    o = _read_out(num[..., :-1], num[..., -1], normalize, eps, "linear_attention_step")
    return o, (sa[..., :-1], sa[..., -1])


def linear_weights(q, k, *, causal=True, exclusive=False, normalize=True, eps=1e-6, rows=None):
    """Effective attention weights a_ij (B, H, T, T) of linear attention (no initial state).

    a_ij = q_i.k_j / floor(sum_j' q_i.k_j') over the keys row i sees, so that o = a v; with
    normalize=False the raw q_i.k_j. rows: (R,) query positions; then only those rows are
    built, (B, H, R, T) in O(R T) memory.
    """
    if normalize:
        check_eps(eps)
    if exclusive and not causal:
        raise ValueError("exclusive=True requires causal=True")
    positions = query_positions(q, rows)  # (R,)
    if rows is not None:
        q = q[:, :, positions]  # (B, H, R, Dk)
    w = torch.matmul(q, k.transpose(-1, -2))  # (B, H, R, T)
    if causal:
        j = torch.arange(k.shape[2], device=q.device)
        seen = j < positions.unsqueeze(-1) if exclusive else j <= positions.unsqueeze(-1)  # (R, T)
        w = w.masked_fill(~seen, 0.0)
    if not normalize:
        return w
    den = w.sum(dim=-1, keepdim=True)
    check_finite_denominator(den, "linear_weights")
    return w / floor_denominator(den, eps)
