"""Whether vmap batches an outside mixer: one trial step before its runs may share a group.

A built-in mixer is known to batch (tests/test_group.py holds each to its solo run). An outside
mixer's code is not known: a custom autograd Function without a vmap rule, a data-dependent
branch (`.item()`, `if x.sum() > 0`), an in-place write into a captured buffer, or a kernel that
reads its batch size off a global would fail under vmap or, worse, mix its members. So before a
sweep groups such runs, two copies of the model (different initialisations) take one training
step's forward and backward batched as a group would, and each member's loss and gradient is held
against the same copy run alone. Runs whose trial fails train alone, with the reason said.
"""
from __future__ import annotations

from typing import Optional

import torch

from harness.config.plan import RunPlan
from harness.errors import first_line
from harness.train.optim import lm_loss

TRIAL_MEMBERS = 2
TRIAL_BATCH = 2
RTOL = 1e-4  # float32: a batched matmul may sum in another order than the solo one
_KNOWN: dict[tuple, Optional[str]] = {}  # one trial per shape in a process (a sweep's plans)


def batching_trial(plan: RunPlan, mixer: str, key: tuple) -> Optional[str]:
    """None where the plan's model batches as a group (each member's loss and gradient equal to
    its solo run's within RTOL); else why its runs train alone, in words. ``mixer``: the outside
    mixer's name, for the reason; ``key``: the plan's shape (signature.group_key), one trial each."""
    if key not in _KNOWN:
        _KNOWN[key] = _trial(plan, mixer)
    return _KNOWN[key]


def _trial(plan: RunPlan, mixer: str) -> Optional[str]:
    from harness.train.group.stack import MemberStack

    try:
        with torch.random.fork_rng(devices=[plan.device] if plan.device.type == "cuda" else []):
            models = []
            for k in range(TRIAL_MEMBERS):
                torch.manual_seed(k)
                models.append(plan.build_model().to(plan.device))
            gen = torch.Generator().manual_seed(0)
            shape = (TRIAL_MEMBERS, TRIAL_BATCH, plan.train_len)
            inputs = torch.randint(0, plan.tcfg.vocab_size, shape, generator=gen).to(plan.device)
            targets = torch.randint(0, plan.tcfg.vocab_size, shape, generator=gen).to(plan.device)
            positions = torch.arange(plan.train_len, device=plan.device).expand(shape).contiguous()
            stack = MemberStack(models)
            batched = stack.losses(lm_loss, inputs, positions, targets)
            batched.sum().backward()
            for i, model in enumerate(models):
                solo = lm_loss(model(inputs[i], positions[i]), targets[i])
                params = list(model.parameters())  # the order of a member's row of stack.flat
                grads = torch.autograd.grad(solo, params, allow_unused=True)
                grad = torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1) for p, g in zip(params, grads)])
                loss_gap = (batched[i] - solo).abs().item() / max(solo.abs().item(), 1e-12)
                grad_gap = (stack.flat.grad[i] - grad).norm().item() / max(grad.norm().item(), 1e-12)
                if max(loss_gap, grad_gap) > RTOL:
                    return (f"outside mixer {mixer}: batched by vmap, a member's loss or gradient is not its "
                            f"solo run's (relative gap {max(loss_gap, grad_gap):.1e} > {RTOL:g})")
    except Exception as exc:  # whatever vmap or the mixer raises: the runs train alone, as before
        return f"outside mixer {mixer}: vmap does not batch it ({type(exc).__name__}: {first_line(exc, 160)})"
    return None
