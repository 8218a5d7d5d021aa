"""Exact softmax attention: the reference mixer, and its sliding-window (banded) form.

``softmax_attention`` runs PyTorch's fused kernel (never materialising the (T, T) matrix
where a flash/memory-efficient backend exists); ``softmax_weights`` builds the matrix for
analysis; ``softmax_step`` decodes one token against a growing KV cache.

Sliding window of W: query i sees the keys j with i - W < j <= i (itself and the W - 1 before
it), so its KV cache never holds more than W keys and values. ``window_attention`` cuts T into
blocks of W; each block's queries attend to their own block and the one before it through
one fused scaled_dot_product_attention call with a (W, 2W) band mask, so time and memory are
O(T W), not O(T^2). ``window_weights`` gives the banded weights (rows= for a few rows),
``window_step`` decodes against a cache truncated to the window.
"""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F

from ..common.chunking import from_chunks, to_chunks
from ..common.guards import check_qkv, check_qkv_step, query_positions
from ..common.members import fold_call


def _scale(d: int, scale: float | None) -> float:
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


def softmax_attention(q, k, v, *, causal=True, scale=None):
    """Softmax attention, q, k: (B, H, T, Dk), v: (B, H, T, Dv) -> (B, H, T, Dv).

    scale defaults to 1/sqrt(Dk).
    """
    check_qkv(q, k, v, "softmax_attention")
    # a group's members folded into the batch: vmap would run the fused kernel member by member
    return fold_call(partial(F.scaled_dot_product_attention, is_causal=causal, scale=_scale(q.shape[-1], scale)), q, k, v)


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


# ---- sliding window ---------------------------------------------------------------------------

def check_window(window) -> None:
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive int (the keys each query sees), got {window!r}")


def _band(t_q: int, t_k: int, window: int, offset: int, device) -> torch.Tensor:
    """(t_q, t_k) bool, True where query i (at position offset + i of the keys) sees key j."""
    i = torch.arange(t_q, device=device)[:, None] + offset
    j = torch.arange(t_k, device=device)[None, :]
    return (j <= i) & (j > i - window)


def window_attention(q, k, v, window, *, scale=None):
    """Causal softmax attention over the last `window` keys of every query (B, H, T, D) -> (B, H, T, Dv).

    scale defaults to 1/sqrt(Dk). window >= T is exact causal softmax attention.
    """
    check_qkv(q, k, v, "window_attention")
    check_window(window)
    b, h, t, _ = q.shape
    scale = _scale(q.shape[-1], scale)
    if window >= t:
        return fold_call(partial(F.scaled_dot_product_attention, is_causal=True, scale=scale), q, k, v)
    c = window
    qc, kc, vc = (to_chunks(x, c) for x in (q, k, v))  # (B, H, N, C, D), zero-padded at the end
    n = qc.shape[2]
    before = lambda x: torch.cat([torch.zeros_like(x[:, :, :1]), x[:, :, :-1]], dim=2)  # noqa: E731
    keys = torch.cat([before(kc), kc], dim=3).flatten(0, 1)  # (B*H, N, 2C, Dk): the block before, then its own
    values = torch.cat([before(vc), vc], dim=3).flatten(0, 1)
    mask = _band(c, 2 * c, window, c, q.device).expand(n, c, 2 * c).clone()  # (N, C, 2C)
    mask[0, :, :c] = False  # the first block has no block before it (its zero padding is not a key)
    o = fold_call(partial(F.scaled_dot_product_attention, attn_mask=mask, scale=scale), qc.flatten(0, 1), keys, values)
    return from_chunks(o.view(b, h, n, c, v.shape[-1]), t)  # padded queries' rows cut off


def window_weights(q, k, window, *, scale=None, rows=None):
    """The banded attention weights (B, H, R, T): softmax over i - W < j <= i, zero elsewhere.

    rows: (R,) query positions (None: all T); costs O(R T).
    """
    check_window(window)
    t = q.shape[2]
    pos = torch.arange(t, device=q.device) if rows is None else rows.to(q.device)
    scores = torch.matmul(q[:, :, pos], k.transpose(-1, -2)) * _scale(q.shape[-1], scale)  # (B, H, R, T)
    j = torch.arange(t, device=q.device)[None, :]
    seen = (j <= pos[:, None]) & (j > pos[:, None] - window)  # (R, T)
    return torch.softmax(scores.masked_fill(~seen, float("-inf")), dim=-1)


def window_step(q, k, v, cache=None, *, window, scale=None):
    """Decode one token against a KV cache of at most `window` tokens: as softmax_step, with the
    oldest entry dropped once the cache holds `window` tokens. Returns (o (B, H, Dv), (K, V))."""
    check_window(window)
    if cache is not None:
        start = max(0, cache[0].shape[2] - (window - 1))  # keep window - 1: the new token makes it window
        cache = (cache[0][:, :, start:], cache[1][:, :, start:]) if window > 1 else None
    return softmax_step(q, k, v, cache, scale=scale)
