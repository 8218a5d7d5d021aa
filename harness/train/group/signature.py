"""Which runs can train as one group: the shape signature of a run's plan, and why two cannot.

Members of a group are one skeleton module run over stacked tensors (harness.train.group.stack),
so they share every model setting (the skeleton's, shapes or not: eps, form, the feature map),
and every setting that fixes a tensor shape of the training step: the task's vocabulary, the
training length, the learned positions' table, the batch size, the precision, the device, and
the torch threads of the process they share. What may differ: the seed (initialisation and data),
the learning rate and its schedule, weight decay, clipping, the task's settings that fix no shape
(the number of pairs where the length is set, a mixture's weights), evaluation and stopping.

Some runs train alone whatever the others are (``ungroupable``): dropout (its draws come from one
process-wide stream, a member's would not be its solo run's), torch.compile, a form other than
the chunk form, a run resuming its own checkpoint, and an outside mixer whose trial step shows that
vmap does not batch it (harness.train.group.trial).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from harness.config.plan import RunPlan
from harness.layers import registry

# Settings of the trainer that fix a tensor shape of the step, or the process the members share
TRAINER_KEYS = ("trainer.batch_size", "trainer.precision", "trainer.threads")


def shape_signature(plan: RunPlan) -> dict[str, Any]:
    """Everything two runs must share to train in one group, by name (prepare(cfg) makes the plan)."""
    sig: dict[str, Any] = {k: v for k, v in plan.flat.items() if k.startswith("model.")}
    sig["task.name"] = plan.cfg.task.name
    sig["vocabulary"] = plan.tcfg.vocab_size
    sig["training length"] = plan.train_len
    # the learned positions' table has a row per position of the longest evaluated sequence
    sig["learned positions"] = plan.max_len if plan.stack.learned_positions else None
    sig.update({k: plan.flat[k] for k in TRAINER_KEYS})
    sig["device"] = str(plan.device)
    return sig


def ungroupable(plan: RunPlan) -> Optional[str]:
    """Why this run trains alone whatever the others are, or None."""
    cfg, mcfg = plan.cfg, plan.mcfg
    if cfg.mode != "train":
        return f"mode={cfg.mode}: only training runs are grouped"
    if plan.trainer.resume:
        return "trainer.resume: a run resuming its own checkpoint trains alone"
    if plan.trainer.compile:
        return "trainer.compile=true: a group runs its members through vmap, not a compiled model"
    if mcfg.dropout > 0:
        return (f"model.dropout={mcfg.dropout}: dropout draws from one process-wide stream, so a member's "
                "masks would not be its solo run's")
    if mcfg.form != "chunk":
        return f"model.form={mcfg.form}: a group trains the chunk form (its denominators are checked per member)"
    outside = [slot.name for slot in plan.stack.slots if registry.is_dotted(slot.name)]
    if outside:  # its code is not known to batch: a trial step says (harness.train.group.trial)
        from harness.train.group.trial import batching_trial

        return batching_trial(plan, outside[0], group_key(plan))
    return None


def _hashable(value: Any) -> Any:
    return repr(value) if isinstance(value, (list, dict)) or hasattr(value, "items") else value


def group_key(plan: RunPlan) -> tuple:
    """The shape signature as a hashable key: runs with equal keys can share a group."""
    return tuple((k, _hashable(v)) for k, v in shape_signature(plan).items())


def differences(a: RunPlan, b: RunPlan) -> list[str]:
    """The signature entries in which two runs differ, each as `name: a vs b`."""
    sa, sb = shape_signature(a), shape_signature(b)
    return [f"{k}: {sa.get(k)!r} vs {sb.get(k)!r}" for k in dict.fromkeys([*sa, *sb])
            if _hashable(sa.get(k)) != _hashable(sb.get(k))]


def why_apart(a: RunPlan, b: RunPlan) -> Optional[str]:
    """Why two runs cannot share a group, in words, or None when they can."""
    for plan in (a, b):
        reason = ungroupable(plan)
        if reason is not None:
            return reason
    found = differences(a, b)
    return f"they differ in {'; '.join(found)}" if found else None


def group_plans(plans: Sequence[RunPlan], max_size: Optional[int] = None) -> tuple[list[list[int]], dict[int, str]]:
    """The runs (by index) that train together, in near-equal groups of at most ``max_size`` (the
    memory bound) in the order given, and each run that trains alone with the reason: its own,
    or what keeps it apart from the run nearest to it in shape."""
    buckets: dict[tuple, list[int]] = {}
    alone: dict[int, str] = {}
    for i, plan in enumerate(plans):
        reason = ungroupable(plan)
        if reason is not None:
            alone[i] = reason
        else:
            buckets.setdefault(group_key(plan), []).append(i)
    groups: list[list[int]] = []
    for members in buckets.values():
        if len(members) == 1:
            alone[members[0]] = _nearest(plans, members[0], alone)
        elif max_size is not None and max_size < 2:
            alone.update({i: f"a group of at most {max_size} run (the size bound: memory, or the workers)"
                          for i in members})
        else:  # cut into near-equal parts: none left over alone
            parts = -(-len(members) // (max_size or len(members)))
            cuts = [round(k * len(members) / parts) for k in range(parts + 1)]
            groups.extend(members[cuts[k]:cuts[k + 1]] for k in range(parts))
    return groups, alone


def _nearest(plans: Sequence[RunPlan], i: int, alone: dict[int, str]) -> str:
    """Why run i has no partner: its differences from the groupable run nearest to it in shape."""
    others = [j for j in range(len(plans)) if j != i and j not in alone]
    if not others:
        return "no other run shares its shape"
    j = min(others, key=lambda j: len(differences(plans[i], plans[j])))
    return f"no other run shares its shape (nearest, run {j}: {why_apart(plans[i], plans[j])})"
