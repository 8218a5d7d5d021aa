"""The slow, obviously-correct reference of softmax attention (and of its sliding window):
the oracle its fused forms are tested against.

It loops over query positions and rescans the keys each may see, computing every key's weight
from its definition; batch and heads stay vectorised, only time is a Python loop. Run it in
float64 to compare.
"""

from __future__ import annotations

import math

import torch


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
