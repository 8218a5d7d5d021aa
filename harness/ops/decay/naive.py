"""The slow, obviously-correct reference of decayed (gated) linear attention, scalar and
per-dimension gates alike: the oracle its forms (and the fused kernels) are tested against.

It loops over query positions and rescans the keys each may see, computing every key's weight
from its definition, without going through a state; the final state is assembled the same way,
as an explicit weighted sum over all keys. Batch and heads stay vectorised, only time is a
Python loop. Run it in float64 to compare.
"""

from __future__ import annotations

import torch


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
