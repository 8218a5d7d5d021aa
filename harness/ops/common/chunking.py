"""Split the time axis into fixed-size chunks, join it back, and group chunks into blocks.

The chunk forms work on (B, H, N, C, ...) blocks. T is zero-padded up to a multiple of C:
a zero key and value add nothing to a state, and a zero log decay (a = 1) leaves it as it
is, so padded positions never change the outputs or the final state; their own outputs are
cut off again by :func:`from_chunks`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def num_chunks(t: int, c: int) -> int:
    return -(-t // c)


def to_chunks(x: torch.Tensor, c: int) -> torch.Tensor:
    """(B, H, T, *rest) -> (B, H, N, C, *rest), zero-padded along T to N * C."""
    b, h, t = x.shape[:3]
    rest = x.shape[3:]
    n = num_chunks(t, c)
    pad = n * c - t
    if pad:
        # F.pad pads from the last dim backwards: (0, 0) for each trailing dim, then T.
        x = F.pad(x, (0, 0) * len(rest) + (0, pad))
    return x.reshape(b, h, n, c, *rest)


def from_chunks(x: torch.Tensor, t: int) -> torch.Tensor:
    """(B, H, N, C, *rest) -> (B, H, T, *rest), dropping the padding."""
    b, h, n, c = x.shape[:4]
    x = x.reshape(b, h, n * c, *x.shape[4:])
    return x if n * c == t else x[:, :, :t]  # no slice (and no copy in backward) without padding


CPU_BLOCK = 64  # chunks whose in-chunk products run back to back on CPU


def chunk_blocks(count: int, device: torch.device) -> list[slice]:
    """Slices of `count` chunks processed one block at a time by the chunk Functions.

    On CPU the several batched matmuls of a chunk (q k^T, then its product with v, ...) run
    block by block, so that the operands of one product are still in cache for the next:
    about 10-15% faster than one batched call per product over all chunks (64 x 64 chunks).
    A GPU wants the opposite (few, large launches): one block holds every chunk.
    """
    step = CPU_BLOCK if device.type == "cpu" else max(count, 1)
    return [slice(i, min(i + step, count)) for i in range(0, count, step)]
