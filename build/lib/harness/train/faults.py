"""Numerical faults of a training run, caught on the device and named by step, layer and mixer.

Each step checks, without leaving the device: every mixer's output is finite; every kernel
denominator phi(q).z is finite, and positive where the mixer declares a positive feature map
(`positive_denominator`: elu+1, FAVOR+, taylor; the identity map's denominator may take either
sign); the loss is finite;
each layer's gradient is finite. A per-site tensor keeps the first step at which each check
failed. The loop reads it only where it syncs anyway (progress refresh, evaluation,
checkpoint, end), so the hot loop gains no host sync, and the fault named is the first one:
the earliest step, and within it the first site in the order the computation ran (forward
through the layers, the loss, then backward from the top layer down).

A checkpoint is written only after a clean check, so the last checkpoint on disk is good.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn

from harness.errors import RunError
from harness.ops.guards import watching_denominators

@dataclass(frozen=True)
class Site:
    what: str              # "output", "denominator", "loss", "gradient"
    layer: int | None      # None: outside the blocks (embedding, final norm, output head)


class NumericalFault(RunError, FloatingPointError):
    """A non-finite value or a non-positive kernel denominator during training."""


_DESCRIBE = {
    "output": "non-finite mixer output (NaN or Inf)",
    "denominator": "kernel denominator phi(q).z non-positive or non-finite",
    "denominator_any_sign": "kernel denominator phi(q).z non-finite",
    "loss": "non-finite loss",
    "gradient": "non-finite gradient",
}


class FaultWatch:
    """Arm around each training step's forward and backward; ``check()`` raises the first fault."""

    def __init__(self, model: nn.Module, mixer_name: str) -> None:
        self.mixer = mixer_name
        self.blocks = list(model.layers)
        self.positive = [bool(getattr(b.mixer, "positive_denominator", False)) for b in self.blocks]
        self.sites: list[Site] = []
        for i, block in enumerate(self.blocks):
            if getattr(block.mixer, "family", None) == "linear":
                self.sites.append(Site("denominator", i))
            self.sites.append(Site("output", i))
        self.sites.append(Site("loss", None))
        self.sites += [Site("gradient", i) for i in reversed(range(len(self.blocks)))]
        self.sites.append(Site("gradient", None))
        self._index = {s: i for i, s in enumerate(self.sites)}
        in_blocks = {id(p) for b in self.blocks for p in b.parameters()}
        self._param_groups = [[p for p in self.blocks[i].parameters() if p.requires_grad]
                              for i in reversed(range(len(self.blocks)))]
        self._param_groups.append([p for p in model.parameters()
                                   if p.requires_grad and id(p) not in in_blocks])
        device = next(model.parameters()).device
        self.first = torch.full((len(self.sites),), -1, dtype=torch.long, device=device)
        self._flags: dict[int, torch.Tensor] = {}
        self._false = torch.zeros((), dtype=torch.bool, device=device)
        self._armed = False
        self._layer: int | None = None
        for i, block in enumerate(self.blocks):
            block.mixer.register_forward_pre_hook(self._enter(i))
            block.mixer.register_forward_hook(self._leave(i))

    # ----- recording (device only) ---------------------------------------------------------------

    def _flag(self, site: Site, bad: torch.Tensor) -> None:
        i = self._index[site]
        self._flags[i] = bad if i not in self._flags else self._flags[i] | bad

    def _enter(self, layer: int):
        def hook(module, args):
            self._layer = layer
        return hook

    def _leave(self, layer: int):
        def hook(module, args, output):
            self._layer = None
            if self._armed:  # the sum is NaN or Inf exactly when some entry is (or it overflows)
                out = output[0] if isinstance(output, tuple) else output  # fla-style (o, attn, cache)
                self._flag(Site("output", layer), ~torch.isfinite(out.detach().sum()))
        return hook

    def _denominator(self, den: torch.Tensor) -> None:
        if not self._armed or self._layer is None:
            return
        ok = torch.isfinite(den.sum())
        if self.positive[self._layer]:
            ok = ok & (den > 0).all()
        self._flag(Site("denominator", self._layer), ~ok)

    @contextmanager
    def forward_pass(self) -> Iterator[None]:
        """Context for the training forward pass: records outputs and denominators."""
        self._armed = True
        try:
            with watching_denominators(self._denominator):
                yield
        finally:
            self._armed = False

    def clip_and_record(self, step: int, loss: torch.Tensor, max_norm: float) -> None:
        """Clip the gradients to ``max_norm`` (0: no clipping), as clip_grad_norm_ does, from the
        per-layer norms this check needs anyway; then fold the step's flags into ``first``."""
        self._flag(Site("loss", None), ~torch.isfinite(loss.detach()))
        norms = []
        for site, params in zip(self.sites[-len(self._param_groups):], self._param_groups):
            grads = [p.grad for p in params if p.grad is not None]
            if grads:
                norm = torch.nn.utils.get_total_norm(grads)
                norms.append(norm)
                self._flag(site, ~torch.isfinite(norm))
        if max_norm > 0 and norms:
            total = torch.linalg.vector_norm(torch.stack(norms))
            grads = [p.grad for group in self._param_groups for p in group if p.grad is not None]
            torch.nn.utils.clip_grads_with_norm_(grads, max_norm, total)
        bad = torch.stack([self._flags.get(i, self._false) for i in range(len(self.sites))])
        self.first = torch.where((self.first < 0) & bad, step, self.first)
        self._flags.clear()

    # ----- reading (a host sync) -----------------------------------------------------------------

    def check(self) -> None:
        """Raise NumericalFault for the first fault seen so far, if any."""
        first = self.first.tolist()
        seen = [(step, order) for order, step in enumerate(first) if step >= 0]
        if not seen:
            return
        step, order = min(seen)
        site = self.sites[order]
        any_sign = site.what == "denominator" and not self.positive[site.layer]
        what = "denominator_any_sign" if any_sign else site.what
        where = (f"layer {site.layer} (mixer {self.mixer})" if site.layer is not None
                 else f"the embedding/output head (model {self.mixer})")
        raise NumericalFault(f"numerical fault at step {step} in {where}: {_DESCRIBE[what]}",
                             fault={"step": step, "layer": site.layer, "mixer": self.mixer,
                                    "check": site.what})
