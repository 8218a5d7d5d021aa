"""Grouped training: runs of one shape (differing in seed, rate, or task settings that fix no
shape) trained as one batched model, each member still its own run.

  signature  which runs can share a group (shape_signature, why_apart, group_plans)
  stack      the members' models as one: stacked parameters under vmap(functional_call)
  data       each member's batches from its own stream, stacked
  optim      per-member clipping and AdamW over the stacked parameters, with a freezing mask
  watch      each member's numerical faults, found on the device
  loop       train_group: the step loop, evaluation and stopping per member, group checkpoints

The chunk Functions and fused CPU kernels take the members folded into their batch
(harness.ops.common.members).
"""
from harness.train.group.loop import Member, train_group
from harness.train.group.signature import group_plans, shape_signature, ungroupable, why_apart

__all__ = ["Member", "group_plans", "shape_signature", "train_group", "ungroupable", "why_apart"]
