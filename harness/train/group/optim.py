"""The grouped optimizer step: torch's AdamW for each member at once, each with its own rate,
weight decay and gradient clipping, and a mask that leaves a member exactly as it was.

A solo run clips its gradients to their global norm (harness.train.faults.FaultWatch, as
clip_grad_norm_ does) and steps torch.optim.AdamW built by harness.train.optim.build_optimizer:
weight decay on the matrices only, betas (0.9, 0.98), eps 1e-8, the rate of
harness.train.optim.lr_schedule. Here the group's (G, P) parameters take the same arithmetic as
torch's single-tensor AdamW with the per-member numbers broadcast along their rows, so
a member's step is its solo step. A member whose ``active`` entry is False keeps its parameters,
moments and step count bit for bit (a stopped or failed member: frozen, not decayed). One
(G, P) tensor (harness.train.group.stack) makes a step a dozen operations whatever the model.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from harness.model import LanguageModel
from harness.train.optim import build_optimizer

def decay_split(model: LanguageModel, tr, slots) -> torch.Tensor:
    """(P,) bool over a member's row of parameters (``slots``: harness.train.group.stack.layout):
    which entries take weight decay, as build_optimizer groups the model's parameters (the one
    definition of the split)."""
    opt = build_optimizer(model, tr)
    decays = {id(p): group["weight_decay"] != 0 for group in opt.param_groups for p in group["params"]}
    params = dict(model.named_parameters())
    device = next(model.parameters()).device
    return torch.cat([torch.full((s.shape.numel(),), decays.get(id(params[s.name]), False), device=device)
                      for s in slots])


def adamw_settings(model: LanguageModel, tr) -> dict[str, float]:
    """betas and eps of the AdamW build_optimizer makes."""
    group = build_optimizer(model, tr).param_groups[0]
    (beta1, beta2), eps = group["betas"], group["eps"]
    return {"beta1": beta1, "beta2": beta2, "eps": eps}


def _column(values: Sequence[float], like: torch.Tensor) -> torch.Tensor:
    """(G,) numbers as a (G, 1) tensor of like's dtype: one per member row of a (G, P) tensor."""
    return torch.tensor(list(values), dtype=like.dtype, device=like.device).unsqueeze(1)


def clip_per_member(grad: torch.Tensor, max_norms: Sequence[float]) -> torch.Tensor:
    """Clip each member's gradient (a row of the (G, P) gradient) to its own global norm
    ``max_norms[i]`` (0: no clipping), with clip_grad_norm_'s coefficient max_norm / (norm +
    1e-6) capped at 1, as a solo run's FaultWatch.clip_and_record does; the squares are summed in
    float64 (there, per tensor). Returns each member's norm (G,) in float64, non-finite where a
    gradient entry is."""
    total = grad.double().square().sum(dim=1).sqrt()  # (G,)
    # in the gradient's dtype, as clip_grads_with_norm_ divides there
    limits = torch.tensor(list(max_norms), dtype=grad.dtype, device=grad.device)
    coef = (limits / (total.to(grad.dtype) + 1e-6)).clamp(max=1.0)
    grad.mul_(torch.where(limits > 0, coef, torch.ones_like(coef)).unsqueeze(1))
    return total


class GroupAdamW:
    """AdamW over the (G, P) parameters of a group, one member per row. ``step(lrs, active)`` takes
    each member's rate of this step (its base rate times its schedule's factor) and a (G,) bool
    mask; ``decays`` (P,) bool says which entries take weight decay (build_optimizer's split)."""

    def __init__(self, flat: torch.Tensor, decays: torch.Tensor, weight_decays: Sequence[float], *,
                 beta1: float, beta2: float, eps: float) -> None:
        self.decays, self.weight_decays = decays, list(weight_decays)
        self.beta1, self.beta2, self.eps = beta1, beta2, eps
        self.exp_avg, self.exp_avg_sq = torch.zeros_like(flat), torch.zeros_like(flat)
        self.steps = torch.zeros(flat.shape[0], dtype=torch.float64, device=flat.device)  # (G,)
        self.taken = 0  # steps taken by the active members (the same count for each)

    @torch.no_grad()
    def step(self, flat: torch.Tensor, lrs: Sequence[float], active: torch.Tensor) -> None:
        """torch's _single_tensor_adam (decoupled weight decay) on every row at once, its scalars in
        Python floats as there, per member; the rows not ``active`` stay exactly as they were."""
        self.taken += 1
        beta1, beta2, t, g, p = self.beta1, self.beta2, self.taken, flat.grad, flat.detach()
        bias2_sqrt = (1 - beta2**t) ** 0.5
        shrink = _column([1 - lr * wd for lr, wd in zip(lrs, self.weight_decays)], p)  # (G, 1)
        new = p * torch.where(self.decays, shrink, torch.ones_like(shrink))
        m = self.exp_avg.lerp(g, 1 - beta1)
        v = self.exp_avg_sq.mul(beta2).addcmul_(g, g, value=1 - beta2)
        denom = (v.sqrt() / bias2_sqrt).add_(self.eps)
        new.addcdiv_(m * _column([-(lr / (1 - beta1**t)) for lr in lrs], p), denom)
        keep = active.unsqueeze(1)
        flat.data = torch.where(keep, new, p)
        self.exp_avg = torch.where(keep, m, self.exp_avg)
        self.exp_avg_sq = torch.where(keep, v, self.exp_avg_sq)
        self.steps = torch.where(active, self.steps + 1, self.steps)

    def keep(self, rows: list[int]) -> None:
        """Keep the moments of the members at ``rows`` only (after MemberStack.keep)."""
        index = torch.tensor(rows, device=self.steps.device)
        self.exp_avg, self.exp_avg_sq = self.exp_avg.index_select(0, index), self.exp_avg_sq.index_select(0, index)
        self.steps = self.steps.index_select(0, index)
        self.weight_decays = [self.weight_decays[r] for r in rows]

    def member_state(self, i: int, split: Callable[[torch.Tensor], dict[str, torch.Tensor]]) -> dict[str, Any]:
        """Member i's moments (by parameter name, through ``split``: MemberStack.split) and step
        count, copied."""
        return {"exp_avg": {k: v.clone() for k, v in split(self.exp_avg[i]).items()},
                "exp_avg_sq": {k: v.clone() for k, v in split(self.exp_avg_sq[i]).items()},
                "step": float(self.steps[i])}

    def state_dict(self) -> dict:
        return {"exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq, "steps": self.steps,
                "taken": self.taken, "weight_decays": self.weight_decays}

    def load_state_dict(self, state: dict) -> None:
        device = self.steps.device
        self.exp_avg, self.exp_avg_sq = state["exp_avg"].to(device), state["exp_avg_sq"].to(device)
        self.steps, self.taken = state["steps"].to(device), int(state["taken"])
        self.weight_decays = list(state["weight_decays"])
