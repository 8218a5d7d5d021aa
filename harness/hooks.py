"""Named hook points: read what the model computes without forking it, or change it.

Every mixer exposes its intermediates through `HookPoint` modules (identity functions in the
forward pass). A measurement opens `with capture(model) as cache:` and runs the model; each hook
point then records its input under its module name ("layers.0.mixer.hook_q", ...). Outside a
capture a hook point is one attribute test and returns its input unchanged, so leaving them in
the model costs nothing and can never change an output. `with intervene(model, {name: fn}):`
replaces what a hook point passes on by fn(x) (ablation and patching, as TransformerLens's
run_with_hooks), and only inside the block.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, Optional, Union

import torch
from torch import nn


class HookPoint(nn.Module):
    """Identity module that records its input while a `capture` is active."""

    def __init__(self) -> None:
        super().__init__()
        self.name: str = ""
        self._sink: Optional[dict] = None
        self._detach: bool = True
        self._edit: Optional[Callable[[torch.Tensor], torch.Tensor]] = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._edit is not None:  # an intervention (ablation, patching): what flows on is its result
            x = self._edit(x)
        if self._sink is not None:
            self._sink[self.name] = x.detach() if self._detach else x
        return x

    def extra_repr(self) -> str:
        return self.name


NameFilter = Union[None, str, Iterable[str], Callable[[str], bool]]


def _matcher(names: NameFilter) -> Callable[[str], bool]:
    if names is None:
        return lambda name: True
    if callable(names):
        return names
    if isinstance(names, str):
        return lambda name: names in name
    wanted = set(names)
    return lambda name: name in wanted


def hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """All hook points of `model` by their module name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, HookPoint)}


@contextmanager
def capture(model: nn.Module, names: NameFilter = None, *, detach: bool = True) -> Iterator[dict]:
    """Record hook point outputs of `model` into a dict while the block runs.

    names: None (all), a substring, an iterable of exact names, or a predicate.
    detach: store detached tensors (default); pass False to keep the graph for gradient probes.
    A second forward pass inside the block overwrites the entries of the first.
    """
    cache: dict[str, torch.Tensor] = {}
    keep = _matcher(names)
    armed = []
    for name, hook in hook_points(model).items():
        if not keep(name):
            continue
        if hook._sink is not None:
            raise RuntimeError(f"hook point {name!r} is already being captured")
        hook.name, hook._sink, hook._detach = name, cache, detach
        armed.append(hook)
    try:
        yield cache
    finally:
        for hook in armed:
            hook._sink = None


@contextmanager
def intervene(model: nn.Module, edits: dict[str, Callable[[torch.Tensor], torch.Tensor]]) -> Iterator[None]:
    """While the block runs, hook point `name` passes on edits[name](x) instead of x. A name
    that is not a hook point of `model` is a KeyError naming it."""
    points = hook_points(model)
    for name in edits:
        if name not in points:
            raise KeyError(f"{name!r} is not a hook point of this model")
        if points[name]._edit is not None:
            raise RuntimeError(f"hook point {name!r} is already being edited")
    try:
        for name, fn in edits.items():
            points[name]._edit = fn
        yield
    finally:
        for name in edits:
            points[name]._edit = None
