"""A sweep's jobs trained in groups: the launcher side of harness.train.group.

The `processes` launcher (hydra_plugins/harness_launcher) is joblib's, with one step before the
workers start: ``plan_units`` composes every job's config, prepares its plan, and cuts the jobs
that share every setting fixing a tensor shape into groups (harness.train.group.signature); each
group is one joblib task, trained as one batched model in one worker (``execute_unit``), and
every other job is a task of its own, as before. What it says once, before the jobs start: how
many jobs train in how many groups, and why each other job trains alone.

A member is still a run: Hydra's own run_job makes its directory (with .hydra/ and its log),
harness.run.job.claim_member claims it (a run finished before is skipped, one with its own
checkpoint resumes alone, a refused config is recorded), and harness.train.group.runs writes
into it what its solo run writes. So the set of run directories, their files and their keys do
not depend on the switch: ``hydra.launcher.group=false`` trains every job alone.

The group size is bounded three ways: ``hydra.launcher.max_group``; the harness's own memory
estimate (harness.train.memory: a member's training step and evaluation, times the members, must
fit the device); and the workers: groups are cut small enough that every worker has one. On a CPU
a shape wider than ``hydra.launcher.group_max_width`` trains alone: a step there is arithmetic, and
docs/benchmarks.md measures what grouping gains by width.
"""
from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any, Optional, Sequence

from omegaconf import DictConfig, open_dict

# The `processes` launcher's defaults (its config node, hydra_plugins/harness_launcher, reads
# them from here). Members per group, at most (the memory estimate bounds it too):
MAX_GROUP = 16
# On a CPU a model wider than this trains alone: at d_model 16 a group of 16 costs about 2x less
# per run than its runs alone, at 32 the step is arithmetic and grouping buys 1.03-1.19x (a
# 4-layer hybrid 0.95-1.06x), which does not pay for rounding apart from the solo run
# (docs/benchmarks.md). None groups every width (a GPU is never limited).
GROUP_MAX_WIDTH: Optional[int] = 16


def plan_units(config: DictConfig, config_loader, job_overrides: Sequence[Sequence[str]], n_jobs: int,
               max_group: int = MAX_GROUP,
               group_max_width: Optional[int] = GROUP_MAX_WIDTH) -> tuple[list[list[int]], dict[int, str]]:
    """The sweep's jobs (by index) as units of work: groups of runs that train together, and jobs
    alone; with why each job is alone. Units keep the order of their first job."""
    from harness.config.plan import prepare
    from harness.errors import first_line
    from harness.train.group import group_plans, ungroupable
    from harness.train.group.signature import group_key

    plans, alone = {}, {}
    for i, overrides in enumerate(job_overrides):
        try:
            sweep_cfg = config_loader.load_sweep_config(config, list(overrides))
            task_cfg = copy.deepcopy(sweep_cfg)
            with open_dict(task_cfg):
                del task_cfg["hydra"]
            plan = prepare(task_cfg)
        except Exception as exc:  # its own job records why
            alone[i] = f"its config is refused ({first_line(exc)})"
            continue
        reason = ungroupable(plan) or _too_wide(plan, group_max_width)
        if reason is not None:
            alone[i] = reason
        else:
            plans[i] = plan
    index = list(plans)
    first_of_shape = {group_key(plans[i]): plans[i] for i in reversed(index)}
    # every worker gets a unit: the jobs alone take some workers, the groups share the rest
    free = n_jobs - len(alone)
    spread = math.ceil(len(index) / free) if index and free > 0 else max_group
    cap = max(1, min(max_group, spread, *(_memory_bound(p) for p in first_of_shape.values())))
    groups, apart = group_plans([plans[i] for i in index], max_size=cap)
    alone.update({index[k]: why for k, why in apart.items()})
    for g in groups:  # cut to one member so that every worker has a unit
        if len(g) == 1:
            alone[index[g[0]]] = f"its shape's groups were cut to at most {cap} so that each of the {n_jobs} workers has work"
    units = [[index[k] for k in g] for g in groups if len(g) > 1] + [[i] for i in alone]
    return sorted(units, key=lambda u: u[0]), alone


def _too_wide(plan, group_max_width: Optional[int]) -> Optional[str]:
    if group_max_width is None or plan.device.type != "cpu" or plan.mcfg.d_model <= group_max_width:
        return None
    return (f"model.d_model={plan.mcfg.d_model} is above hydra.launcher.group_max_width={group_max_width}: "
            "on a CPU a step this wide is arithmetic, and grouping gains little (docs/benchmarks.md)")


def _memory_bound(plan) -> int:
    """How many members of this shape the device holds at once (a member's training step and its
    evaluation, the harness's own estimates: harness.train.memory)."""
    from harness.devices import memory_limit
    from harness.train.memory import eval_bytes, shape_of, train_bytes

    tr = plan.trainer
    shape = shape_of(plan.mcfg, plan.stack, plan.module, plan.tcfg, tr)
    per = train_bytes(shape.facts, shape.batch, shape.train_len, shape.data_chunk) + \
        eval_bytes(shape.facts, shape.eval_lens, plan.eval_tokens or tr.eval_tokens, shape.eval_examples)
    limit, _ = memory_limit(plan.device)
    return max(1, int(limit // max(per, 1.0)))


def describe(units: list[list[int]], alone: dict[int, str], n_jobs: int) -> list[str]:
    """What the sweep says once before its jobs start."""
    groups = [u for u in units if len(u) > 1]
    grouped = sum(len(u) for u in groups)
    lines = [f"[harness] grouped training: {grouped} of {grouped + len(alone)} jobs in {len(groups)} group(s) "
             f"(sizes {', '.join(str(len(u)) for u in groups) or '-'}), {len(alone)} alone, "
             f"{n_jobs} at a time; hydra.launcher.group=false trains every job alone"]
    reasons: dict[str, list[int]] = {}
    for i, why in alone.items():
        reasons.setdefault(why, []).append(i)
    for why, jobs in reasons.items():
        shown = ", ".join(f"#{j}" for j in jobs[:8]) + (f" and {len(jobs) - 8} more" if len(jobs) > 8 else "")
        lines.append(f"[harness]   alone: {shown}: {why}")
    return lines


def execute_unit(indices: Sequence[int], overrides: Sequence[Sequence[str]], hydra_context, config: DictConfig,
                 task_function, singleton_state: dict[Any, Any]) -> list:
    """One unit in a worker: a job alone as joblib's launcher runs it, or a group (module doc): each
    member's directory made and claimed by joblib's own execute_job with claim_member as the task."""
    from hydra.core.utils import JobStatus
    from hydra_plugins.hydra_joblib_launcher._core import execute_job

    if len(indices) == 1:
        return [execute_job(indices[0], overrides[0], hydra_context, config, task_function, singleton_state)]
    from harness.run.job import Claimed, claim_member
    from harness.run.sweep import exit_if_stopped
    from harness.train.faults import StopRequest

    # From the first claim to the last member's results.json a stop signal is the unit's to answer
    # (checkpoint the group, record the stop in every member, exit): the worker's default action
    # would kill it with its members claimed and nothing said in their directories.
    stop = StopRequest()
    try:
        returns = [execute_job(idx, job, hydra_context, config, claim_member, singleton_state)
                   for idx, job in zip(indices, overrides)]
        claimed = [k for k, ret in enumerate(returns)
                   if ret.status == JobStatus.COMPLETED and isinstance(ret.return_value, Claimed)]
        if claimed:
            outs = train_claimed([returns[k].return_value for k in claimed], Path(str(config.hydra.sweep.dir)), stop)
            for k, out in zip(claimed, outs):
                returns[k].return_value = out
    finally:
        stop.restore()
    exit_if_stopped(stop.signum)  # a stopped group's worker takes no next unit
    return returns


def train_claimed(claims: list, sweep_dir: Path, stop=None) -> list[dict[str, Any]]:
    """The claimed members (harness.run.job.Claimed) trained as one group (one alone as a solo
    run), each one's outcome; a failure of the group as a whole (no member's own) is recorded in
    every member's directory. ``stop``: the unit's StopRequest, held since its first claim."""
    from harness.outputs.results import base_results
    from harness.run.job import run_claimed
    from harness.train.group.runs import train_members

    plans = [plan for plan, _ in claims]
    goes_on = not plans[0].cfg.sweep.fail_on_error
    try:
        if plans[0].trainer.threads:
            import torch

            torch.set_num_threads(plans[0].trainer.threads)
        if len(claims) == 1:
            plan, run = claims[0]
            return [run_claimed(plan, run, goes_on, None, base_results(plan.cfg, plan.flat, plan.digest))]
        try:
            return train_members(plans, [run.path for _, run in claims], sweep_dir=sweep_dir, stop=stop)
        except Exception as exc:  # the group as a whole: said in each member's results.json
            return [run_claimed(plan, run, goes_on, exc, base_results(plan.cfg, plan.flat, plan.digest))
                    for plan, run in claims]
    finally:
        for _, run in claims:
            run.release()
