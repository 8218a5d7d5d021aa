"""A loop over time carrying a constant-size state: the engine of the recurrent forms.

Autograd would keep the state of every step alive for the backward pass (T copies of a
(Dk, Dv) matrix). The loop is therefore cut into segments that are checkpointed: only the
state at each segment boundary is kept, and a segment's steps are recomputed during the
backward pass. Memory stays linear in T with a slope of a few vectors per token, at the
price of running the forward loop twice when gradients are needed.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

State = tuple[torch.Tensor, ...]
Step = Callable[[State, tuple[torch.Tensor, ...]], tuple[State, tuple[torch.Tensor, ...]]]

SEGMENT = 64  # steps per checkpointed segment


def _run(step: Step, n_state: int, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    state, xs = tuple(tensors[:n_state]), tensors[n_state:]
    ys_t = []
    for t in range(xs[0].shape[2]):
        state, y = step(state, tuple(x[:, :, t] for x in xs))
        ys_t.append(y)
    ys = tuple(torch.stack(parts, dim=2) for parts in zip(*ys_t))  # each (B, H, t_seg, ...)
    return (*state, *ys)


def scan(step: Step, state: State, xs: tuple[torch.Tensor, ...], *, segment: int | None = None) -> tuple[State, tuple[torch.Tensor, ...]]:
    """Apply ``state, y_t = step(state, x_t)`` for t = 0..T-1.

    xs: tensors laid out (B, H, T, ...); step receives their slices at t (B, H, ...).
    Returns the final state and the per-step outputs stacked along dim 2.
    """
    segment = SEGMENT if segment is None else segment
    n_state = len(state)
    grad = torch.is_grad_enabled() and any(x.requires_grad for x in (*state, *xs))
    t_total = xs[0].shape[2]
    outs: list[tuple[torch.Tensor, ...]] = []
    for start in range(0, t_total, segment):
        seg = tuple(x[:, :, start:start + segment] for x in xs)
        if grad:
            res = checkpoint(_run, step, n_state, *state, *seg, use_reentrant=False)
        else:
            res = _run(step, n_state, *state, *seg)
        state, ys = tuple(res[:n_state]), tuple(res[n_state:])
        outs.append(ys)
    return state, tuple(torch.cat(parts, dim=2) for parts in zip(*outs))
