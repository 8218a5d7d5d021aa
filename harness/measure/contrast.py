"""A clean batch beside its corrupted twin (harness.measure.corruption), run with edits on the
hook points: the logit difference patching reads (clean answer minus corrupted answer), the share
of it a patched run restores, and the edit that puts one head's read-out back. Activation
patching (harness.measure.ablate) and path patching (harness.measure.paths) both stand on it.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from harness.hooks import capture, intervene
from harness.measure.corruption import corrupt
from harness.tasks import IGNORE, label_positions
from harness.tasks.base import batch_field


def logit_diff(logits: torch.Tensor, labels: torch.Tensor, other: torch.Tensor) -> float:
    """Mean over labelled positions of logit[clean answer] - logit[corrupted answer]."""
    mask = (labels != IGNORE) & (other != IGNORE)
    good = logits.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    bad = logits.gather(-1, other.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return float((good - bad)[mask].mean()) if mask.any() else float("nan")


def restored_share(diff: float, clean: float, corrupted: float) -> float:
    """The share of the clean-minus-corrupted logit difference a patched run brings back."""
    span = clean - corrupted
    return (diff - corrupted) / span if span else float("nan")


class Contrast:
    """A clean batch and its corrupted twin (harness.measure.corruption) on the model's device:
    the labelled positions and the clean and corrupted answers there; `diff` is the logit
    difference of a run of the corrupted inputs with edits, `clean_run` the clean run's."""

    def __init__(self, model, batch, part: str) -> None:
        self.model, self.part = model, part
        device = next(model.parameters()).device
        self.clean_in = batch_field(batch, "inputs").to(device)
        bad_in, targets, other = (t.to(device) for t in corrupt(batch, part))
        self.bad_in = bad_in
        self.positions, self.labels = label_positions(targets)
        self.others = other.gather(1, self.positions)  # (B, K) the corrupted run's answers

    @torch.no_grad()
    def diff(self, edits: Optional[dict] = None, names=None) -> tuple[float, dict[str, torch.Tensor]]:
        """The corrupted run's logit difference with `edits`, and the hook points `names`
        captured in that run."""
        with intervene(self.model, edits or {}), capture(self.model, names=names or set()) as cache:
            found = logit_diff(self.model(self.bad_in, self.positions), self.labels, self.others)
        return found, dict(cache)

    @torch.no_grad()
    def clean_run(self, names) -> tuple[float, dict[str, torch.Tensor]]:
        """The clean run's logit difference, and the hook points `names` captured in it."""
        with capture(self.model, names=names) as cache:
            clean = logit_diff(self.model(self.clean_in, self.positions), self.labels, self.others)
        return clean, dict(cache)


def put_head(h: int, source: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """The edit that sets head h of a (B, H, T, d) read-out to `source`'s head h."""
    def fn(x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x[:, h] = source[:, h].to(x.dtype)
        return x
    return fn
