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

A run asked to stop (SIGTERM, SIGINT) is the other way training ends early: StopRequest below.
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn

from harness.errors import RunError
from harness.ops.common.guards import watching_denominators

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
        self._gradient_sites = list(range(len(self.sites) - len(self._param_groups), len(self.sites)))
        device = next(model.parameters()).device
        self.first = torch.full((len(self.sites),), -1, dtype=torch.long, device=device)
        # The step's checks, as 0-dim tensors that are finite exactly when their check passed
        # (a sum is NaN or Inf when an entry is, unless it overflows), with the site of each:
        # all of them become one vector and one isfinite at the end of the step, instead of
        # a few small device ops per check.
        self._values: list[torch.Tensor] = []
        self._value_sites: list[int] = []
        self._indices: dict[tuple[int, ...], torch.Tensor] = {}
        self._armed = False
        self._layer: int | None = None
        for i, block in enumerate(self.blocks):
            block.mixer.register_forward_pre_hook(self._enter(i))
            block.mixer.register_forward_hook(self._leave(i))

    # ----- recording (device only) ---------------------------------------------------------------

    def _record(self, site: Site, value: torch.Tensor) -> None:
        self._values.append(value)
        self._value_sites.append(self._index[site])

    def _on_device(self, indices: list[int], device: torch.device) -> torch.Tensor:
        """indices as a device tensor, made once per pattern (the same every step): a fresh
        host-to-device copy each step would be a host sync on CUDA."""
        key = tuple(indices)
        if key not in self._indices:
            self._indices[key] = torch.tensor(indices, device=device)
        return self._indices[key]

    def _enter(self, layer: int):
        def hook(module, args):
            self._layer = layer
        return hook

    def _leave(self, layer: int):
        def hook(module, args, output):
            self._layer = None
            if self._armed:
                out = output[0] if isinstance(output, tuple) else output  # fla-style (o, attn, cache)
                self._record(Site("output", layer), out.detach().sum())
        return hook

    def _denominator(self, den: torch.Tensor) -> None:
        if not self._armed or self._layer is None:
            return
        site = Site("denominator", self._layer)
        self._record(site, den.sum())
        if self.positive[self._layer]:  # log(min) is finite exactly when every entry is > 0
            self._record(site, den.amin().log())

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
        per-layer norms this check needs anyway; then fold the step's checks into ``first``."""
        self._record(Site("loss", None), loss.detach())
        grads, groups, owners = [], [], []
        for p_group, params in enumerate(self._param_groups):
            for p in params:
                if p.grad is not None:
                    grads.append(p.grad)
                    groups.append(p_group)
                    owners.append(p)
        if grads:
            # one pass over every gradient (what clip_grad_norm_ runs); the per-tensor norms are
            # squared and summed per layer in float64, so only a single tensor's norm past
            # float32's range reads as non-finite, as it did with get_total_norm
            squares = torch.stack(torch._foreach_norm(grads)).double().square()
            index = self._on_device(groups, squares.device)
            per_layer = squares.new_zeros(len(self._param_groups)).index_add_(0, index, squares)
            for g in sorted(set(groups)):
                self._values.append(per_layer[g])
                self._value_sites.append(self._gradient_sites[g])
            if max_norm > 0:
                total = per_layer.sum().sqrt().to(grads[0].dtype)
                # it scales the .grad of the tensors it is given: the parameters, not the gradients
                torch.nn.utils.clip_grads_with_norm_(owners, max_norm, total)
        values = torch.stack(self._values)  # promoted to the widest dtype (float64 here)
        sites = self._on_device(self._value_sites, values.device)
        bad = torch.zeros(len(self.sites), device=values.device, dtype=torch.float64).index_add_(
            0, sites, (~torch.isfinite(values)).double()) > 0
        self.first = torch.where((self.first < 0) & bad, step, self.first)
        self._values.clear()
        self._value_sites.clear()

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


# ----- interruptions: a signal that asks a run to stop -------------------------------------------

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(RunError):
    """A run stopped by SIGTERM or SIGINT after checkpointing its step; ``exit_code`` is the
    shell's for a process ended by that signal (128 + its number: 143, 130), so a scheduler or a
    script reads it as interrupted, not failed."""

    def __init__(self, message: str, signum: int, **record) -> None:
        super().__init__(message, **record)
        self.signum = signum
        self.exit_code = 128 + signum


class Stopped(BaseException):
    """A run with nothing to keep (a measurement mode: probe, cost, ablate) stopped at once by
    SIGTERM or SIGINT. A BaseException, as KeyboardInterrupt is: no ``except Exception`` of the
    code it interrupts can take it for that code's own failure. ``exit_code``: 128 + the signal."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class StopRequest:
    """SIGTERM (a cluster pre-empting or cancelling the job) and SIGINT (Ctrl-C) set ``signum``;
    the training loop then checkpoints after the current step and stops, so the rerun loses no
    work. A second SIGINT stops at once (KeyboardInterrupt), as a user pressing Ctrl-C twice
    expects. ``at_once``: what runs, for one that has no step to finish (a measurement mode):
    the first signal raises Stopped there and then. Only the main thread can own a signal
    handler; elsewhere this never fires.

    ``received()``: the signal this process was asked to stop by, if any, kept after the run
    (a sweep's worker exits on it instead of taking the next job: harness.run.sweep), until the
    next run of the same process starts: a notebook's or a test's earlier stop is not this one's."""

    _received: int | None = None

    def __init__(self, at_once: str | None = None) -> None:
        self.signum: int | None = None
        StopRequest._received = None
        self.at_once = at_once
        self._previous: dict[int, object] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._request)

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _request(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum
        StopRequest._received = signum
        if self.at_once is not None:
            raise Stopped(f"stopped by {signal.Signals(signum).name} during {self.at_once}; nothing was "
                          "written: run the same command again", signum)

    def stopped(self, step: int, checkpoint) -> Interrupted:
        """The error that ends a run stopped at ``step`` with ``checkpoint`` holding it."""
        name = signal.Signals(self.signum).name
        return Interrupted(f"stopped by {name} after step {step}; the checkpoint {checkpoint} holds it: "
                           "rerun the same command to resume", self.signum)

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    @staticmethod
    def received() -> int | None:
        return StopRequest._received
