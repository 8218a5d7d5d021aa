"""One Hydra job: prepare its plan (harness.train.plan), skip if already done, dispatch on `mode`, record the outcome.

In a sweep a failing job writes a results.json with status "failed" and its error, and the
sweep goes on; `harness.run.sweep.SweepSummary` reports what failed and why at the end.
"""
from __future__ import annotations

import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from harness.errors import (OutOfMemory, OutputError, RunError, first_line, in_one_line, is_out_of_memory,
                            shown)
from harness.outputs.lock import LOCK_FILE, RunDirLock
from harness.outputs.results import (RESULTS_FILE, base_results, config_hash, read_results, write_json,
                             write_text)
from harness.train.plan import RunPlan, prepare


def _hydra_context() -> tuple[Path | None, bool, Path | None]:
    """(run dir, is multirun, sweep dir) from Hydra when it is running us."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
    except (ImportError, ValueError):
        return None, False, None
    multirun = hc.mode == RunMode.MULTIRUN
    return Path(hc.runtime.output_dir), multirun, Path(hc.sweep.dir) if multirun else None


def find_completed(root: Path, digest: str) -> Path | None:
    """A run directory under `root` whose results.json is ok, has this config hash and whose
    recorded files (model.pt) are whole. A damaged results.json (unreadable) or model.pt (not
    the checksum recorded) means the run is redone; the latter is said in one line."""
    from harness.outputs.checkpoint import damaged_outputs

    for path in sorted(root.rglob(RESULTS_FILE)):
        res = read_results(path.parent)
        if res and res.get("status") == "ok" and res.get("config_hash") == digest:
            why = damaged_outputs(path.parent, res)
            if why is None:
                return path.parent
            print(f"[harness] redo: {why}")
    return None


def set_aside_other_run(out_dir: Path, sweep_dir: Path, digest: str) -> Path | None:
    """A sweep rerun with a changed grid numbers its jobs anew, so job n's directory may hold
    the finished run of another config. Its files move to <sweep>/<n>-<its hash prefix> (where
    the skip check and the loader still find them) instead of being overwritten; Hydra's own
    files for this job and the lock stay. Returns the new place, or None if nothing moved."""
    res = read_results(out_dir)
    if not res or res.get("config_hash") in (None, digest):
        return None
    dest = sweep_dir / f"{out_dir.name}-{str(res['config_hash'])[:8]}"
    dest.mkdir(parents=True, exist_ok=True)
    for entry in out_dir.iterdir():
        if entry.name in (LOCK_FILE, ".hydra") or entry.suffix == ".log":
            continue
        entry.rename(dest / entry.name)
    print(f"[harness] moved: {out_dir} held the finished run of another config; it is now in {dest}")
    return dest


def dispatch(plan: RunPlan, out_dir: Path, resume: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the plan's mode; ``resume``: a training checkpoint already loaded from out_dir."""
    mode = plan.cfg.mode
    if mode == "train":
        from harness.train.loop import train

        return train(plan, out_dir, resume=resume)
    if mode == "probe":
        from harness.run.probe_mode import probe_run

        return probe_run(plan, out_dir)
    if mode == "cost":
        from harness.run.cost_mode import cost_run

        return cost_run(plan, out_dir)
    raise ValueError(f"unknown mode '{mode}'")


def plan_for(cfg: DictConfig, made: RunPlan | None = None) -> RunPlan:
    """The run's plan: ``made`` (the CLI prepares a single run before Hydra starts it) when it is
    of this very config, else cfg prepared here (its one validation)."""
    from harness.config.validate import resolved

    if made is not None and resolved(made.cfg) == resolved(cfg):
        return replace(made, cfg=cfg)
    return prepare(cfg)


def _make_output_dir(cfg: DictConfig, run_dir: Path | None) -> Path:
    """Where this run writes: `trainer.resume`, else `out_dir`, else Hydra's run directory;
    created before any work, so a bad place fails first."""
    from harness.outputs.checkpoint import resume_dir

    out_dir = resume_dir(cfg) or (Path(cfg.out_dir) if cfg.out_dir else (run_dir or Path("outputs/run")))
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the output directory {out_dir}: {exc.strerror or exc}") from exc
    return out_dir


def _claim(out_dir: Path, multirun: bool) -> RunDirLock:
    """The lock on out_dir, taken before anything is written there. In a sweep a job whose
    directory another process holds (a second copy of the sweep) waits for it, and says so;
    a single run refuses at once."""
    try:
        lock = RunDirLock(out_dir)
        if lock.try_acquire():
            return lock
    except OSError as exc:
        raise OutputError(f"cannot write {out_dir / LOCK_FILE}: {exc.strerror or exc}") from exc
    if not multirun:
        lock.release()
        raise RunError(f"{out_dir} is in use by another harness process (pid {lock.holder()}); wait for it "
                       "to finish, or choose another out_dir")
    print(f"[harness] wait: {out_dir} is being written by another process (pid {lock.holder()}); "
          "this job waits for it, then skips the run if it finished", flush=True)
    lock.acquire()
    return lock


def _write_config(cfg: DictConfig, out_dir: Path) -> dict[str, Any] | None:
    """config.yaml written into the claimed out_dir, and the checkpoint a training run there
    continues from (loaded once, here), or None."""
    from harness.outputs.checkpoint import find_resume

    # before config.yaml: a checkpoint of another config there is refused with the directory untouched
    saved = find_resume(cfg, out_dir) if cfg.mode == "train" else None
    write_text(out_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    return saved


FRESH_DIRS: set[Path] = set()  # out_dir values that did not exist before this process (harness.run.cli)


def discard_refused(run_dir: Path, cfg: DictConfig) -> None:
    """A refused run leaves nothing: a run directory this start made (Hydra's timestamped one, or
    an out_dir that did not exist) goes again if it holds only what this start put there (Hydra's
    .hydra/ and log, config.yaml). Any other directory is left as it was."""
    import shutil

    out_dir = Path(run_dir)
    if cfg.out_dir and out_dir.resolve() not in FRESH_DIRS:
        return
    try:
        entries = list(out_dir.iterdir())
    except OSError:
        return
    ours = all(e.name in (".hydra", "config.yaml", LOCK_FILE) or e.suffix == ".log" for e in entries)
    if not ours:
        return
    shutil.rmtree(out_dir, ignore_errors=True)
    cwd, parent = Path.cwd().resolve(), out_dir.resolve().parent
    while parent != cwd and cwd in parent.parents:  # outputs/<task>-<model>/ made for it, now empty
        try:
            parent.rmdir()
        except OSError:
            break
        parent = parent.parent


def _refused(exc: BaseException, cfg: DictConfig, run_dir: Path | None, multirun: bool) -> dict[str, Any]:
    """A run refused before it could record anything (a bad config, no place to write): said, and
    stopped (a sweep goes on); a single run's bad input leaves no run directory behind."""
    if not multirun and run_dir is not None and isinstance(exc, ValueError):
        discard_refused(run_dir, cfg)
    return _give_up(exc, cfg, multirun)


def _give_up(exc: BaseException, cfg: DictConfig, multirun: bool, also: str = "") -> dict[str, Any]:
    """A failed job: in a sweep, report it and let the sweep go on; alone, exit non-zero with
    one line (2 for bad input, 1 for a run error), or re-raise anything unexpected. ``also``:
    what else went wrong on the way out (results.json not written), said in the same line."""
    if multirun and not cfg.sweep.fail_on_error:
        goes_on = "sweep stops" if hasattr(exc, "exit_code") else "sweep continues"  # stopped by a signal
        print(f"[harness] run failed ({type(exc).__name__}: {shown(exc)}{also}); {goes_on}", file=sys.stderr)
        return {"status": "failed", "error": str(exc)}
    if in_one_line(exc):
        print(f"harness: error: {shown(exc)}{also}", file=sys.stderr)
        # a run stopped by a signal exits as the shell reports one (harness.train.faults.Interrupted)
        raise SystemExit(getattr(exc, "exit_code", 2 if isinstance(exc, ValueError) else 1)) from None
    raise exc


def run_job(cfg: DictConfig, plan: RunPlan | None = None) -> dict[str, Any]:
    """One run of cfg; ``plan``: cfg's plan, when the caller made it before Hydra started."""
    run_dir, multirun, sweep_dir = _hydra_context()
    try:
        if not multirun:  # refused before anything is written (a sweep records the failure instead)
            plan = plan_for(cfg, plan)
        out_dir = _make_output_dir(cfg, run_dir)
        lock = _claim(out_dir, multirun)
    except (ValueError, RunError) as exc:
        return _refused(exc, cfg, run_dir, multirun)
    try:
        return _run_claimed(cfg, plan, out_dir, run_dir, multirun, sweep_dir)
    finally:
        lock.release()


def _run_claimed(cfg: DictConfig, plan: RunPlan | None, out_dir: Path, run_dir: Path | None, multirun: bool,
                 sweep_dir: Path | None) -> dict[str, Any]:
    """``plan``: None in a sweep, whose job prepares its config here, where a failure is recorded."""
    if multirun and cfg.sweep.skip_completed and sweep_dir is not None:
        done = find_completed(sweep_dir, config_hash(cfg))
        if done is not None:
            print(f"[harness] skip: results for this config exist in {done}")
            return {"status": "skipped", "dir": str(done)}
    if multirun and sweep_dir is not None:
        set_aside_other_run(out_dir, sweep_dir, config_hash(cfg))
    try:
        saved = _write_config(cfg, out_dir)
    except (ValueError, RunError) as exc:
        return _refused(exc, cfg, run_dir, multirun)

    started = time.time()
    try:
        plan = plan or prepare(cfg)
        if cfg.trainer.threads:  # e.g. 1 per run when a launcher runs one run per core
            import torch

            torch.set_num_threads(cfg.trainer.threads)
        return dispatch(plan, out_dir, resume=saved)
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        if is_out_of_memory(exc):  # outside the training loop (which names its step): the mode
            exc = OutOfMemory(f"out of memory in mode={cfg.mode} ({first_line(exc)}); ask for less, "
                              "or use a larger device", oom={"step": None, "error": first_line(exc, 500)})
        failure = base_results(cfg, cfg.mode)
        failure.update(status="failed", error=f"{type(exc).__name__}: {exc}",
                       traceback=traceback.format_exc(), wall_time_s=time.time() - started,
                       **getattr(exc, "record", {}))
        also = ""
        try:
            write_json(out_dir / RESULTS_FILE, failure)
        except OutputError as lost:  # e.g. the disk is full: the reason still reaches the user
            also = f"; {RESULTS_FILE} was not written either ({lost})" if str(lost) != str(exc) else ""
        return _give_up(exc, cfg, multirun, also)
