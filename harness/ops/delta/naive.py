"""The slow, obviously-correct reference of the (gated) delta rule: the oracle its forms (and the
fused kernel) are tested against.

Batch and heads stay vectorised, only time is a Python loop. Run it in float64 to compare.
"""

from __future__ import annotations

import torch


def naive_delta_attention(q, k, v, beta, log_decay=None, *, initial_state=None, return_state=False):
    """The delta rule as defined, one token at a time: S' = a_t S_{t-1},
    S_t = S' + k_t (beta_t (v_t - S'^T k_t))^T, o_t = S_t^T q_t, a_t = exp(log_decay_t) (1 if None).

    Unlike the other families' references (which rescan every key, with no state) this one carries
    the state: the delta rule is defined by its
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
