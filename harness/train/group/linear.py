"""The group's linear layers: each member's (N, C) x (C, O) product as one batched matmul, in the
orientation the CPU's batched matmul runs fastest.

Under vmap an nn.Linear becomes torch.bmm over the members, and its backward two more; at the
small widths the quick profile trains (d_model 8) MKL's batched matmul is two to four times
slower when an output's rows are short (an (N, 8) read-out of N = 768 rows, a weight gradient
(24, 8)) than the same product computed transposed. GroupedMatmul computes those products
transposed (the same sums, in another order: equal to a solo run's to rounding) and the others
as vmap would. The skeleton's nn.Linear modules run it (``group_linears``); with
autocast on they keep torch's path, whose casts a member's solo run makes.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from harness.ops.common.members import fold_apply, member_first, transforms_active


# An output this narrow (or narrower) is computed transposed and copied back: MKL's batched matmul
# writes rows of 8 several times slower than the copy costs (measured at d_model 8: an (768, 8)
# output 0.44 ms direct, 0.21 transposed and copied; at 32 wide the copy is the loss).
NARROW = 8


def contiguous_bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for (G, m, k) and (G, k, n), contiguous: computed as (b^T a^T)^T and copied when its
    rows are narrow (n <= NARROW < m). The elementwise operation that reads it next runs several
    times slower on a transposed tensor than the copy costs."""
    if b.shape[2] <= NARROW < a.shape[1]:
        return torch.bmm(b.transpose(1, 2), a.transpose(1, 2)).transpose(1, 2).contiguous()
    return torch.bmm(a, b)


def oriented_bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for (G, m, k) and (G, k, n) with the output's longer side contiguous (a transposed
    view when n < m): never slower than either orientation alone, for a result that is only
    reshaped (a weight's gradient)."""
    if b.shape[2] >= a.shape[1]:
        return torch.bmm(a, b)
    return torch.bmm(b.transpose(1, 2), a.transpose(1, 2)).transpose(1, 2)


class GroupedMatmul(torch.autograd.Function):
    """x (G, N, C), w (G, O, C), b (G, O) or None -> x w^T + b (G, N, O), contiguous."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        y = contiguous_bmm(x, w.transpose(1, 2))
        return y.add_(b.unsqueeze(1)) if b is not None else y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dx = contiguous_bmm(dy, w) if ctx.needs_input_grad[0] else None
        dw = oriented_bmm(dy.transpose(1, 2), x) if ctx.needs_input_grad[1] else None
        db = dy.sum(dim=1) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db


class _LinearFold:
    """How a vmapped F.linear folds: x's leading dimensions into one (G, N, C), the weight and bias
    per member."""

    @staticmethod
    def fold_members(size: int, in_dims: Sequence[Optional[int]], args: tuple) -> tuple[tuple, Any]:
        x, w, b = (member_first(t, d, size) for t, d in zip(args, in_dims))
        lead = x.shape[1:-1]
        return (x.reshape(size, -1, x.shape[-1]), w, b), lead

    @staticmethod
    def unfold_members(size: int, y: torch.Tensor, lead) -> tuple[torch.Tensor, int]:
        return y.view(size, *lead, y.shape[-1]), 0

    run_folded = staticmethod(GroupedMatmul.apply)


def member_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """F.linear, as GroupedMatmul on the members under vmap (torch's own path under autocast)."""
    if not transforms_active() or torch.is_autocast_enabled(x.device.type):
        return F.linear(x, weight, bias)
    return fold_apply(_LinearFold, x, weight, bias)


class GroupedLinear(nn.Linear):
    """An nn.Linear whose forward is member_linear (the same parameters, the same state dict)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return member_linear(x, self.weight, self.bias)


def group_linears(model: nn.Module) -> nn.Module:
    """Make the plain nn.Linear modules of a group's skeleton (its own copy) GroupedLinear, in place:
    the class only changes, their parameters, names and hooks stay."""
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = GroupedLinear
    return model
