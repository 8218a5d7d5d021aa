"""G language models of one shape as one batched model: the members' parameters stacked.

Each member is built as its solo run builds it (the seed, then plan.build_model), so its
initialisation is its own; torch.func.stack_module_state stacks the members' parameters and
buffers into (G, ...) tensors, and a training step runs ``vmap(functional_call)`` of one
skeleton module over them: every torch operator sees G models, and the chunk Functions and
fused CPU kernels take the members folded into their batch (harness.ops.common.members).
The skeleton contributes its structure and its plain Python state only (the mixers' settings,
FAVOR+'s projections, which every member draws from the same per-layer seeds, as alone).

A member leaves the stack when it stops (``keep``); its last parameters are read out first
(``member_state``) as a normal LanguageModel state dict.
"""
from __future__ import annotations

import copy
from typing import Callable

import torch
from torch.func import functional_call, stack_module_state, vmap

from harness.config.plan import RunPlan
from harness.model import LanguageModel


def build_member(plan: RunPlan, dtype: torch.dtype | None = None) -> LanguageModel:
    """The member's model exactly as its solo run starts it (harness.train.loop.start): the global
    seed set to the run's, then the plan's model on its device; then cast to ``dtype`` if given
    (float64 for the equality tests)."""
    torch.manual_seed(plan.cfg.seed)
    model = plan.build_model().to(plan.device)
    return model if dtype is None else model.to(dtype)


def _canonical_names(model: torch.nn.Module) -> dict[str, str]:
    """Every state-dict name of the model -> the name its tensor is stacked under (a tied head's
    weight is the embedding's: stack_module_state keeps one of each tensor)."""
    first: dict[int, str] = {}
    out = {}
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    for name, tensor in named:
        out[name] = first.setdefault(id(tensor), name)
    return out


class MemberStack:
    """The members' parameters (leaves of shape (G, ...), requires_grad) and buffers, and the loss
    of each member on its own batch in one vmapped call."""

    def __init__(self, models: list[LanguageModel]) -> None:
        self.skeleton = copy.deepcopy(models[0])  # structure only: functional_call swaps every tensor in
        self.names = _canonical_names(self.skeleton)
        self.state_keys = list(self.skeleton.state_dict().keys())
        params, buffers = stack_module_state(models)
        self.params: dict[str, torch.Tensor] = params
        self.buffers: dict[str, torch.Tensor] = buffers

    @property
    def size(self) -> int:
        return next(iter(self.params.values())).shape[0]

    def losses(self, loss: Callable, inputs: torch.Tensor, positions: torch.Tensor,
               targets: torch.Tensor) -> torch.Tensor:
        """Each member's ``loss(logits, targets)`` on its own batch: inputs (G, B, T), positions
        and targets (G, B, K) -> (G,)."""
        skeleton = self.skeleton

        def one(params, buffers, x, p, t):
            return loss(functional_call(skeleton, (params, buffers), (x, p)), t)

        # randomness "same": a draw inside the step (FAVOR+ redraws from their own generators) is
        # one draw for every member, as each member's solo run draws it; dropout, the draw that
        # would differ, keeps a run out of any group (signature.ungroupable)
        return vmap(one, randomness="same")(self.params, self.buffers, inputs, positions, targets)

    def zero_grad(self) -> None:
        for p in self.params.values():
            p.grad = None

    def grads(self) -> dict[str, torch.Tensor]:
        """The stacked gradients of the parameters that have one (G, ...)."""
        return {name: p.grad for name, p in self.params.items() if p.grad is not None}

    def member_state(self, i: int) -> dict[str, torch.Tensor]:
        """Member i's parameters and buffers as LanguageModel.state_dict() names them (copies)."""
        stacked = {**self.params, **self.buffers}
        return {key: stacked[self.names[key]][i].detach().clone() for key in self.state_keys}

    @torch.no_grad()
    def load_member(self, i: int, model: LanguageModel) -> LanguageModel:
        """Member i's current weights into ``model`` (a model of the same shape), returned."""
        model.load_state_dict(self.member_state(i))
        return model

    def keep(self, rows: list[int]) -> None:
        """Keep only the members at ``rows`` (in that order): new leaves, gradients dropped."""
        index = torch.tensor(rows, device=next(iter(self.params.values())).device)
        self.params = {k: v.detach().index_select(0, index).requires_grad_(v.requires_grad)
                       for k, v in self.params.items()}
        self.buffers = {k: v.index_select(0, index) for k, v in self.buffers.items()}

    def state(self) -> dict[str, dict[str, torch.Tensor]]:
        """The stacked tensors, for a group checkpoint."""
        return {"params": {k: v.detach() for k, v in self.params.items()}, "buffers": dict(self.buffers)}

    def restore(self, state: dict[str, dict[str, torch.Tensor]]) -> None:
        """The stacked tensors of a group checkpoint (its members, in its order)."""
        device = next(iter(self.params.values())).device
        self.params = {k: state["params"][k].to(device).requires_grad_(v.requires_grad)
                       for k, v in self.params.items()}
        self.buffers = {k: state["buffers"][k].to(device) for k in self.buffers}
        # the skeleton's plain state follows its buffers (FAVOR+'s projections: favor_seed)
        self.skeleton.load_state_dict(self.member_state(0))
