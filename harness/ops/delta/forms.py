"""The delta rule (DeltaNet) and its gated variant (Gated DeltaNet): a state that writes corrections.

    S' = a_t S_{t-1},   S_t = S' + k_t (beta_t (v_t - S'^T k_t))^T,   o_t = S_t^T q_t,

S (B, H, Dk, Dv), a_t = exp(log_decay_t) (1 when log_decay is None), beta_t in [0, 1]. Where
an additive state adds k v^T, the delta rule first reads what the state already returns for
k_t and writes only the difference: with beta = 1 and a unit key, S_t^T k_t = v_t exactly, and
a key written twice is overwritten rather than summed. Equivalently
S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T. No scaling or normalisation
inside, as for decay_attention: callers scale q and L2-normalise k (with |k| = 1 and
beta <= 1 each step is a contraction; unnormalised keys can make the state grow).

Forms, all exact:
  recurrent  a loop over time carrying S (harness.ops.common.scan: checkpointed segments);
  chunk      the WY / UT representation (harness.ops.delta.chunk): exact inside chunks of
             chunk_size, S carried across chunks, any T (zero padding: a padded position has
             beta = 0, k = 0 and a = 1, so it writes nothing and leaves S as it is);
  parallel   the whole sequence as one block: one (T, T) triangular solve per head,
             O(T^2 (Dk + Dv)) time and O(T^2) memory, no loop at all.
The one-token `delta_attention_step` decodes in O(1); `delta_weights` gives the effective
weights a_ij for analysis. All forms compute in at least float32 with autocast off (the
triangular solve has no bf16 kernel, and the state is a long product of corrections) and
return the dtype autocast or the inputs ask for.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..common.chunking import from_chunks, to_chunks
from ..common.guards import check_chunk_size, check_form, check_qkv, check_qkv_step
from ..common.precision import autocast_off, compute_dtype
from ..common.scan import scan
from .chunk import block_corrections, block_factors, block_output, block_state, delta_chunk, solve_unit_lower


def _check_gates(q, beta, log_decay, where):
    b, h, t = q.shape[:3]
    if beta.shape != (b, h, t):
        raise ValueError(f"{where}: beta must be (B, H, T) = {(b, h, t)}, got {tuple(beta.shape)}")
    if log_decay is not None and log_decay.shape != (b, h, t):
        raise ValueError(f"{where}: log_decay must be (B, H, T) = {(b, h, t)} (one decay per head and step) "
                         f"or None, got {tuple(log_decay.shape)}")


def _check_state(q, v, state, where):
    b, h, dk = q.shape[0], q.shape[1], q.shape[-1]
    if state is not None and state.shape != (b, h, dk, v.shape[-1]):
        raise ValueError(f"{where}: the state must be (B, H, Dk, Dv) = {(b, h, dk, v.shape[-1])}, "
                         f"got {tuple(state.shape)}")


def _working(*tensors):
    """The tensors in the working dtype (at least float32), and the dtype to return."""
    out_dtype = compute_dtype(*(t for t in tensors[:3]))
    dtype = torch.promote_types(out_dtype, torch.float32)
    return [None if t is None else t.to(dtype) for t in tensors], out_dtype


# ---- effective weights and the parallel form --------------------------------------------------

def delta_weights(q, k, beta, log_decay=None, rows=None):
    """Effective weights a_ij with o_i = sum_j a_ij v_j exactly (zero initial state): (B, H, R, T).

    Derivation. Write the update as S_t = a_t S_{t-1} + k_t u_t^T, u_t = beta_t (v_t - a_t
    S_{t-1}^T k_t) the correction written at t, and b_i = sum_{s<=i} log a_s. Unrolling,
    S_i = sum_{j<=i} e^{b_i - b_j} k_j u_j^T, so o_i = S_i^T q_i = sum_{j<=i} P_ij u_j with
    P_ij = e^{b_i - b_j} q_i.k_j. Putting S_{t-1} into u_t gives, for every t at once,
    u_t + beta_t sum_{j<t} e^{b_t - b_j} (k_t.k_j) u_j = beta_t v_t, i.e. (I + L) U = diag(beta) V
    with L_tj = beta_t e^{b_t - b_j} k_t.k_j (j < t), unit lower triangular. Hence
    U = (I + L)^{-1} diag(beta) V and

        A = P (I + L)^{-1} diag(beta),

    lower triangular (a product of lower-triangular factors): causal, as it must be. The
    additive state is the case L = 0, beta = 1 (A = P, decay_weights). Rows R = `rows` ((R,)
    positions; None: all) cost one right-sided triangular solve of R rows, O(R T^2).
    """
    check_qkv(q, k, k, "delta_weights")
    _check_gates(q, beta, log_decay, "delta_weights")
    (q, k, _, beta, log_decay), out_dtype = _working(q, k, k, beta, log_decay)
    with autocast_off(q.device.type):
        blk = block_factors(q, k, beta, log_decay)
        p = torch.matmul(q, k.transpose(-1, -2)) * blk.decay  # (B, H, T, T)
        if rows is not None:
            p = p[:, :, rows.to(p.device)]  # (B, H, R, T)
        a = solve_unit_lower(blk.lower, p, left=False) * beta.unsqueeze(-2)
    return a.to(out_dtype)


def _parallel(q, k, v, beta, log_decay, s0):
    """The whole sequence as one block (harness.ops.delta.chunk with C = T), no loop."""
    blk = block_factors(q, k, beta, log_decay)
    w, u = block_corrections(blk, v, beta, many=False)
    if s0 is not None:
        u = u - torch.matmul(w, s0)
    return block_output(blk, q, k, u, s0), block_state(blk.k_out, blk.end_decay, u, s0)


# ---- the recurrent form and the step --------------------------------------------------------

def _update(s, q, k, v, beta, log_a):
    """One step: s (B, H, Dk, Dv); q, k (B, H, Dk); v (B, H, Dv); beta, log_a (B, H) (log_a None: a = 1)."""
    if log_a is not None:
        s = torch.exp(log_a)[..., None, None] * s  # S' = a S
    read = torch.matmul(k.unsqueeze(-2), s).squeeze(-2)  # (B, H, Dv): S'^T k
    s = s + k.unsqueeze(-1) * (beta.unsqueeze(-1) * (v - read)).unsqueeze(-2)
    return s, torch.matmul(q.unsqueeze(-2), s).squeeze(-2)


def _recurrent(q, k, v, beta, log_decay, s0):
    b, h, _, dk = q.shape
    s = s0 if s0 is not None else q.new_zeros(b, h, dk, v.shape[-1])
    if log_decay is None:
        def step(state, x):
            s, o = _update(state[0], *x, None)
            return (s,), (o,)
        xs = (q, k, v, beta)
    else:
        def step(state, x):
            s, o = _update(state[0], *x)
            return (s,), (o,)
        xs = (q, k, v, beta, log_decay)
    (s,), (o,) = scan(step, (s,), xs)
    return o, s


def delta_attention_step(q, k, v, beta, log_decay=None, state=None):
    """Decode one token in O(1): q, k (B, H, Dk), v (B, H, Dv), beta (B, H), log_decay (B, H) or None.

    state: S (B, H, Dk, Dv) or None (empty). Returns (o (B, H, Dv), S).
    """
    check_qkv_step(q, k, v, "delta_attention_step")
    b, h, dk = q.shape
    if beta.shape != (b, h) or (log_decay is not None and log_decay.shape != (b, h)):
        raise ValueError(f"delta_attention_step: beta and log_decay must be (B, H) = {(b, h)}, got "
                         f"{tuple(beta.shape)} and {None if log_decay is None else tuple(log_decay.shape)}")
    if state is not None and state.shape != (b, h, dk, v.shape[-1]):
        raise ValueError(f"delta_attention_step: the state must be (B, H, Dk, Dv) = {(b, h, dk, v.shape[-1])}, "
                         f"got {tuple(state.shape)}")
    (q, k, v, beta, log_decay, state), out_dtype = _working(q, k, v, beta, log_decay, state)
    if state is None:
        state = q.new_zeros(b, h, dk, v.shape[-1])
    with autocast_off(q.device.type):
        s, o = _update(state, q, k, v, beta, log_decay)
    return o.to(out_dtype), s


# ---- the chunk form -------------------------------------------------------------------------

def _chunk(q, k, v, beta, log_decay, s0, chunk_size):
    t = q.shape[2]
    c = min(chunk_size, t)
    qc, kc, vc, bc = (to_chunks(x, c) for x in (q, k, v, beta))  # (B, H, N, C, D); beta (B, H, N, C)
    xc = None if log_decay is None else to_chunks(log_decay, c)
    o, s = delta_chunk(qc, kc, vc, bc, xc, s0)
    return from_chunks(o, t), s


def delta_attention(q, k, v, beta, log_decay=None, *, form="chunk", chunk_size=64, initial_state=None,
                    return_state=False):
    """The (gated) delta rule over q, k (B, H, T, Dk), v (B, H, T, Dv), beta (B, H, T) in [0, 1].

    log_decay: (B, H, T), finite and normally <= 0 (a_t in (0, 1]), or None (a = 1: DeltaNet).
    form: "chunk" (WY representation, chunks of ``chunk_size``), "recurrent" or "parallel" (see
    the module docstring); initial_state: S (B, H, Dk, Dv). Returns o (B, H, T, Dv), or (o, S)
    with the final state.
    """
    check_qkv(q, k, v, "delta_attention")
    check_form(form)
    check_chunk_size(chunk_size)
    _check_gates(q, beta, log_decay, "delta_attention")
    _check_state(q, v, initial_state, "delta_attention")
    (q, k, v, beta, log_decay, s0), out_dtype = _working(q, k, v, beta, log_decay, initial_state)
    with autocast_off(q.device.type):
        if form == "parallel":
            o, s = _parallel(q, k, v, beta, log_decay, s0)
        elif form == "recurrent":
            o, s = _recurrent(q, k, v, beta, log_decay, s0)
        else:
            o, s = _chunk(q, k, v, beta, log_decay, s0, chunk_size)
    o = o.to(out_dtype)
    return (o, s) if return_state else o
