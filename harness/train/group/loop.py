"""The group's step loop: G runs of one shape trained as one batched model, each still its own run.

``train_group(plans)`` builds each member as its solo run builds it, stacks them
(harness.train.group.stack) and steps them together: each member's batch from its own stream
(group.data), one vmapped forward and backward, each member's gradients clipped to its own norm
and stepped by AdamW with its own rate and schedule (group.optim). Every member is evaluated on
its own validation sets at its own `eval_every` and stops by its own rule
(harness.train.state.stop_reason, with the solo run's LoopState): a stopped member leaves the
stack with its weights as they were (frozen, never decayed), and the others go on. A member that
fails a numerical check (group.watch) is frozen at its last clean step and reported, alone.

What comes back per member (``Member``): its model with its final weights (a normal
LanguageModel: its state_dict is what a solo run saves), its LoopState, why it stopped, its
validation rows as metrics.jsonl holds them, its training-loss rows as the logger gets them, and
its fault if it failed. What a solo run does after its last step (the test evaluation, the
measurements, results.json, model.pt) is the caller's, for each member.

A group checkpoint (``checkpoint`` every ``ckpt_every`` steps) holds the stacked tensors, the
optimizer's moments, each member's loop state and records; ``resume`` continues it bit for bit.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from harness.config.plan import RunPlan
from harness.config.schema import TrainerConfig
from harness.devices import set_run_determinism
from harness.model import LanguageModel
from harness.train.evaluate import EvalSet, evaluate, make_eval_sets, periodic_sets
from harness.train.group.data import MemberBatches
from harness.train.group.optim import GroupAdamW, adamw_settings, clip_per_member, decay_split
from harness.train.group.signature import why_apart
from harness.train.group.stack import MemberStack, build_member
from harness.train.group.watch import MemberWatch
from harness.train.optim import autocast_factory, lm_loss, lr_schedule
from harness.train.state import LoopState, stop_reason

GROUP_FORMAT = 1  # of a group checkpoint


@dataclass
class Member:
    """One run of the group: its plan, its own model and evaluation sets, its loop state."""
    index: int                                # its place in the plans given
    plan: RunPlan
    model: LanguageModel                      # evaluated in place; holds its final weights at the end
    periodic: list[EvalSet]                   # its validation sets (harness.train.evaluate.periodic_sets)
    factor: Callable[[int], float]            # its learning-rate schedule (harness.train.optim.lr_schedule)
    tr: TrainerConfig                         # its trainer settings (the plan's, plain values)
    loop: LoopState = field(default_factory=LoopState)
    history: list[dict] = field(default_factory=list)      # validation rows, as metrics.jsonl holds them
    train_rows: list[dict] = field(default_factory=list)   # {"step", "train/loss", "train/lr"} every log_every
    stop_reason: Optional[str] = None         # max_steps | target_accuracy | plateau | fault
    fault: Optional[dict] = None              # {"step", "check", "member", "mixer"} of a failed member
    optimizer: Optional[dict] = None          # its AdamW moments and step count when it stopped

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def record(self) -> dict[str, Any]:
        """What a group checkpoint keeps of the member besides the stacked tensors."""
        done = self.stop_reason is not None
        return {"loop": self.loop.as_dict(), "history": self.history, "train_rows": self.train_rows,
                "stop_reason": self.stop_reason, "fault": self.fault, "optimizer": self.optimizer,
                "model": self.model.state_dict() if done else None}

    def restore(self, saved: dict[str, Any]) -> None:
        self.loop = LoopState(**saved["loop"])
        self.history, self.train_rows = list(saved["history"]), list(saved["train_rows"])
        self.stop_reason, self.fault, self.optimizer = saved["stop_reason"], saved["fault"], saved["optimizer"]
        if saved["model"] is not None:
            self.model.load_state_dict(saved["model"])


@dataclass
class Group:
    """The group under way: its members, the ones still training (in stack order), the stack."""
    members: list[Member]
    active: list[int]                 # member indices, in the stack's row order
    stack: MemberStack
    opt: GroupAdamW
    watch: MemberWatch
    batches: MemberBatches
    autocast: Callable[[], Any]
    running: torch.Tensor             # (G,) summed loss since each member's last log
    since_log: list[int]              # steps summed in running, per row
    step: int = 0
    started: float = field(default_factory=time.time)

    def rows(self, members: Sequence[Member]) -> list[int]:
        return [self.active.index(m.index) for m in members]


def _member(index: int, plan: RunPlan, dtype: Optional[torch.dtype]) -> Member:
    """A member as its solo run starts (harness.train.loop.start): the seed, its validation sets,
    its model."""
    tr = plan.trainer
    torch.manual_seed(plan.cfg.seed)
    sets = make_eval_sets(plan.module, plan.tcfg, tr, plan.cfg.seed, plan.device, split="val")
    model = build_member(plan, dtype)
    return Member(index, plan, model, periodic_sets(sets, plan.train_len), lr_schedule(tr), tr,
                  loop=LoopState(running=torch.zeros((), device=plan.device)))


def start_group(plans: Sequence[RunPlan], dtype: Optional[torch.dtype] = None,
                resume: Optional[dict[str, Any]] = None) -> Group:
    """The members built and stacked, the optimizer, the data streams (restored from ``resume``,
    a group checkpoint of the same plans in the same order)."""
    if len(plans) < 1:
        raise ValueError("a group needs at least one run")
    for i, plan in enumerate(plans):
        reason = why_apart(plans[0], plan)
        if reason is not None:
            raise ValueError(f"run {i} cannot train in this group: {reason}")
    device = plans[0].device
    set_run_determinism(device)  # as a solo run (harness.train.loop.start)
    members = [_member(i, plan, dtype) for i, plan in enumerate(plans)]
    if resume is not None:
        _check_resume(resume, plans)
        for m, saved in zip(members, resume["members"]):
            m.restore(saved)
    active = list(resume["active"]) if resume is not None else [m.index for m in members]
    stack = MemberStack([members[i].model for i in active])
    lead = members[active[0]]
    tr = lead.plan.trainer
    opt = GroupAdamW(stack.flat, decay_split(lead.model, tr, stack.slots), [members[i].tr.weight_decay for i in active],
                     **adamw_settings(lead.model, tr))
    step = int(resume["step"]) if resume is not None else 0
    g = Group(members, active, stack, opt, MemberWatch(stack.skeleton, len(active), device),
              MemberBatches({i: members[i].plan for i in active}, start=step),
              autocast_factory(device, tr.precision), torch.zeros(len(active), device=device),
              [0] * len(active), step=step)
    if resume is not None:
        _restore(g, resume)
    return g


def train_group(plans: Sequence[RunPlan], *, dtype: Optional[torch.dtype] = None,
                checkpoint: Optional[Path] = None, ckpt_every: Optional[int] = None,
                resume: Optional[dict[str, Any]] = None,
                on_step: Optional[Callable[[int, Group], None]] = None, stop=None) -> list[Member]:
    """Train the plans' runs as one group (they share a shape: harness.train.group.signature);
    each member's outcome, in the order of ``plans``.

    ``dtype``: the members' parameters (None: as built, float32; float64 for equality tests).
    ``checkpoint``: the group checkpoint's file, written every ``ckpt_every`` steps; ``resume``:
    such a checkpoint, loaded (harness.outputs.checkpoint.load), to continue from.
    ``on_step(step, group)``: after each step, before its evaluations (the bench times with it).
    ``stop``: a harness.train.faults.StopRequest; once it is requested, the group checkpoints
    the step it is at (all its evaluations done) and raises its Interrupted, as a solo run does.
    With a ``checkpoint`` file the group also saves itself once every member has stopped, so a
    start killed while its members' results are written reads their final state back
    (finished_members) instead of training again.
    """
    if resume is not None and not resume["active"]:
        return finished_members(plans, resume, dtype)
    g = start_group(plans, dtype, resume)
    while g.active:
        _step(g)
        stopped = _after_step(g, on_step)
        if stopped:
            _leave(g, stopped)
        if checkpoint is None:
            continue
        if not g.active or (ckpt_every and g.step % ckpt_every == 0) or (stop is not None and stop.requested):
            save_group(g, checkpoint)
        if stop is not None and stop.requested and g.active:
            raise stop.stopped(g.step, checkpoint)
    return g.members


def finished_members(plans: Sequence[RunPlan], saved: dict[str, Any],
                     dtype: Optional[torch.dtype] = None) -> list[Member]:
    """The members of a group checkpoint saved after its last member stopped, for ``plans`` (any of
    its runs, by config hash, in any order): each as it ended, weights, loop state and records."""
    by_digest = {d: rec for d, rec in zip(saved["digests"], saved["members"])}
    missing = [p.digest for p in plans if p.digest not in by_digest]
    if saved["active"] or missing:
        raise ValueError("the group checkpoint does not hold these runs finished")
    members = [_member(i, plan, dtype) for i, plan in enumerate(plans)]
    for m in members:
        m.restore(by_digest[m.plan.digest])
    return members


def _step(g: Group) -> None:
    """One optimizer step of every active member."""
    active = [g.members[i] for i in g.active]
    inputs, positions, targets = g.batches.next(g.active)
    with g.watch.forward_pass(), g.autocast():
        losses = g.stack.losses(lm_loss, inputs, positions, targets)  # (G,)
    g.stack.flat.grad = None
    losses.sum().backward()  # the members are independent: each gets its own loss's gradient
    g.step += 1
    norms = clip_per_member(g.stack.flat.grad, [m.tr.grad_clip for m in active])
    clean = g.watch.record(g.step, losses.detach(), norms)
    lrs = [m.tr.lr * m.factor(g.step - 1) for m in active]  # LambdaLR's rate of this step
    g.opt.step(g.stack.flat, lrs, clean)
    g.running += losses.detach()
    g.since_log = [n + 1 for n in g.since_log]


def _after_step(g: Group, on_step) -> list[tuple[Member, str]]:
    """The step's logging, faults and evaluations, in a solo run's order; the members that stop
    after this step, with why."""
    step, active = g.step, [g.members[i] for i in g.active]
    logging = [m for m in active if step % m.tr.log_every == 0 or step == m.tr.max_steps]
    evaluating = [m for m in active if step % m.tr.eval_every == 0 or step == m.tr.max_steps]
    stopped: dict[int, str] = {}
    for m in active:
        m.loop.step = step
    if logging or evaluating:  # a host sync: read the members' faults with it
        for row, fault in g.watch.faults().items():
            m = active[row]
            m.fault = {**fault, "member": m.index, "mixer": m.plan.mcfg.name}
            m.loop.step = fault["step"] - 1  # its weights are its last clean step's
            stopped[m.index] = "fault"
    if logging:
        _log_losses(g, [m for m in logging if m.index not in stopped])
    if on_step is not None:
        on_step(step, g)
    for m in evaluating:
        if m.index in stopped:
            continue
        why = _evaluate_member(g, m)
        if why is not None or step == m.tr.max_steps:
            stopped[m.index] = why if why is not None and step < m.tr.max_steps else "max_steps"
    for m in active:
        if m.index not in stopped and step >= m.tr.max_steps:
            stopped[m.index] = "max_steps"
    return [(g.members[i], why) for i, why in stopped.items()]


def _log_losses(g: Group, members: list[Member]) -> None:
    """Each logging member's mean training loss since its last log (one read for all)."""
    rows = g.rows(members)
    means = (g.running[rows] / torch.tensor([g.since_log[r] for r in rows], device=g.running.device)).tolist()
    for m, row, loss in zip(members, rows, means):
        m.loop.last_loss = loss
        m.train_rows.append({"step": g.step, "train/loss": loss,
                             "train/lr": m.tr.lr * m.factor(g.step)})  # LambdaLR's get_last_lr
        g.running[row] = 0.0
        g.since_log[row] = 0


def _evaluate_member(g: Group, m: Member) -> Optional[str]:
    """The member's validation evaluation of this step (a solo run's _evaluate_val): its row, its
    plateau state; why it stops after it, or None."""
    loop, tr, step = m.loop, m.tr, g.step
    g.stack.load_member(g.active.index(m.index), m.model)
    tokens = m.plan.eval_tokens or m.plan.trainer.eval_tokens
    loop.last_eval = evaluate(m.model, m.periodic, g.autocast, tokens=tokens)
    loop.eval_step = step
    m.history.append({"step": step, "time_s": time.time() - g.started, "split": "val",
                      "accuracy": loop.last_eval["accuracy"], "loss": loop.last_eval["loss"],
                      **{f"accuracy/{p['name']}": p["accuracy"] for p in loop.last_eval["settings"]}})
    loop.record_eval(step, loop.last_eval["accuracy"], loop.last_eval["loss"], tr.min_delta)
    return stop_reason(loop, loop.last_eval, step, tr.target_accuracy, tr.patience, tr.min_steps)


def _leave(g: Group, stopped: list[tuple[Member, str]]) -> None:
    """The stopped members leave the stack: their weights and moments read out as they are."""
    for m, why in stopped:
        row = g.active.index(m.index)
        g.stack.load_member(row, m.model)
        m.optimizer = g.opt.member_state(row, g.stack.split)
        m.stop_reason = why
        g.batches.drop(m.index)
    gone = {m.index for m, _ in stopped}
    rows = [r for r, i in enumerate(g.active) if i not in gone]
    g.active = [g.active[r] for r in rows]
    if not rows:
        return
    g.stack.keep(rows)
    g.opt.keep(rows)
    g.watch.keep(rows)
    g.running = g.running[torch.tensor(rows, device=g.running.device)]
    g.since_log = [g.since_log[r] for r in rows]


# ----- group checkpoints -------------------------------------------------------------------------

def save_group(g: Group, path: Path) -> None:
    """The group's state at this step, written atomically (harness.outputs.checkpoint.save)."""
    from harness.outputs import checkpoint

    checkpoint.save(path, {
        "format": GROUP_FORMAT, "step": g.step, "digests": [m.plan.digest for m in g.members],
        "active": g.active, "stack": g.stack.state(), "optimizer": g.opt.state_dict(),
        "first": g.watch.first, "running": g.running, "since_log": g.since_log,
        "members": [m.record() for m in g.members], "rng": checkpoint.rng_state(),
        "elapsed_s": time.time() - g.started})


def _check_resume(saved: dict[str, Any], plans: Sequence[RunPlan]) -> None:
    if not resumes(saved, plans):
        raise ValueError("the group checkpoint belongs to other runs (their config hashes differ, or their "
                         f"order), or is not of format {GROUP_FORMAT}")


def resumes(saved: dict[str, Any], plans: Sequence[RunPlan]) -> bool:
    """Whether a group checkpoint continues exactly these runs: the same config hashes in the same
    order, or (once every member stopped) a set that holds them all."""
    if saved.get("format") != GROUP_FORMAT:
        return False
    digests = [p.digest for p in plans]
    if not saved["active"]:
        return set(digests) <= set(saved["digests"])
    return list(saved["digests"]) == digests


def _restore(g: Group, saved: dict[str, Any]) -> None:
    from harness.outputs import checkpoint

    g.stack.restore(saved["stack"])
    g.opt.load_state_dict(saved["optimizer"])
    g.watch.first = saved["first"].to(g.watch.first.device)
    g.running = saved["running"].to(g.running.device)
    g.since_log = list(saved["since_log"])
    g.started -= float(saved["elapsed_s"])
    checkpoint.set_rng_state(saved["rng"])
