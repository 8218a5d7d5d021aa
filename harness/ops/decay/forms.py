"""Decayed / gated linear attention: S_t = a_t * S_{t-1} + k_t v_t^T, o_t = q_t S_t.

a_t = exp(log_decay_t). log_decay is (B, H, T): one decay per head and step (RetNet when
constant, Mamba-2/SSD when data-dependent), or (B, H, T, Dk): one gate per key dimension
(GLA), which scales the rows of S. No denominator and no scaling inside: callers scale q.

Every form writes the decay between two positions as exp of the sum of the log decays over
the segment between them (or as the product of that segment's a_s), never as a ratio of
cumulative products, so nothing overflows when the decay is strong: every exponent is <= 0
and every factor <= 1 for log_decay <= 0 (the intended range; it must be finite).

The chunk form (harness.ops.decay.chunk, one autograd Function with a hand-written
backward) splits each chunk's decay at the chunk start (queries read the state entering the
chunk) and at the chunk end (keys enter the state leaving it). Inside a chunk a scalar decay
is a (C, C) mask on q k^T; a per-dimension gate has no such mask and is factored exactly
through the midpoints of the chunk's halves, quarters, ... (log2 C levels of batched
matmuls, every factor <= 1), so its chunks are powers of two.

The per-dimension weights of the parallel form do need the (T, T, Dk) decay tensor; it is
built GATED_GROUP_ELEMENTS elements (a group of key dimensions) at a time and, when
gradients are needed, rebuilt in the backward pass, so the form holds O(T^2) memory, not
O(T^2 Dk).
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from ..common.chunking import from_chunks, to_chunks
from ..common.guards import check_chunk_size, check_form, check_qkv, check_qkv_step, query_positions
from ..common.scan import scan
from ..common.segments import segsum, segsum_rows, suffix_sum
from .chunk import decay_chunk

GATED_GROUP_ELEMENTS = 1 << 22  # elements of the per-dimension (T, T, Dk) decay tensor built at once


def _check_log_decay(q, log_decay, where):
    b, h, t, dk = q.shape
    if log_decay.shape not in ((b, h, t), (b, h, t, dk)):
        raise ValueError(
            f"{where}: log_decay must be (B, H, T) = {(b, h, t)} (one decay per head) or "
            f"(B, H, T, Dk) = {(b, h, t, dk)} (one gate per key dimension), got {tuple(log_decay.shape)}"
        )


def _check_state(q, v, state):
    b, h, _, dk = q.shape
    if state is not None and state.shape != (b, h, dk, v.shape[-1]):
        raise ValueError(f"initial state must be (B, H, Dk, Dv) = {(b, h, dk, v.shape[-1])}, got {tuple(state.shape)}")


def _gate(log_decay: torch.Tensor) -> torch.Tensor:
    """(B, H, T) or (B, H, T, Dk) -> (B, H, T, G), G = 1 or Dk: the factor on the rows of S."""
    return log_decay.unsqueeze(-1) if log_decay.dim() == 3 else log_decay


# ---- effective weights and the parallel form ------------------------------------------------

def decay_weights(q, k, log_decay, rows=None):
    """Effective weights a_ij = q_i . (prod_{j<s<=i} a_s) k_j for j <= i, 0 above (B, H, T, T).

    o = a v + (contribution of an initial state). rows: (R,) query positions; then only those
    rows are built, (B, H, R, T) in O(R T) memory (O(R T Dk) time for a per-dimension gate).
    A per-dimension gate costs O(T^2 Dk) time for all rows (the decay differs per key
    dimension; its memory stays O(T^2)), so keep T modest there.
    """
    _check_log_decay(q, log_decay, "decay_weights")
    positions = query_positions(q, rows)  # (R,)
    every = rows is None
    if log_decay.dim() == 3:
        decay = segsum(log_decay) if every else segsum_rows(log_decay, positions)  # (B, H, R, T)
        qr = q if every else q[:, :, positions]
        return torch.matmul(qr, k.transpose(-1, -2)) * torch.exp(decay)
    b, h, t, dk = q.shape
    r = positions.numel()
    size = max(1, min(dk, GATED_GROUP_ELEMENTS // max(1, b * h * r * t)))  # key dimensions per group
    grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, log_decay))
    w = None
    for d in range(0, dk, size):
        part = (q[..., d:d + size], k[..., d:d + size], log_decay[..., d:d + size], positions, every)
        part = checkpoint(_dims_weights, *part, use_reentrant=False) if grad else _dims_weights(*part)
        w = part if w is None else w + part
    return w


def _dims_weights(q, k, log_decay, positions, every):
    """sum_d q_id k_jd exp(sum_{j<s<=i} x_sd) over the key dimensions given (B, H, T, g) -> (B, H, R, T)."""
    x = log_decay.transpose(-1, -2)  # (B, H, g, T)
    decay = torch.exp(segsum(x) if every else segsum_rows(x, positions))  # (B, H, g, R, T)
    qr = q if every else q[:, :, positions]
    qk = qr.transpose(-1, -2).unsqueeze(-1) * k.transpose(-1, -2).unsqueeze(-2)  # (B, H, g, R, T): q_id k_jd
    return (qk * decay).sum(dim=2)


def _parallel(q, k, v, log_decay, s0):
    x = _gate(log_decay)  # (B, H, T, G)
    o = torch.matmul(decay_weights(q, k, log_decay), v)
    k_end = k * torch.exp(suffix_sum(x, dim=2))  # each key decayed to the last position
    s = torch.matmul(k_end.transpose(-1, -2), v)  # (B, H, Dk, Dv)
    if s0 is not None:
        into = torch.cumsum(x, dim=2)  # log decay from before the first token to i
        o = o + torch.matmul(q * torch.exp(into), s0)
        s = s + torch.exp(into[:, :, -1]).unsqueeze(-1) * s0
    return o, s


# ---- the recurrent form and the step ------------------------------------------------------

def _step_core(state, x):
    (s,), (q, k, v, g) = state, x  # s (B, H, Dk, Dv); q, k (B, H, Dk); v (B, H, Dv); g (B, H, G)
    s = torch.exp(g).unsqueeze(-1) * s + k.unsqueeze(-1) * v.unsqueeze(-2)
    return (s,), (torch.matmul(q.unsqueeze(-2), s).squeeze(-2),)


def _recurrent(q, k, v, log_decay, s0):
    b, h, _, dk = q.shape
    s = s0 if s0 is not None else q.new_zeros(b, h, dk, v.shape[-1])
    (s,), (o,) = scan(_step_core, (s,), (q, k, v, _gate(log_decay)))
    return o, s


def decay_attention_step(q, k, v, log_decay, state=None):
    """Decode one token in O(1): q, k (B, H, Dk), v (B, H, Dv), log_decay (B, H) or (B, H, Dk).

    state: S (B, H, Dk, Dv) or None (empty). Returns (o (B, H, Dv), S).
    """
    check_qkv_step(q, k, v, "decay_attention_step")
    b, h, dk = q.shape
    if log_decay.shape not in ((b, h), (b, h, dk)):
        raise ValueError(f"decay_attention_step: log_decay must be (B, H) or (B, H, Dk), got {tuple(log_decay.shape)}")
    if state is None:
        state = q.new_zeros(b, h, dk, v.shape[-1])
    g = log_decay.unsqueeze(-1) if log_decay.dim() == 2 else log_decay
    (s,), (o,) = _step_core((state,), (q, k, v, g))
    return o, s


# ---- the chunk form -------------------------------------------------------------------------

def _chunk_length(chunk_size: int, t: int, per_dim: bool) -> int:
    """Chunk length: chunk_size (at most T); for a per-dimension gate the largest power of two
    not above it, as its in-chunk weights halve the chunk down to single positions."""
    c = min(chunk_size, t)
    return 1 << (c.bit_length() - 1) if per_dim else c


def _chunk(q, k, v, log_decay, s0, chunk_size):
    bsz, h, t, dk = q.shape
    dv = v.shape[-1]
    c = _chunk_length(chunk_size, t, log_decay.dim() == 4)
    qc, kc, vc, xc = (to_chunks(x, c).flatten(0, 1) for x in (q, k, v, _gate(log_decay)))  # (B*H, N, C, D); xc (.., G)
    s0 = None if s0 is None else s0.reshape(bsz * h, dk, dv)
    o, s = decay_chunk(qc, kc, vc, xc, s0)
    return from_chunks(o.view(bsz, h, o.shape[1], c, dv), t), s.view(bsz, h, dk, dv)


def decay_attention(q, k, v, log_decay, *, form="chunk", chunk_size=64, initial_state=None, return_state=False):
    """Decayed linear attention over q, k (B, H, T, Dk), v (B, H, T, Dv).

    log_decay: (B, H, T) or (B, H, T, Dk), finite and normally <= 0 (a_t in (0, 1]).
    form: "parallel" (masked quadratic; O(T^2 Dk) time for per-dimension gates), "recurrent" (a
    loop over time carrying S) or "chunk" (exact inside chunks of ``chunk_size``, S across
    chunks; any T; per-dimension gates use the largest power of two <= chunk_size). initial_state:
    S (B, H, Dk, Dv). Returns o (B, H, T, Dv), or (o, S) with the final state.
    """
    check_qkv(q, k, v, "decay_attention")
    check_form(form)
    check_chunk_size(chunk_size)
    _check_log_decay(q, log_decay, "decay_attention")
    _check_state(q, v, initial_state)
    if form == "parallel":
        o, s = _parallel(q, k, v, log_decay, initial_state)
    elif form == "recurrent":
        o, s = _recurrent(q, k, v, log_decay, initial_state)
    else:
        o, s = _chunk(q, k, v, log_decay, initial_state, chunk_size)
    return (o, s) if return_state else o
