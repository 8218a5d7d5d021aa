"""The step's arithmetic, apart from the loop that repeats it: the training stream, the loss, the
optimizer and its schedule, the precision, and the initial weights' optional jitter. The group
trainer (harness.train.group) uses the same definitions, so a member's step is its solo run's.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch
import torch.nn.functional as F

from harness.tasks import IGNORE, label_positions

if TYPE_CHECKING:
    from harness.config.plan import RunPlan


def build_optimizer(model: torch.nn.Module, tr) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices only (not on norms, biases, gains or decay rates), and
    never on a parameter its module marks `_no_weight_decay` (Mamba-2's dt_bias, A_log, D)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        decays = p.dim() >= 2 and "embed" not in name and not getattr(p, "_no_weight_decay", False)
        (decay if decays else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": tr.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=tr.lr, betas=(0.9, 0.98), eps=1e-8)


def lr_schedule(tr) -> Callable[[int], float]:
    """The learning-rate factor of each step: linear warmup, then cosine from 1 down to
    `min_lr_ratio` at `max_steps`. The settings are read once, as plain numbers: the scheduler
    calls this every step, and reading an OmegaConf node costs more than the arithmetic."""
    warmup, max_steps, floor = int(tr.warmup_steps), int(tr.max_steps), float(tr.min_lr_ratio)
    span = max(1, max_steps - warmup)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / span)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    return factor


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the labelled entries; logits (B, K, V) and targets (B, K), K the
    positions the head ran at (all T, or the labelled ones: harness.tasks.label_positions)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE)


def train_batches(module, tcfg, tr, seed: int, device: torch.device, start: int = 0) -> Iterator[Any]:
    """Endless training batches (inputs (B, T), positions (B, K), targets (B, K)) from batch
    ``start`` on, `data_chunk` of them per vectorised generator call. positions are the labelled
    positions (the head and the loss run there only); finding them costs one host sync per
    generator call. Batch i depends on (seed, i) alone, so a resumed run gets the same data."""
    chunk, skip = divmod(start, tr.data_chunk)
    while True:
        big = module.make_batch(tcfg, tr.batch_size * tr.data_chunk,
                                seed=seed * 1_000_003 + chunk, device=device, split="train")
        positions, targets = label_positions(big.targets)
        for i in range(skip, tr.data_chunk):
            sl = slice(i * tr.batch_size, (i + 1) * tr.batch_size)
            yield big.inputs[sl], positions[sl], targets[sl]
        chunk, skip = chunk + 1, 0


def autocast_factory(device: torch.device, precision: str):
    enabled = precision == "bf16"

    def ctx():
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=enabled)

    return ctx


JITTER_STREAM = 104_729  # the perturbation's generator: seed * this + 1, apart from every other stream


def initial_model(plan: "RunPlan") -> torch.nn.Module:
    """The model a run starts training from, the one definition a solo run
    (harness.train.loop.start) and a group's member (harness.train.group.stack.build_member)
    share: the global seed set to the run's, the plan's model on its device, its weights jittered
    by trainer.init_jitter (a rounding twin is its own run, in a group too)."""
    cfg = plan.cfg
    torch.manual_seed(cfg.seed)
    model = plan.build_model().to(plan.device)
    if plan.trainer.init_jitter:
        jitter_weights(model, plan.trainer.init_jitter, cfg.seed)
    return model


@torch.no_grad()
def jitter_weights(model: torch.nn.Module, size: float, seed: int) -> None:
    """w <- w (1 + size z) for every parameter, z ~ N(0, 1) drawn on the CPU in float64 from the
    run's own stream (trainer.init_jitter): the same perturbation on every machine."""
    gen = torch.Generator().manual_seed(seed * JITTER_STREAM + 1)
    for param in model.parameters():
        z = torch.randn(param.shape, generator=gen, dtype=torch.float64)
        param.mul_((1.0 + size * z).to(device=param.device, dtype=param.dtype))
