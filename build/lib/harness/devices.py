"""Which device a run uses, and how much memory it has: the facts resource checks start from."""
from __future__ import annotations

import torch


def select_device(spec: str) -> torch.device:
    """`trainer.device` as a torch.device: auto is CUDA when present, else the CPU. A CUDA
    device on a machine without one is a ValueError (bad input, refused before any work)."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"trainer.device={spec} but no CUDA device is available")
    return torch.device(spec)
