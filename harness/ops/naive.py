"""Slow, obviously-correct references: the oracles every fast form is tested against.

Each one loops over query positions and rescans the keys it may see, computing the weight
of every key from its definition (SPEC §1); none of them goes through a state. Final states
are assembled the same way, as explicit weighted sums over all keys. Batch and heads stay
vectorised; only time is a Python loop.
"""

from __future__ import annotations

import math

import torch

from .guards import check_eps, check_finite_denominator, floor_denominator


def naive_softmax_attention(q, k, v, *, causal=True, scale=None, window=None):
    """o_i = sum_j exp(s q_i.k_j) v_j / sum_j exp(s q_i.k_j), j <= i when causal, and
    j > i - window as well for a sliding window (window=None: no window)."""
    t = q.shape[2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    outs = []
    for i in range(t):
        n = i + 1 if causal else t
        first = 0 if window is None else max(0, i - window + 1)
        logits = (q[:, :, i, None] * k[:, :, first:n]).sum(-1) * scale  # (B, H, n - first)
        w = torch.exp(logits - logits.max(dim=-1, keepdim=True).values)
        w = w / w.sum(dim=-1, keepdim=True)
        outs.append((w.unsqueeze(-1) * v[:, :, first:n]).sum(2))
    return torch.stack(outs, dim=2)


def naive_linear_attention(q, k, v, *, causal=True, exclusive=False, normalize=True, eps=1e-6,
                           initial_state=None, return_state=False):
    """o_i = (sum_j (q_i.k_j) v_j + q_i S0) / (sum_j q_i.k_j + q_i.z0) over the keys j row i sees.

    j <= i (causal), j < i (causal, exclusive) or every j (causal=False). The final state is
    (S0 + sum_j k_j v_j^T, z0 + sum_j k_j).
    """
    if normalize:
        check_eps(eps)
    if exclusive and not causal:
        raise ValueError("exclusive=True requires causal=True")
    b, h, t, dk = q.shape
    dv = v.shape[-1]
    s0, z0 = initial_state if initial_state is not None else (None, None)
    nums, dens = [], []
    for i in range(t):
        n = (i if exclusive else i + 1) if causal else t
        w = (q[:, :, i, None] * k[:, :, :n]).sum(-1)  # (B, H, n): q_i . k_j
        num = (w.unsqueeze(-1) * v[:, :, :n]).sum(2)  # (B, H, Dv)
        den = w.sum(dim=-1)
        if s0 is not None:
            num = num + (q[:, :, i, :, None] * s0).sum(2)
        if z0 is not None:
            den = den + (q[:, :, i] * z0).sum(-1)
        nums.append(num)
        dens.append(den)
    num, den = torch.stack(nums, dim=2), torch.stack(dens, dim=2)  # (B, H, T, Dv), (B, H, T)
    if normalize:
        check_finite_denominator(den, "naive_linear_attention")
        o = num / floor_denominator(den, eps).unsqueeze(-1)
    else:
        o = num
    if not return_state:
        return o
    s = (k.unsqueeze(-1) * v.unsqueeze(-2)).sum(2)  # sum_j k_j v_j^T
    z = k.sum(dim=2)
    if s0 is not None:
        s = s + s0
    if z0 is not None:
        z = z + z0
    return o, (s, z)


def naive_decay_attention(q, k, v, log_decay, *, initial_state=None, return_state=False):
    """o_i = sum_{j<=i} q_i.(d_{j->i} * k_j) v_j + (q_i * d_{0->i}) S0, d_{j->i} = prod_{j<s<=i} a_s.

    The decays are products of a_s = exp(log_decay_s), grown one factor per step: every key's
    weight is multiplied by a_i when position i arrives. A scalar decay per head is the
    per-dimension case with the same gate on every key dimension.
    """
    b, h, t, dk = q.shape
    if log_decay.dim() == 3:
        log_decay = log_decay.unsqueeze(-1).expand(b, h, t, dk)
    a = torch.exp(log_decay)  # (B, H, T, Dk)
    s0 = initial_state
    dec = q.new_ones(b, h, 0, dk)  # dec[:, :, j] = prod_{j<s<=i} a_s
    dec0 = q.new_ones(b, h, dk)  # prod_{s<=i} a_s, the decay applied to the initial state
    outs = []
    for i in range(t):
        dec = torch.cat([dec * a[:, :, i, None], q.new_ones(b, h, 1, dk)], dim=2)  # (B, H, i+1, Dk)
        dec0 = dec0 * a[:, :, i]
        w = (q[:, :, i, None] * dec * k[:, :, : i + 1]).sum(-1)  # (B, H, i+1)
        o = (w.unsqueeze(-1) * v[:, :, : i + 1]).sum(2)
        if s0 is not None:
            o = o + ((q[:, :, i] * dec0).unsqueeze(-1) * s0).sum(2)
        outs.append(o)
    o = torch.stack(outs, dim=2)
    if not return_state:
        return o
    s = ((dec * k).unsqueeze(-1) * v.unsqueeze(-2)).sum(2)
    if s0 is not None:
        s = s + dec0.unsqueeze(-1) * s0
    return o, s


def naive_delta_attention(q, k, v, beta, log_decay=None, *, initial_state=None, return_state=False):
    """The delta rule as defined, one token at a time: S' = a_t S_{t-1},
    S_t = S' + k_t (beta_t (v_t - S'^T k_t))^T, o_t = S_t^T q_t, a_t = exp(log_decay_t) (1 if None).

    Unlike the references above this one carries the state: the delta rule is defined by its
    update (each write depends on what the state returned before it), and its closed form
    (harness.ops.delta_weights) is one of the things tested against this loop.
    """
    b, h, t, dk = q.shape
    s = initial_state if initial_state is not None else q.new_zeros(b, h, dk, v.shape[-1])
    outs = []
    for i in range(t):
        if log_decay is not None:
            s = torch.exp(log_decay[:, :, i])[:, :, None, None] * s  # S' = a_i S_{i-1}
        k_i = k[:, :, i]
        correction = beta[:, :, i, None] * (v[:, :, i] - torch.einsum("bhk,bhkv->bhv", k_i, s))
        s = s + torch.einsum("bhk,bhv->bhkv", k_i, correction)
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, i], s))
    o = torch.stack(outs, dim=2)
    return (o, s) if return_state else o
