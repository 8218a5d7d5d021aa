"""Autocast and the hand-written chunk Functions.

Autocast casts the inputs of the operators it knows (matmuls to bf16, say) but not the
arithmetic inside a custom autograd Function, whose in-place updates would then meet mixed
dtypes. The chunk forms therefore take autocast's decision once, at their entry: q, k and v
are cast to the autocast dtype (or brought to one common dtype without autocast), and the
Function runs with autocast off. Log decays keep their own (float32 or wider) precision,
and states summed over many chunks are accumulated in float32 (harness.ops.common.prefix).
"""

from __future__ import annotations

import torch


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The dtype a chunk form computes in: autocast's when it is on for the device, else the
    promotion of the inputs' dtypes."""
    device_type = tensors[0].device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def autocast_off(device_type: str):
    return torch.autocast(device_type=device_type, enabled=False)
