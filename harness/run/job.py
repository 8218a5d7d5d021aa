"""One Hydra job: its plan (harness.config.plan, its resources checked), its run directory
claimed (harness.outputs.rundir), dispatch on `mode`, the outcome recorded.

In a sweep a failing job writes a results.json with status "failed" and its error, and the
sweep goes on; `harness.run.sweep.SweepSummary` reports what failed and why at the end. A mode
other than training has no step to finish and checkpoint: SIGINT or SIGTERM stops it at once
(harness.train.faults.Stopped), in one line with exit code 130 or 143, and it writes nothing (a
single run's directory that this start made goes again).
"""
from __future__ import annotations

import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, NamedTuple

from omegaconf import DictConfig

from harness.config.digest import identify
from harness.config.plan import RunPlan, prepare
from harness.errors import (OutOfMemory, OutputError, RunError, first_line, in_one_line, is_out_of_memory,
                            refuse, shown)
from harness.outputs.results import RESULTS_FILE, base_results, write_json
from harness.outputs.rundir import RunDir, Where, claim, discard_refused
from harness.train.faults import StopRequest, Stopped


def _hydra_context(fresh: bool) -> Where:
    """Where Hydra runs us (run dir, multirun, sweep dir); ``fresh``: out_dir is new to this start."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
    except (ImportError, ValueError):
        return Where(fresh=fresh)
    multirun = hc.mode == RunMode.MULTIRUN
    return Where(Path(hc.runtime.output_dir), multirun, Path(hc.sweep.dir) if multirun else None, fresh)


def mode_function(plan: RunPlan, part: str) -> Callable[..., Any] | None:
    """The plan's mode's `run` or `ready` function (harness.config.schema.Mode), imported."""
    from harness.config.schema import MODES
    from harness.layers.registry import import_object

    path = getattr(MODES[plan.mode], part)
    return None if path is None else import_object(path, f"mode={plan.mode}")


def dispatch(plan: RunPlan, run: RunDir) -> dict[str, Any]:
    """Run the plan's mode in its claimed directory; a checkpoint to resume (found only for
    training: harness.outputs.rundir.claim) goes in as `resume=`."""
    run_mode = mode_function(plan, "run")
    return run_mode(plan, run.path) if run.resume is None else run_mode(plan, run.path, resume=run.resume)


def plan_for(cfg: DictConfig, made: RunPlan | None = None) -> RunPlan:
    """The run's plan, made ready by its mode (its resources checked; for a mode that reads a run,
    that run's identity in its hash: harness.outputs.source.derive): ``made`` (the CLI prepares a
    single run before Hydra starts it) when it is of this very config, else cfg prepared here
    (its one validation)."""
    from harness.config.validate import resolved

    if made is not None and resolved(made.cfg) == resolved(cfg):
        return replace(made, cfg=cfg)
    plan = prepare(cfg)
    ready = mode_function(plan, "ready")
    return plan if ready is None else ready(plan)


def run_job(cfg: DictConfig, plan: RunPlan | None = None, fresh: bool = False) -> dict[str, Any]:
    """One run of cfg; ``plan``: cfg's plan, when the caller made it before Hydra started;
    ``fresh``: out_dir did not exist before this start (a refused run removes it again)."""
    where = _hydra_context(fresh)
    failure = None
    try:
        try:
            plan = plan_for(cfg, plan)
        except Exception as exc:
            if not where.multirun:  # a single run is refused before anything is written
                raise
            plan, failure = None, exc  # a sweep records it in the job's directory, and goes on
        flat, digest = (plan.flat, plan.digest) if plan is not None else identify(cfg)
        run = claim(cfg, flat, digest, where)
    except (ValueError, RunError) as exc:
        return _refused(exc, cfg, where)
    if run.done is not None:
        print(f"[harness] skip: results for this config exist in {run.done}")
        return {"status": "skipped", "dir": str(run.done)}
    goes_on = where.multirun and not cfg.sweep.fail_on_error
    try:
        return run_claimed(plan, run, goes_on, failure, base_results(cfg, flat, digest))
    except Stopped as stop:  # a measurement mode stopped at once: it leaves nothing behind
        run.release()
        if not where.multirun:
            discard_refused(cfg, where)
        return _give_up(stop, goes_on)
    finally:
        run.release()


class Claimed(NamedTuple):
    """A group member's job as claim_member leaves it: planned and claimed, not yet run (its group
    trains it, answers a stop signal for it, and releases the claim)."""
    plan: RunPlan
    run: RunDir


def claim_member(cfg: DictConfig) -> dict[str, Any] | Claimed:
    """A sweep job the launcher put in a group (harness.run.grouped): its plan and its claimed
    directory (a Claimed: the caller trains it with its group and releases the claim), or, when it cannot
    join, the job dealt with here as run_job deals with it, and what run_job returns: a config
    refused (recorded), a run finished before (skipped), a run with its own checkpoint
    (resumed alone, bit for bit)."""
    where = _hydra_context(False)
    try:
        plan = plan_for(cfg)
        run = claim(cfg, plan.flat, plan.digest, where)
    except Exception:  # the failure recorded in the job's directory, as any sweep job's
        return run_job(cfg)
    if run.done is not None:
        print(f"[harness] skip: results for this config exist in {run.done}")
        return {"status": "skipped", "dir": str(run.done)}
    if run.resume is not None:
        print(f"[harness] {run.path}: resumes its own checkpoint, alone")
        try:
            return run_claimed(plan, run, not cfg.sweep.fail_on_error, None, base_results(cfg, plan.flat, plan.digest))
        finally:
            run.release()
    return Claimed(plan, run)


def run_claimed(plan: RunPlan | None, run: RunDir, goes_on: bool, failure: Exception | None,
                 record: dict[str, Any]) -> dict[str, Any]:
    """The plan's mode in its claimed directory; ``failure``: why a sweep's job has no plan,
    recorded as a failed run. ``record``: the start of its results.json; ``goes_on``: a failure
    is reported and the sweep continues."""
    started = time.time()
    stop = None
    try:
        if failure is not None:
            raise failure
        if plan.trainer.threads:  # e.g. 1 per run when a launcher runs one run per core
            import torch

            torch.set_num_threads(plan.trainer.threads)
        if plan.mode != "train":  # no step to finish and checkpoint: a stop signal ends it at once
            stop = StopRequest(at_once=f"mode={plan.mode}")
        return dispatch(plan, run)
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        mode = record["mode"]
        if is_out_of_memory(exc):  # outside the training loop (which names its step): the mode
            exc = OutOfMemory(f"out of memory in mode={mode} ({first_line(exc)}); ask for less, "
                              "or use a larger device", oom={"step": None, "error": first_line(exc, 500)})
        record.update(status="failed", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc(),
                      wall_time_s=time.time() - started, **getattr(exc, "record", {}))
        also = ""
        try:
            write_json(run.path / RESULTS_FILE, record)
        except OutputError as lost:  # e.g. the disk is full: the reason still reaches the user
            also = f"; {RESULTS_FILE} was not written either ({lost})" if str(lost) != str(exc) else ""
        return _give_up(exc, goes_on, also)
    finally:
        if stop is not None:
            stop.restore()


def _refused(exc: BaseException, cfg: DictConfig, where: Where) -> dict[str, Any]:
    """A run refused before it could record anything (a bad config, no place to write): said, and
    stopped (a sweep goes on); a single run's bad input leaves no run directory behind."""
    if not where.multirun and isinstance(exc, ValueError):
        discard_refused(cfg, where)
    return _give_up(exc, where.multirun and not cfg.sweep.fail_on_error)


def _give_up(exc: BaseException, goes_on: bool, also: str = "") -> dict[str, Any]:
    """A failed job: in a sweep (``goes_on``), report it and let the sweep go on; alone, exit
    non-zero with one line (2 for bad input, 1 for a run error), or re-raise anything unexpected.
    ``also``: what else went wrong on the way out (results.json not written), said in the same line."""
    if goes_on:
        goes_on_as = "sweep stops" if hasattr(exc, "exit_code") else "sweep continues"  # stopped by a signal
        print(f"[harness] run failed ({type(exc).__name__}: {shown(exc)}{also}); {goes_on_as}", file=sys.stderr)
        return {"status": "failed", "error": str(exc)}
    if in_one_line(exc) or isinstance(exc, Stopped):
        # a run stopped by a signal exits as the shell reports one (harness.train.faults.Interrupted, Stopped)
        refuse(f"{exc}{also}", getattr(exc, "exit_code", 2 if isinstance(exc, ValueError) else 1))
    raise exc
