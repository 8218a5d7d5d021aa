"""The chunk Functions under torch.func.vmap: a group's member dimension folded into their batch.

Grouped training (harness.train.group) runs G models of one shape as one, with
``vmap(functional_call)`` over their stacked parameters. vmap sees through every torch
operator, but not through a hand-written autograd Function (the chunk forms and the fused CPU
kernels): for those it needs a rule. The rule here is the one the kernels want: the member
dimension becomes part of the batch they already walk (B*H sequences become G*B*H), the
Function runs once, on plain tensors, with its own forward and backward, and its outputs are
seen by vmap as G members again. Every sequence of the folded batch is computed on its own,
so a member's numbers are those it gets alone.

A Function opts in by listing :class:`FoldsMembers` first among its bases; outside vmap its
``apply`` is the Function's own. A plain function torch cannot batch in one call (the fused
attention kernels: vmap runs them member by member) goes through :func:`fold_call`. The default fold suits Functions whose tensor arguments all
lead with the batch (q, k, v, states, gates); a Function whose arguments hold per-member
parameters or a dimension index overrides ``fold_members`` (the short convolution keeps each
member's taps beside its block of sequences; the prefix sum folds into a new leading dimension).
Every folded call goes through :func:`fold_apply`, which makes it directly below vmap's level
(torch's own path for a Function's vmap rule, :class:`_MemberFold`, is its fallback and its
oracle in the tests).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch._C._functorch as functorch


def member_first(x: Any, dim: int | None, size: int) -> Any:
    """x with the member dimension at 0: moved there, or x repeated for each member when vmap
    holds it unbatched (a tensor shared by the members); non-tensors as they are."""
    if not isinstance(x, torch.Tensor):
        return x
    if dim is None:
        return x.unsqueeze(0).expand(size, *x.shape)
    return x.movedim(dim, 0)


def fold_members(size: int, in_dims: Sequence[int | None], args: tuple) -> tuple[tuple, Any]:
    """The default fold: each tensor's member dimension merged into its first, (G, M, ...) ->
    (G*M, ...); (the folded arguments, what ``unfold_members`` needs)."""
    folded = []
    for x, dim in zip(args, in_dims):
        x = member_first(x, dim, size)
        folded.append(x.reshape(size * x.shape[1], *x.shape[2:]).contiguous() if isinstance(x, torch.Tensor) else x)
    return tuple(folded), None


def unfold_members(size: int, outputs: Any, how: Any) -> tuple[Any, Any]:
    """The default unfold: each output tensor's first dimension split, (G*M, ...) -> (G, M, ...);
    (the outputs, their member dimensions) for vmap."""
    def split(y):
        return y.view(size, y.shape[0] // size, *y.shape[1:]) if isinstance(y, torch.Tensor) else y

    def dims(y):
        return 0 if isinstance(y, torch.Tensor) else None

    if isinstance(outputs, tuple):
        return tuple(split(y) for y in outputs), tuple(dims(y) for y in outputs)
    return split(outputs), dims(outputs)


def _active() -> bool:
    # the test torch.autograd.Function.apply makes before it hands a call over to functorch
    return torch._C._are_functorch_transforms_active()


class FoldsMembers:
    """Mixin for a torch.autograd.Function: under vmap, run it once on the members folded into its
    batch (see the module docstring). List it before torch.autograd.Function."""

    fold_members = staticmethod(fold_members)
    unfold_members = staticmethod(unfold_members)

    @classmethod
    def apply(cls, *args):
        if not _active():
            return super().apply(*args)
        return fold_apply(cls, *args)

    @classmethod
    def run_folded(cls, *args):
        """The Function itself, on the folded (plain) tensors."""
        return super(FoldsMembers, cls).apply(*args)


class _Plain:
    """A plain function of batch-leading tensors, folded as FoldsMembers folds (fold_call)."""

    fold_members = staticmethod(fold_members)
    unfold_members = staticmethod(unfold_members)

    def __init__(self, function: Callable) -> None:
        self.run_folded = function


def fold_call(function: Callable, *tensors: torch.Tensor) -> Any:
    """function(*tensors), the tensors leading with the batch (settings bound in, functools.partial):
    under vmap, one call on the members folded into that batch, where torch has no batching rule
    of its own for it (the fused attention kernels) or the rule runs member by member."""
    if not _active():
        return function(*tensors)
    return fold_apply(_Plain(function), *tensors)


# The direct fold (fold_apply) uses torch's functorch bindings, which are private: where a torch
# lacks one of them, every fold takes torch's public path (the same results, slower).
DIRECT = all(hasattr(functorch, name) for name in (
    "peek_interpreter_stack", "TransformType", "CVmapInterpreterPtr", "_unwrap_batched", "_add_batch_dim",
    "pop_dynamic_layer_stack", "push_dynamic_layer_stack"))


def fold_apply(folder: Any, *args: Any) -> Any:
    """Under vmap: ``folder.unfold_members(G, folder.run_folded(*folded), how)`` with
    ``folded, how = folder.fold_members(G, in_dims, args)``, run once below the vmap level, where
    autograd records the call on plain tensors. ``folder``: any object with those three methods
    (a FoldsMembers Function, a fold_call function, a group's own folds).

    Where vmap is the innermost transform and some argument is batched at its level (every
    folded call a group makes), the call is made here directly: the arguments unwrapped at the
    level, the stack's vmap layer popped while the fold runs, the outputs wrapped back. That is
    what torch does for _MemberFold's vmap rule (torch._functorch.autograd_function.
    custom_function_call_vmap_helper), the same operations on the same tensors, without the
    higher-order operator's dispatch around it: about 0.2 ms a call, which at d_model 8 is
    several times a small linear layer's own cost. Anything else takes torch's path."""
    interpreter = functorch.peek_interpreter_stack() if DIRECT else None
    if interpreter is None or interpreter.key() != functorch.TransformType.Vmap:
        return _MemberFold.apply(folder, *args)
    vmap_level = functorch.CVmapInterpreterPtr(interpreter)
    level, size = vmap_level.level(), vmap_level.batchSize()
    plain, in_dims = [], []
    for x in args:
        x, dim = functorch._unwrap_batched(x, level) if isinstance(x, torch.Tensor) else (x, None)
        plain.append(x)
        in_dims.append(dim)
    if all(dim is None for dim in in_dims):
        return _MemberFold.apply(folder, *args)
    saved = functorch.pop_dynamic_layer_stack()
    try:
        folded, how = folder.fold_members(size, in_dims, tuple(plain))
        outputs, out_dims = folder.unfold_members(size, folder.run_folded(*folded), how)
    finally:
        functorch.push_dynamic_layer_stack(saved)

    def wrap(y, dim):
        return y if dim is None else functorch._add_batch_dim(y, dim, level)

    if isinstance(outputs, tuple):
        return tuple(wrap(y, d) for y, d in zip(outputs, out_dims))
    return wrap(outputs, out_dims)


def transforms_active() -> bool:
    """Whether a torch.func transform (vmap) is running: where a folded call is needed."""
    return _active()


class _MemberFold(torch.autograd.Function):
    """The vmap rule of every folded call (its folder is the first argument: a FoldsMembers
    Function or a _Plain function). Only vmap calls it: ``vmap`` runs below the vmap level, where
    the call records its autograd nodes on the plain tensors, so a backward pass outside vmap
    reaches them."""

    @staticmethod
    def forward(folder, *args):
        raise RuntimeError("the member fold runs under torch.func.vmap only")

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def vmap(info, in_dims, folder, *args):
        folded, how = folder.fold_members(info.batch_size, in_dims[1:], args)
        return folder.unfold_members(info.batch_size, folder.run_folded(*folded), how)
