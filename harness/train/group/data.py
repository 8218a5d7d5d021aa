"""Each member's training batches, from its own stream, stacked for the group's step.

A member's batches are its solo run's: harness.train.optim.train_batches with its seed and task
settings, from its step on (a resumed group gets the same data). Members may differ in task
settings that fix no shape; where they differ in how many positions are labelled (the number of
pairs, say), each member's labelled positions are padded to the longest with position 0 and
target IGNORE: the loss skips those, so each member's loss is the mean over its own labels.
"""
from __future__ import annotations

from typing import Iterator

import torch
import torch.nn.functional as F

from harness.config.plan import RunPlan
from harness.tasks import IGNORE
from harness.train.optim import train_batches


class MemberBatches:
    """The streams of the members still training, by member index."""

    def __init__(self, plans: dict[int, RunPlan], start: int = 0) -> None:
        self.streams: dict[int, Iterator] = {
            i: train_batches(p.module, p.tcfg, p.trainer, p.cfg.seed, p.device, start=start)
            for i, p in plans.items()}

    def drop(self, member: int) -> None:
        self.streams.pop(member, None)

    def next(self, members: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The next batch of each of ``members`` (in that order), stacked: inputs (G, B, T),
        positions and targets (G, B, K) with K the most labelled positions of any member."""
        batches = [next(self.streams[i]) for i in members]
        lengths = {inputs.shape for inputs, _, _ in batches}
        if len(lengths) > 1:  # the shape signature should have kept such members apart
            raise ValueError(f"members' training batches differ in shape {sorted(lengths)}: they cannot share a group")
        width = max(positions.shape[1] for _, positions, _ in batches)

        def padded(t: torch.Tensor, value: int) -> torch.Tensor:
            return t if t.shape[1] == width else F.pad(t, (0, width - t.shape[1]), value=value)

        positions = torch.stack([padded(p, 0) for _, p, _ in batches])
        targets = torch.stack([padded(t, IGNORE) for _, _, t in batches])
        return torch.stack([inputs for inputs, _, _ in batches]), positions, targets
