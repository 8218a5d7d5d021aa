"""Numerical faults of a group's members, each member's own, found on the device.

A solo run's FaultWatch (harness.train.faults) names the first fault by layer and stops the run.
In a group a fault is one member's: each step records, per member, whether its kernel
denominators were finite (and positive where the layer's mixer declares a positive feature map),
its loss finite and its gradient norm finite, and keeps the first step each check failed. A
member that failed a check is masked out of the optimizer step from then on (frozen at its last
clean step); the loop reads the record where it syncs anyway and lets that member go, alone.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from harness.ops.common.guards import watching_denominators

CHECKS = ("denominator", "loss", "gradient")  # in the order a step computes them


class MemberWatch:
    def __init__(self, skeleton: torch.nn.Module, size: int, device: torch.device) -> None:
        self.positive = [bool(getattr(b.mixer, "positive_denominator", False)) for b in skeleton.layers]
        self.first = torch.full((len(CHECKS), size), -1, dtype=torch.long, device=device)  # step, or -1
        self._layer: int | None = None
        self._size = size
        self._denominators_ok: torch.Tensor | None = None
        for i, block in enumerate(skeleton.layers):
            block.mixer.register_forward_pre_hook(self._enter(i))
            block.mixer.register_forward_hook(self._leave)

    def _enter(self, layer: int):
        def hook(module, args):
            self._layer = layer
        return hook

    def _leave(self, module, args, output) -> None:
        self._layer = None

    def _denominator(self, den: torch.Tensor) -> None:
        """A chunk Function's denominators, the members folded into its batch (members first)."""
        rows = den.reshape(self._size, -1)
        ok = torch.isfinite(rows).all(dim=1)
        if self._layer is not None and self.positive[self._layer]:
            ok &= (rows > 0).all(dim=1)
        self._denominators_ok &= ok

    @contextmanager
    def forward_pass(self) -> Iterator[None]:
        """Around the group's forward pass: records each member's denominators."""
        self._denominators_ok = torch.ones(self._size, dtype=torch.bool, device=self.first.device)
        with watching_denominators(self._denominator):
            yield

    def record(self, step: int, losses: torch.Tensor, norms: torch.Tensor) -> torch.Tensor:
        """Fold this step's checks into the record; (G,) bool: the members still clean, the ones
        the optimizer may step."""
        checks = torch.stack([self._denominators_ok, torch.isfinite(losses), torch.isfinite(norms)])
        self.first = torch.where((self.first < 0) & ~checks, step, self.first)
        return (self.first < 0).all(dim=0)

    def faults(self) -> dict[int, dict]:
        """Row -> {"step", "check"} of each member that failed a check (its first): a host sync."""
        first = self.first.tolist()
        found = {}
        for row in range(self._size):
            seen = [(first[c][row], c) for c in range(len(CHECKS)) if first[c][row] >= 0]
            if seen:
                step, check = min(seen)
                found[row] = {"step": step, "check": CHECKS[check]}
        return found

    def keep(self, rows: list[int]) -> None:
        self.first = self.first[:, torch.tensor(rows, device=self.first.device)]
        self._size = len(rows)
