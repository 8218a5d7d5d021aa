"""The grouped optimizer step: torch's AdamW for each member at once, each with its own rate,
weight decay and gradient clipping, and a mask that leaves a member exactly as it was.

A solo run clips its gradients to their global norm (harness.train.faults.FaultWatch, as
clip_grad_norm_ does) and steps torch.optim.AdamW built by harness.train.loop.build_optimizer:
weight decay on the matrices only, betas (0.9, 0.98), eps 1e-8, the rate of
harness.train.loop.lr_schedule. Here every stacked tensor (G, ...) takes the same arithmetic as
torch's single-tensor AdamW with the per-member numbers broadcast along its first dimension, so
a member's step is its solo step. A member whose ``active`` entry is False keeps its parameters,
moments and step count bit for bit (a stopped or failed member: frozen, not decayed).
"""
from __future__ import annotations

from typing import Sequence

import torch

from harness.model import LanguageModel
from harness.train.loop import build_optimizer

def decay_split(model: LanguageModel, tr) -> dict[str, bool]:
    """Parameter name -> whether it takes weight decay, as build_optimizer groups the model's
    parameters (the one definition of the split), and build_optimizer's AdamW settings."""
    opt = build_optimizer(model, tr)
    decays = {id(p): group["weight_decay"] != 0 for group in opt.param_groups for p in group["params"]}
    return {name: decays[id(p)] for name, p in model.named_parameters() if id(p) in decays}


def adamw_settings(model: LanguageModel, tr) -> dict[str, float]:
    """betas and eps of the AdamW build_optimizer makes."""
    group = build_optimizer(model, tr).param_groups[0]
    (beta1, beta2), eps = group["betas"], group["eps"]
    return {"beta1": beta1, "beta2": beta2, "eps": eps}


def _per_member(values: Sequence[float], like: torch.Tensor) -> torch.Tensor:
    """(G,) numbers as a tensor that broadcasts along a stacked tensor's first dimension."""
    return torch.tensor(list(values), dtype=like.dtype, device=like.device).view(-1, *[1] * (like.dim() - 1))


def clip_per_member(grads: dict[str, torch.Tensor], max_norms: Sequence[float]) -> torch.Tensor:
    """Clip each member's gradients to its own global norm ``max_norms[i]`` (0: no clipping), as
    FaultWatch.clip_and_record does for a solo run (per-tensor norms, squared and summed in
    float64, clip_grad_norm_'s coefficient max_norm / (norm + 1e-6) capped at 1); returns each
    member's norm (G,) in float64 (non-finite where a gradient is)."""
    squares = torch.stack([g.flatten(1).norm(dim=1).double().square() for g in grads.values()])
    total = squares.sum(dim=0).sqrt()  # (G,)
    like = next(iter(grads.values()))
    # in the gradients' dtype, as clip_grads_with_norm_ divides there
    limits = torch.tensor(list(max_norms), dtype=like.dtype, device=total.device)
    coef = (limits / (total.to(like.dtype) + 1e-6)).clamp(max=1.0)
    coef = torch.where(limits > 0, coef, torch.ones_like(coef))
    for g in grads.values():
        g.mul_(coef.view(-1, *[1] * (g.dim() - 1)))
    return total


class GroupAdamW:
    """AdamW over stacked parameters, one member per row. ``step(lrs, active)`` takes each member's
    rate of this step (its base rate times its schedule's factor) and a (G,) bool mask."""

    def __init__(self, params: dict[str, torch.Tensor], decays: dict[str, bool],
                 weight_decays: Sequence[float], *, beta1: float, beta2: float, eps: float) -> None:
        self.decays, self.weight_decays = decays, list(weight_decays)
        self.beta1, self.beta2, self.eps = beta1, beta2, eps
        self.exp_avg = {k: torch.zeros_like(p) for k, p in params.items()}
        self.exp_avg_sq = {k: torch.zeros_like(p) for k, p in params.items()}
        device = next(iter(params.values())).device
        self.steps = torch.zeros(len(self.weight_decays), dtype=torch.float64, device=device)  # (G,)
        self.taken = 0  # steps taken by the active members (the same count for each)

    @torch.no_grad()
    def step(self, params: dict[str, torch.Tensor], lrs: Sequence[float], active: torch.Tensor) -> None:
        self.taken += 1
        beta1, beta2, t = self.beta1, self.beta2, self.taken
        # the scalars of torch's _single_tensor_adam, in Python floats as there, per member
        bias2_sqrt = (1 - beta2**t) ** 0.5
        step_sizes = [-(lr / (1 - beta1**t)) for lr in lrs]
        for name, p in params.items():
            g = p.grad
            if g is None:
                continue
            keep = active.view(-1, *[1] * (p.dim() - 1))
            new = p.detach()
            if self.decays[name]:
                new = new * _per_member([1 - lr * wd for lr, wd in zip(lrs, self.weight_decays)], p)
            m = self.exp_avg[name].lerp(g, 1 - beta1)
            v = self.exp_avg_sq[name].mul(beta2).addcmul_(g, g, value=1 - beta2)
            denom = (v.sqrt() / bias2_sqrt).add_(self.eps)
            new = new.addcdiv(m * _per_member(step_sizes, p), denom)
            p.data = torch.where(keep, new, p.detach())
            self.exp_avg[name] = torch.where(keep, m, self.exp_avg[name])
            self.exp_avg_sq[name] = torch.where(keep, v, self.exp_avg_sq[name])
        self.steps = torch.where(active, self.steps + 1, self.steps)

    def keep(self, rows: list[int], params: dict[str, torch.Tensor]) -> None:
        """Keep the moments of the members at ``rows`` only (after MemberStack.keep)."""
        index = torch.tensor(rows, device=self.steps.device)
        self.exp_avg = {k: v.index_select(0, index) for k, v in self.exp_avg.items()}
        self.exp_avg_sq = {k: v.index_select(0, index) for k, v in self.exp_avg_sq.items()}
        self.steps = self.steps.index_select(0, index)
        self.weight_decays = [self.weight_decays[r] for r in rows]

    def member_state(self, i: int) -> dict[str, dict]:
        """Member i's moments and step count (copies)."""
        return {"exp_avg": {k: v[i].clone() for k, v in self.exp_avg.items()},
                "exp_avg_sq": {k: v[i].clone() for k, v in self.exp_avg_sq.items()},
                "step": float(self.steps[i])}

    def state_dict(self) -> dict:
        return {"exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq, "steps": self.steps,
                "taken": self.taken, "weight_decays": self.weight_decays}

    def load_state_dict(self, state: dict) -> None:
        device = self.steps.device
        self.exp_avg = {k: v.to(device) for k, v in state["exp_avg"].items()}
        self.exp_avg_sq = {k: v.to(device) for k, v in state["exp_avg_sq"].items()}
        self.steps, self.taken = state["steps"].to(device), int(state["taken"])
        self.weight_decays = list(state["weight_decays"])
