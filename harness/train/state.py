"""What the training loop carries between steps: its state (LoopState, and the checkpoint that
saves it with the model and optimizer), the rule that stops it (stop_reason), the clock that
times its steps (StepClock), and the run under way that its phases pass on (Run)."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

import torch

from harness.config.plan import RunPlan
from harness.outputs.results import MetricsLog
from harness.train.evaluate import EvalSet

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from tqdm import tqdm

    from harness.model import LanguageModel
    from harness.outputs.wandb_logger import NullLogger, WandbLogger
    from harness.train.faults import FaultWatch, StopRequest


class StepClock:
    """The loop's on_step callback, timing each step: from the loop's start (or the previous
    step's end) to the end of its optimizer step. The median drops the intervals that also hold
    an evaluation or a checkpoint; a single step is timed whole (its first-call set-up included)."""

    def __init__(self, then: Callable[[int], None] | None = None) -> None:
        self.then, self.last, self.intervals = then, time.perf_counter(), []

    def __call__(self, step: int) -> None:
        now = time.perf_counter()
        self.intervals.append(now - self.last)
        self.last = now
        if self.then is not None:
            self.then(step)

    def seconds_per_step(self) -> float | None:
        if not self.intervals:
            return None
        ordered = sorted(self.intervals)
        return ordered[len(ordered) // 2]


# A validation loss this far below the best (in nats, absolute) is an improvement. Absolute, not
# relative: at chance the loss sits near ln(values) and a relative 0.1 % is about as strict, but a
# run that has converged keeps halving a loss near zero, so a relative rule never stops it.
LOSS_DELTA = 0.01


def stop_reason(loop: "LoopState", last_eval: dict[str, Any], step: int, target_accuracy: float | None,
                patience: int | None, min_steps: int) -> str | None:
    """Why the run stops after this evaluation, or None to go on: "target_accuracy" once every
    setting reaches it, "plateau" after `patience` evaluations without improvement (from step
    `min_steps` on)."""
    if target_accuracy is not None and last_eval["min_accuracy"] >= target_accuracy:
        return "target_accuracy"
    if patience is not None and loop.since_best >= patience and step >= min_steps:
        return "plateau"
    return None


@dataclass
class LoopState:
    """What the training loop carries from step to step besides the model and optimiser."""
    step: int = 0
    running: Optional[torch.Tensor] = None   # summed loss since the last progress refresh
    last_loss: float = float("nan")
    last_eval: dict[str, Any] = field(default_factory=dict)
    eval_step: int = -1
    elapsed_s: float = 0.0                   # wall time before this process (a resumed run)
    # the plateau stop's state (in the checkpoint, so a resumed run stops at the same step)
    best_accuracy: Optional[float] = None    # the best validation accuracy so far
    best_step: Optional[int] = None          # the step it was first reached at
    best_loss: Optional[float] = None        # the lowest validation loss so far
    since_best: int = 0                      # evaluations in a row without improvement

    def record_eval(self, step: int, accuracy: float, loss: float, min_delta: float) -> None:
        """Update the plateau state with one validation evaluation. It improves when the accuracy
        beats the best by more than `min_delta`, or the loss falls below the best by more than
        LOSS_DELTA nats: every mixer sits near zero accuracy for a few hundred steps before it
        escapes, and only the loss moves there."""
        improved = (self.best_accuracy is None or accuracy > self.best_accuracy + min_delta
                    or loss < self.best_loss - LOSS_DELTA)
        if self.best_accuracy is None or accuracy > self.best_accuracy:
            self.best_accuracy, self.best_step = accuracy, step
        self.best_loss = loss if self.best_loss is None else min(self.best_loss, loss)
        self.since_best = 0 if improved else self.since_best + 1

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def checkpoint_payload(plan: RunPlan, model, opt, sched, loop: LoopState, logger) -> dict[str, Any]:
    """What a solo run's checkpoint holds: enough to end exactly as an uninterrupted run would."""
    from harness.outputs import checkpoint

    return {"format": checkpoint.FORMAT, "step": loop.step, "config_hash": plan.digest,
            "config": plan.flat, "model": model.state_dict(), "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(), "rng": checkpoint.rng_state(), "loop": loop.as_dict(),
            "logger_id": logger.run_id}


def restore_checkpoint(saved: dict[str, Any], model, opt, sched) -> LoopState:
    """The model, optimizer, schedule and random streams as checkpoint_payload saved them."""
    from harness.outputs import checkpoint

    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["optimizer"])  # moves the moments onto the parameters' device
    sched.load_state_dict(saved["scheduler"])
    checkpoint.set_rng_state(saved["rng"])
    loop = LoopState(**saved["loop"])
    loop.running = loop.running.to(next(model.parameters()).device)
    return loop


@dataclass
class Run:
    """A training run under way: its plan, the model and optimiser, the evaluation sets, the loop's
    state and where it writes (what the phases start, steps and finish pass on). A group's member
    (harness.train.group.runs) is finished as one, with no optimizer or schedule of its own."""
    plan: RunPlan
    out_dir: Path
    model: LanguageModel
    step_model: torch.nn.Module      # the model the step calls (compiled with trainer.compile)
    watch: FaultWatch
    opt: Optional[torch.optim.Optimizer]
    sched: Optional[torch.optim.lr_scheduler.LRScheduler]
    autocast: Callable[[], AbstractContextManager]
    loop: LoopState
    eval_sets: list[EvalSet]         # the test split: reported at the end
    periodic: list[EvalSet]          # the validation split, evaluated every eval_every steps
    logger: NullLogger | WandbLogger
    metrics: MetricsLog
    terminate: Optional[StopRequest]
    results: dict[str, object]
    started: float                   # wall-clock start (earlier by a resumed run's elapsed time)
    cpu_started: float
    ckpt_path: Optional[Path] = None
    ckpt_step: Optional[int] = None
    batches: Optional[Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = None
    bar: Optional[tqdm] = None
    clock: Optional[StepClock] = None
    eval_lines: bool = False         # one line per evaluation (a non-terminal log) instead of the bar
    setup_s: float = 0.0             # this process's seconds before its first step
    memory_lines: Optional[list[str]] = None  # the printed account of the model's memory (memory_lines)

    @property
    def checkpoint_record(self) -> dict[str, Any] | None:
        return {"path": str(self.ckpt_path), "step": self.ckpt_step} if self.ckpt_step is not None else None
