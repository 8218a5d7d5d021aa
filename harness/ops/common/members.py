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
``apply`` is the Function's own. The default fold suits Functions whose tensor arguments all
lead with the batch (q, k, v, states, gates); a Function whose arguments hold per-member
parameters or a dimension index overrides ``fold_members`` (the short convolution folds the
members into its channels; the prefix sum into a new leading dimension).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch


def member_first(x: Any, dim: int | None, size: int) -> Any:
    """x with the member dimension at 0: moved there, or x repeated for each member when vmap
    holds it unbatched (a tensor shared by the members); non-tensors as they are."""
    if not isinstance(x, torch.Tensor):
        return x
    if dim is None:
        return x.unsqueeze(0).expand(size, *x.shape)
    return x.movedim(dim, 0)


class FoldsMembers:
    """Mixin for a torch.autograd.Function: under vmap, run it once on the members folded into its
    batch (see the module docstring). List it before torch.autograd.Function."""

    @classmethod
    def apply(cls, *args):
        # the same test torch.autograd.Function.apply makes before it hands over to functorch
        if not torch._C._are_functorch_transforms_active():
            return super().apply(*args)
        return _MemberFold.apply(cls, *args)

    @staticmethod
    def fold_members(size: int, in_dims: Sequence[int | None], args: tuple) -> tuple[tuple, Any]:
        """(the arguments with the members folded in, what ``unfold_members`` needs). Default: each
        tensor's member dimension merged into its first, (G, M, ...) -> (G*M, ...)."""
        folded = []
        for x, dim in zip(args, in_dims):
            x = member_first(x, dim, size)
            folded.append(x.reshape(size * x.shape[1], *x.shape[2:]).contiguous() if isinstance(x, torch.Tensor) else x)
        return tuple(folded), None

    @staticmethod
    def unfold_members(size: int, outputs: Any, how: Any) -> tuple[Any, Any]:
        """(the outputs with the members apart again, their member dimensions) for vmap: default,
        each tensor's first dimension split, (G*M, ...) -> (G, M, ...)."""
        def split(y):
            return y.view(size, y.shape[0] // size, *y.shape[1:]) if isinstance(y, torch.Tensor) else y

        def dims(y):
            return 0 if isinstance(y, torch.Tensor) else None

        if isinstance(outputs, tuple):
            return tuple(split(y) for y in outputs), tuple(dims(y) for y in outputs)
        return split(outputs), dims(outputs)


class _MemberFold(torch.autograd.Function):
    """The vmap rule of every FoldsMembers Function (its class is the first argument). Only vmap
    calls it: ``vmap`` runs below the vmap level, where the Function's own apply records its
    autograd node on the plain tensors, so a backward pass outside vmap reaches its backward."""

    @staticmethod
    def forward(fn, *args):
        raise RuntimeError(f"{fn.__name__}: the member fold runs under torch.func.vmap only")

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def vmap(info, in_dims, fn, *args):
        folded, how = fn.fold_members(info.batch_size, in_dims[1:], args)
        outputs = super(FoldsMembers, fn).apply(*folded)
        return fn.unfold_members(info.batch_size, outputs, how)
