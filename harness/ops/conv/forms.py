"""The short causal depthwise convolution of the mixers: y_t = b + sum_i w_i x_{t-K+1+i}, per channel.

x (B, T, C) as the projections produce it, weight (C, K) (nn.Conv1d's depthwise weight without
its middle axis), bias (C); positions before the first are zero, so y_t reads x_{<=t} only.
Three ways to compute it, one result:
  - the fused CPU kernel (conv/conv_cpu.cpp, float32/64): one pass over x forward, one over
    x and dy backward;
  - K shifted multiply-adds on the (B, T, C) layout (any device and dtype): each a pass over
    the tensor with its own backward node, which is why the CPU has the fused kernel;
  - F.conv1d with left padding (harness.ops.conv.naive, two transposes): the oracle.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from .. import fused_cpu
from ..common.members import FoldsMembers, member_first


class CausalConvCPU(FoldsMembers, torch.autograd.Function):
    """(x, weight, bias) -> y through the fused CPU kernel; the kernel wants the taps as (K, C).
    A group's members (harness.ops.common.members) fold into the batch, each member's block of
    sequences with its own taps and bias (weight (G, C, K), bias (G, C)): the layout vmap holds
    them in, so nothing is copied on the way in or out."""

    @staticmethod
    def fold_members(size, in_dims, args):
        (x, weight, bias), (dx, dw, db) = args, in_dims
        x = member_first(x, dx, size)  # (G, B, T, C)
        x = x.reshape(size * x.shape[1], *x.shape[2:]).contiguous()  # (G B, T, C)
        return (x, member_first(weight, dw, size), member_first(bias, db, size)), None  # (G, C, K), (G, C)

    @staticmethod
    def unfold_members(size, y, how):
        return y.view(size, y.shape[0] // size, *y.shape[1:]), 0  # (G, B, T, C)

    @staticmethod
    def forward(ctx, x, weight, bias):
        w = weight.transpose(-1, -2).contiguous()  # (K, C), or (G, K, C) for a group's members
        ctx.save_for_backward(x, w)
        return fused_cpu.kernels().conv_forward(x, w, bias.contiguous())

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dx, dw, dbias = fused_cpu.kernels().conv_backward(x, w, dy)
        return dx, dw.transpose(-1, -2), dbias


def _shifted(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    size, t = weight.shape[1], x.shape[1]
    padded = F.pad(x, (0, 0, size - 1, 0))  # (B, T + K - 1, C)
    w = weight.t()  # (K, C)
    y = torch.addcmul(bias, padded[:, :t], w[0])
    for i in range(1, size):
        y = y.addcmul(padded[:, i:i + t], w[i])
    return y


def causal_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """y (B, T, C) of x (B, T, C), weight (C, K), bias (C): the fused kernel where it applies
    (float32/64 CPU, one dtype), else the shifted multiply-adds."""
    if fused_cpu.applies(x, weight, bias):
        return CausalConvCPU.apply(x.contiguous(), weight, bias)
    return _shifted(x, weight, bias)
