"""G language models of one shape as one batched model: the members' parameters in one tensor.

Each member is built as its solo run builds it (the seed, then plan.build_model), so its
initialisation is its own. Its parameters are laid end to end in one row of a (G, P) leaf
tensor, ``flat``: a training step runs ``vmap(functional_call)`` of one skeleton module over the
rows, each row cut into the member's parameters as views, so every torch operator sees G models,
the chunk Functions and fused CPU kernels take the members folded into their batch
(harness.ops.common.members), and the gradients land in one (G, P) tensor that the optimizer
and the clipping treat in a handful of operations, however many parameter tensors a model has.
Buffers are stacked beside it (torch.func.stack_module_state). The skeleton contributes its
structure and its plain Python state only (the mixers' settings, FAVOR+'s projections, which
every member draws from the same per-layer seeds, as alone).

A member leaves the stack when it stops (``keep``); its last parameters are read out first
(``member_state``) as a normal LanguageModel state dict.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch
from torch.func import functional_call, stack_module_state, vmap

from harness.config.plan import RunPlan
from harness.model import LanguageModel
from harness.train.group.linear import group_linears
from harness.train.optim import initial_model


def build_member(plan: RunPlan, dtype: torch.dtype | None = None) -> LanguageModel:
    """The member's model exactly as its solo run starts it (harness.train.optim.initial_model:
    the run's seed, its model, its init_jitter), then cast to ``dtype`` if given (float64 for the
    equality tests). A resumed group overwrites these weights with its own."""
    model = initial_model(plan)
    return model if dtype is None else model.to(dtype)


def _canonical_names(model: torch.nn.Module) -> dict[str, str]:
    """Every state-dict name of the model -> the name its tensor is stacked under (a tied head's
    weight is the embedding's: named_parameters keeps one of each tensor)."""
    first: dict[int, str] = {}
    out = {}
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    for name, tensor in named:
        out[name] = first.setdefault(id(tensor), name)
    return out


@dataclass(frozen=True)
class Slot:
    """Where one parameter tensor sits in a member's row of ``flat``."""
    name: str
    start: int
    shape: torch.Size

    @property
    def stop(self) -> int:
        return self.start + self.shape.numel()


def layout(model: torch.nn.Module) -> list[Slot]:
    """The model's parameters end to end, in named_parameters order."""
    slots, at = [], 0
    for name, p in model.named_parameters():
        slots.append(Slot(name, at, p.shape))
        at += p.numel()
    return slots


class MemberStack:
    """The members' parameters as rows of ``flat`` (G, P), a leaf that requires grad; their buffers
    stacked (G, ...); each member's loss on its own batch in one vmapped call."""

    def __init__(self, models: list[LanguageModel]) -> None:
        # structure only: functional_call swaps every tensor in; its linear layers run the
        # group's batched matmul (harness.train.group.linear)
        self.skeleton = group_linears(copy.deepcopy(models[0]))
        self.names = _canonical_names(self.skeleton)
        self.state_keys = list(self.skeleton.state_dict().keys())
        self.slots = layout(self.skeleton)
        dtypes = {p.dtype for p in self.skeleton.parameters()}
        if len(dtypes) > 1:
            raise ValueError(f"a group keeps its parameters in one tensor: one dtype, not {sorted(map(str, dtypes))}")
        self.flat = torch.stack([torch.cat([p.detach().reshape(-1) for p in m.parameters()]) for m in models])
        self.flat.requires_grad_()
        self.buffers: dict[str, torch.Tensor] = stack_module_state(models)[1]

    @property
    def size(self) -> int:
        return self.flat.shape[0]

    def split(self, row: torch.Tensor) -> dict[str, torch.Tensor]:
        """A member's parameters as views of its row (P,) of ``flat`` (or of its gradient)."""
        # one split (its backward is one concatenation), not a slice per tensor (a (P,) scatter each)
        parts = row.split([s.shape.numel() for s in self.slots], dim=-1)
        return {s.name: part.view(s.shape) for s, part in zip(self.slots, parts)}

    def losses(self, loss: Callable, inputs: torch.Tensor, positions: torch.Tensor,
               targets: torch.Tensor) -> torch.Tensor:
        """Each member's ``loss(logits, targets)`` on its own batch: inputs (G, B, T), positions
        and targets (G, B, K) -> (G,)."""
        skeleton = self.skeleton

        def one(row, buffers, x, p, t):
            return loss(functional_call(skeleton, (self.split(row), buffers), (x, p)), t)

        # randomness "same": a draw inside the step (FAVOR+ redraws from their own generators) is
        # one draw for every member, as each member's solo run draws it; dropout, the draw that
        # would differ, keeps a run out of any group (signature.ungroupable)
        return vmap(one, randomness="same")(self.flat, self.buffers, inputs, positions, targets)

    def member_state(self, i: int) -> dict[str, torch.Tensor]:
        """Member i's parameters and buffers as LanguageModel.state_dict() names them (copies)."""
        tensors = {**self.split(self.flat[i].detach()), **{k: v[i] for k, v in self.buffers.items()}}
        return {key: tensors[self.names[key]].clone() for key in self.state_keys}

    @torch.no_grad()
    def load_member(self, i: int, model: LanguageModel) -> LanguageModel:
        """Member i's current weights into ``model`` (a model of the same shape), returned."""
        model.load_state_dict(self.member_state(i))
        return model

    def keep(self, rows: list[int]) -> None:
        """Keep only the members at ``rows`` (in that order): a new leaf, its gradient dropped."""
        index = torch.tensor(rows, device=self.flat.device)
        self.flat = self.flat.detach().index_select(0, index).requires_grad_()
        self.buffers = {k: v.index_select(0, index) for k, v in self.buffers.items()}

    def state(self) -> dict[str, torch.Tensor | dict[str, torch.Tensor]]:
        """The stacked tensors, for a group checkpoint."""
        return {"flat": self.flat.detach(), "buffers": dict(self.buffers)}

    def restore(self, state: dict) -> None:
        """The stacked tensors of a group checkpoint (its members, in its order)."""
        self.flat = state["flat"].to(self.flat.device).requires_grad_()
        self.buffers = {k: state["buffers"][k].to(self.flat.device) for k in self.buffers}
        # the skeleton's plain state follows its buffers (FAVOR+'s projections: favor_seed)
        self.skeleton.load_state_dict(self.member_state(0))
