"""Sums of log decays over segments of time, computed without catastrophic cancellation.

The decay from position j to position i (j <= i) is prod_{j<s<=i} a_s = exp(x_{j+1} + ... + x_i)
with x = log a. Writing it as b_i - b_j with b a global cumsum loses precision once |b| is
large (float32, long sequences, strong decay), so the functions here sum each segment on its own.
"""

from __future__ import annotations

import torch

from .prefix import cumsum


def segsum(x: torch.Tensor) -> torch.Tensor:
    """(..., T) -> (..., T, T) with out[..., i, j] = sum_{j<s<=i} x_s for j <= i, -inf above.

    exp(segsum(x)) is the causal decay mask (zero above the diagonal, one on it). Each entry
    is a masked cumulative sum (as in Mamba-2's reference), so its rounding error is relative
    to the segment, not to the whole prefix. Costs O(T^2): parallel form and short chunks only.
    """
    t = x.size(-1)
    ones = torch.ones(t, t, dtype=torch.bool, device=x.device)
    xx = x.unsqueeze(-1).expand(*x.shape, t)  # (..., T_s, T_j): xx[s, j] = x_s
    xx = xx.masked_fill(~torch.tril(ones, diagonal=-1), 0.0)  # keep s > j
    out = cumsum(xx, dim=-2)  # out[i, j] = sum_{j<s<=i} x_s
    return out.masked_fill_(~torch.tril(ones), float("-inf"))  # in place: cumsum keeps nothing for backward


def suffix_sum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """out_j = sum_{s>j} x_s along dim (the log decay from j to the end; 0 at the last index).

    Computed as a reversed cumulative sum, so each entry sums only its own suffix.
    """
    dim = dim % x.dim()
    csum = torch.cumsum(torch.flip(x, (dim,)), dim=dim)  # inclusive suffix sums, reversed
    zero = torch.zeros_like(csum.narrow(dim, 0, 1))
    csum = torch.cat([zero, csum.narrow(dim, 0, x.size(dim) - 1)], dim=dim)  # exclusive
    return torch.flip(csum, (dim,))


def segsum_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """(..., T) and rows (R,) -> (..., R, T): the rows `rows` of segsum(x), in O(R T) memory.

    out[..., r, j] = sum_{j<s<=rows[r]} x_s for j <= rows[r], -inf after it. Each row is a
    reversed cumulative sum that starts at its own position, so (as in segsum) an entry's
    rounding error is relative to its segment, never to the whole prefix.
    """
    t = x.size(-1)
    rows = rows.to(device=x.device, dtype=torch.long)
    seen = torch.arange(t, device=x.device) <= rows.unsqueeze(-1)  # (R, T): s <= row
    masked = x.unsqueeze(-2).masked_fill(~seen, 0.0)  # (..., R, T)
    out = suffix_sum(masked, dim=-1)  # out[r, j] = sum_{j<s<=row} x_s
    return out.masked_fill_(~seen, float("-inf"))
