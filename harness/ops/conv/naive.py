"""The reference of the short causal convolution: F.conv1d with left padding (two transposes), the
oracle its fused kernel and its shifted multiply-adds are tested against."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The same convolution by F.conv1d (the oracle of the tests)."""
    t, size = x.shape[1], weight.shape[1]
    y = F.conv1d(x.transpose(1, 2), weight.unsqueeze(1), bias, padding=size - 1, groups=x.shape[2])
    return y[..., :t].transpose(1, 2)  # left padding only -> causal
