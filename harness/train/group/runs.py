"""A group's members as runs: each member's directory gets what its solo run would write.

``train_members(plans, out_dirs, ...)`` trains the plans as one group (group.loop.train_group,
checkpointed to one group file, stopped by SIGTERM/SIGINT as a solo run is) and then, member by
member in its own directory, does what a solo run does after its last step
(harness.train.finish.finish: the final validation and the test evaluation, the summary, the
measurements, model.pt, results.json), with its validation rows in metrics.jsonl and its
training-loss and validation rows replayed to its own logger. A member that failed a numerical
check gets a failed results.json with its fault (``fault`` and ``fault_step``), alone.

Time: the group's training is one process's, shared. A member's ``cpu_time_s`` and
``wall_time_s`` are its share of the group's training (by the steps it trained, of all the
members' steps) plus its own end-of-run work, so summing them over a sweep counts each second
once; results.json's ``group`` says the group's size, its members and its own totals.
"""
from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from harness.config.plan import RunPlan
from harness.outputs.results import METRICS_FILE, RESULTS_FILE, MetricsLog, base_results, write_json
from harness.train.evaluate import make_eval_sets
from harness.train.group.loop import Member, resumes, train_group

GROUPS_DIR = ".groups"  # under the sweep directory: one checkpoint file per group under way


def group_file(sweep_dir: Path, plans: Sequence[RunPlan]) -> Path:
    """The group's checkpoint file, named by its members' config hashes (a rerun of the same
    sweep forms the same group, and finds it)."""
    key = hashlib.sha1(" ".join(p.digest for p in plans).encode()).hexdigest()[:16]
    return Path(sweep_dir) / GROUPS_DIR / f"group-{key}.pt"


def find_resume(folder: Path, plans: Sequence[RunPlan]) -> tuple[Optional[Path], Optional[dict[str, Any]]]:
    """The group checkpoint under ``folder`` that continues these runs (group.loop.resumes), if any."""
    from harness.outputs import checkpoint

    if not folder.is_dir():
        return None, None
    for path in sorted(folder.glob("group-*.pt")):
        try:
            saved = checkpoint.load(path)
        except Exception:  # a damaged or foreign file: not ours to resume
            continue
        if resumes(saved, plans):
            return path, saved
    return None, None


def train_members(plans: Sequence[RunPlan], out_dirs: Sequence[Path], *, sweep_dir: Path,
                  ckpt_every: Optional[int] = None, stop=None) -> list[dict[str, Any]]:
    """Train ``plans`` as one group and write each member's run into its ``out_dirs`` entry (each
    claimed by the caller); each member's results, in order. A group checkpoint under
    ``sweep_dir``/.groups is written every ``ckpt_every`` steps (the members' trainer.ckpt_every
    by default) and on a stop signal, and removed once every member's results are written.
    ``stop``: the caller's StopRequest when it already holds the signals (a sweep's unit, from its
    first claim on); without one, the signals are held for the training here."""
    from harness.train.faults import StopRequest

    folder = Path(sweep_dir) / GROUPS_DIR
    found, saved = find_resume(folder, plans)
    path = found or group_file(sweep_dir, plans)
    path.parent.mkdir(parents=True, exist_ok=True)
    if saved is not None:
        print(f"[harness] group of {len(plans)}: resuming from {path} at step {saved['step']}")
    every = ckpt_every if ckpt_every is not None else int(plans[0].trainer.ckpt_every or 0)
    own = stop is None
    stop = StopRequest() if own else stop
    wall0, cpu0 = time.time(), time.process_time()
    try:
        members = train_group(plans, checkpoint=path, ckpt_every=every, resume=saved, stop=stop)
    finally:
        if own:
            stop.restore()
    train_wall, train_cpu = time.time() - wall0, time.process_time() - cpu0
    steps = sum(m.loop.step for m in members) or 1
    group = {"size": len(plans), "config_hashes": [p.digest for p in plans], "steps": max(m.loop.step for m in members),
             "train_wall_time_s": train_wall, "train_cpu_time_s": train_cpu}
    out = [finish_member(m, Path(d), {**group, "share": m.loop.step / steps})
           for m, d in zip(members, out_dirs)]
    path.unlink(missing_ok=True)
    try:
        folder.rmdir()  # the last group of the sweep leaves no folder behind
    except OSError:
        pass  # another group's file is still there
    return out


def finish_member(m: Member, out_dir: Path, group: dict[str, Any]) -> dict[str, Any]:
    """The member's run directory, as its solo run leaves it (module doc)."""
    from harness.model import label
    from harness.outputs.wandb_logger import make_logger
    from harness.train.finish import finish, report
    from harness.train.optim import autocast_factory
    from harness.train.state import Run, StepClock

    plan, tr = m.plan, m.plan.trainer
    results = base_results(plan.cfg, plan.flat, plan.digest)
    results["group"] = group
    metrics = MetricsLog(out_dir / METRICS_FILE)
    for row in m.history:
        metrics.write(row)
    if m.fault is not None:
        metrics.close()
        check = m.fault.get("check", "a numerical check")
        results.update(status="failed", fault=m.fault, fault_step=m.fault.get("step"),
                       error=f"NumericalFault: {check} failed at step {m.fault.get('step')} "
                             f"({m.plan.mcfg.name}, a member of a group of {group['size']}; the others went on)")
        write_json(out_dir / RESULTS_FILE, results)
        print(f"[harness] run failed ({results['error']}); sweep continues")
        return results
    logger = make_logger(plan.cfg.logger, dict(plan.flat), out_dir, name=f"{plan.cfg.task.name}-{plan.mcfg.name}")
    rows = sorted([(r["step"], 0, {k: v for k, v in r.items() if k != "step"}) for r in m.train_rows]
                  + [(r["step"], 1, {f"eval/{k}": v for k, v in r.items() if k != "step"}) for r in m.history],
                  key=lambda t: t[:2])
    for step, _, row in rows:
        logger.log(row, step=step)
    share_wall, share_cpu = group["share"] * group["train_wall_time_s"], group["share"] * group["train_cpu_time_s"]
    clock = StepClock()
    clock.intervals = [group["train_wall_time_s"] / group["steps"]] if group["steps"] else []  # a group step's
    device = plan.device
    eval_sets = make_eval_sets(plan.module, plan.tcfg, tr, plan.cfg.seed, device)
    r = Run(plan, out_dir, m.model, m.model, _NoWatch(), None, None, autocast_factory(device, tr.precision),
            m.loop, eval_sets, m.periodic, logger, metrics, None, results,
            started=time.time() - share_wall, cpu_started=time.process_time() - share_cpu, clock=clock)
    failed = True
    try:
        last_eval = finish(r, m.stop_reason or "max_steps")
        failed = False
    finally:
        metrics.close()
        logger.finish(failed=failed)
    report(plan.cfg, results["summary"], last_eval, out_dir, r.memory_lines, label(plan.mcfg),
           results.get("mechanism"))
    return results


class _NoWatch:
    """A member's numerical faults are the group's to find (group.watch): nothing left to check."""

    def check(self) -> None:
        return None
