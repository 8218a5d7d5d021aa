"""Exact softmax attention: the reference mixer.

``softmax_attention`` runs PyTorch's fused kernel (never materialising the (T, T) matrix
where a flash/memory-efficient backend exists); ``softmax_weights`` builds the matrix for
analysis; ``softmax_step`` decodes one token against a growing KV cache.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .guards import check_qkv, check_qkv_step, query_positions


def _scale(d: int, scale: float | None) -> float:
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


def softmax_attention(q, k, v, *, causal=True, scale=None):
    """Softmax attention, q, k: (B, H, T, Dk), v: (B, H, T, Dv) -> (B, H, T, Dv).

    scale defaults to 1/sqrt(Dk).
    """
    check_qkv(q, k, v, "softmax_attention")
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=_scale(q.shape[-1], scale))


def softmax_weights(q, k, *, causal=True, scale=None, rows=None):
    """The attention matrix softmax(s q k^T) (B, H, T, T); rows sum to one, zero above the diagonal when causal.

    rows: (R,) query positions; then only those rows are built, (B, H, R, T) in O(R T) memory
    (what measurement reads at long lengths: the rows of the query positions).
    """
    positions = query_positions(q, rows)  # (R,)
    if rows is not None:
        q = q[:, :, positions]  # (B, H, R, Dk)
    scores = torch.matmul(q, k.transpose(-1, -2)) * _scale(q.shape[-1], scale)  # (B, H, R, T)
    if causal:
        future = torch.arange(k.shape[2], device=q.device) > positions.unsqueeze(-1)  # (R, T)
        scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1)


def softmax_step(q, k, v, cache=None, *, scale=None):
    """Decode one token: q, k: (B, H, Dk), v: (B, H, Dv); cache (K, V) of shape (B, H, t, D).

    Appends (k, v) to the cache and attends over all t + 1 cached tokens. Returns
    (o (B, H, Dv), (K, V)). Time and memory grow with t: this is what a linear state avoids.
    """
    check_qkv_step(q, k, v, "softmax_step")
    if cache is None:
        keys, values = k.unsqueeze(2), v.unsqueeze(2)
    else:
        keys = torch.cat([cache[0], k.unsqueeze(2)], dim=2)  # (B, H, t+1, Dk)
        values = torch.cat([cache[1], v.unsqueeze(2)], dim=2)
    logits = torch.einsum("bhd,bhjd->bhj", q, keys) * _scale(q.shape[-1], scale)
    w = torch.softmax(logits, dim=-1)
    return torch.einsum("bhj,bhjd->bhd", w, values), (keys, values)
