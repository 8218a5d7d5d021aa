"""The slow, obviously-correct reference of linear attention: the oracle its parallel, recurrent
and chunk forms (and the fused kernel) are tested against.

It loops over query positions and rescans the keys each may see, computing every key's weight
from its definition, without going through a state; the final state is assembled the same way,
as an explicit sum over all keys. Batch and heads stay vectorised, only time is a Python loop.
Run it in float64 to compare.
"""

from __future__ import annotations

import torch

from ..common.guards import check_eps, check_finite_denominator, floor_denominator


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
