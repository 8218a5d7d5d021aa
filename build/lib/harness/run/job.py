"""One Hydra job: validate, skip if already done, dispatch on `mode`, record the outcome.

In a sweep a failing job writes a results.json with status "failed" and its error, and the
sweep goes on; `harness.run.sweep.SweepSummary` reports what failed and why at the end.
"""
from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from harness.errors import OutputError, RunError, in_one_line
from harness.outputs.results import (RESULTS_FILE, base_results, config_hash, read_results, write_json,
                             write_text)


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
    """A run directory under `root` whose results.json is ok and has this config hash."""
    for path in sorted(root.rglob(RESULTS_FILE)):
        res = read_results(path.parent)
        if res and res.get("status") == "ok" and res.get("config_hash") == digest:
            return path.parent
    return None


def dispatch(cfg: DictConfig, out_dir: Path, resume: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run cfg's mode; ``resume``: a training checkpoint already loaded from out_dir."""
    if cfg.mode == "train":
        from harness.train.loop import train

        return train(cfg, out_dir, resume=resume)
    if cfg.mode == "probe":
        from harness.run.probe_mode import probe_run

        return probe_run(cfg, out_dir)
    if cfg.mode == "cost":
        from harness.run.cost_mode import cost_run

        return cost_run(cfg, out_dir)
    raise ValueError(f"unknown mode '{cfg.mode}'")


def _output_dir(cfg: DictConfig, run_dir: Path | None) -> tuple[Path, dict[str, Any] | None]:
    """Where this run writes: `trainer.resume`, else `out_dir`, else Hydra's run directory;
    created and written to (config.yaml) before any work, so a bad place fails first. Also
    the checkpoint a training run there continues from (loaded once, here), or None."""
    from harness.outputs.checkpoint import find_resume, resume_dir

    out_dir = resume_dir(cfg) or (Path(cfg.out_dir) if cfg.out_dir else (run_dir or Path("outputs/run")))
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the output directory {out_dir}: {exc.strerror or exc}") from exc
    # before config.yaml: a checkpoint of another config there is refused with the directory untouched
    saved = find_resume(cfg, out_dir) if cfg.mode == "train" else None
    write_text(out_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    return out_dir, saved


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
    ours = all(e.name in (".hydra", "config.yaml") or e.suffix == ".log" for e in entries)
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


def _give_up(exc: BaseException, cfg: DictConfig, multirun: bool) -> dict[str, Any]:
    """A failed job: in a sweep, report it and let the sweep go on; alone, exit non-zero with
    one line (2 for bad input, 1 for a run error), or re-raise anything unexpected."""
    if multirun and not cfg.sweep.fail_on_error:
        print(f"[harness] run failed ({type(exc).__name__}: {exc}); sweep continues", file=sys.stderr)
        return {"status": "failed", "error": str(exc)}
    if in_one_line(exc):
        print(f"harness: error: {exc}", file=sys.stderr)
        raise SystemExit(2 if isinstance(exc, ValueError) else 1) from None
    raise exc


def run_job(cfg: DictConfig) -> dict[str, Any]:
    from harness.config.validate import validate_config

    run_dir, multirun, sweep_dir = _hydra_context()
    if not multirun:  # refused before anything is written (a sweep records the failure instead)
        try:
            validate_config(cfg)  # once per run: the pre-check's validation is remembered
        except ValueError as exc:
            if run_dir is not None:
                discard_refused(run_dir, cfg)
            return _give_up(exc, cfg, multirun)
    try:
        out_dir, saved = _output_dir(cfg, run_dir)
    except (ValueError, RunError) as exc:  # nowhere to record it: say it and stop (a sweep goes on)
        if not multirun and run_dir is not None and isinstance(exc, ValueError):
            discard_refused(run_dir, cfg)
        return _give_up(exc, cfg, multirun)

    if multirun and cfg.sweep.skip_completed and sweep_dir is not None:
        done = find_completed(sweep_dir, config_hash(cfg))
        if done is not None:
            print(f"[harness] skip: results for this config exist in {done}")
            return {"status": "skipped", "dir": str(done)}

    started = time.time()
    try:
        validate_config(cfg)
        if cfg.trainer.threads:  # e.g. 1 per run when a launcher runs one run per core
            import torch

            torch.set_num_threads(cfg.trainer.threads)
        return dispatch(cfg, out_dir, resume=saved)
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        failure = base_results(cfg, cfg.mode)
        failure.update(status="failed", error=f"{type(exc).__name__}: {exc}",
                       traceback=traceback.format_exc(), wall_time_s=time.time() - started,
                       **getattr(exc, "record", {}))
        try:
            write_json(out_dir / RESULTS_FILE, failure)
        except OutputError as lost:  # e.g. the disk is full: the reason still reaches the user
            print(f"[harness] {lost}", file=sys.stderr)
        return _give_up(exc, cfg, multirun)
