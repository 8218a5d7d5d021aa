"""Claiming a run's directory in one call: where it is, the lock, fresh or resumed, its config.

`claim(cfg, flat, digest, where)` decides where the run writes (`trainer.resume`, else `out_dir`,
else Hydra's run directory; a relative path is the launch directory's, with Hydra's chdir or
without: harness.outputs.paths.user_path), creates it, takes its lock (harness.outputs.lock), and in a sweep
skips a config already finished anywhere under the sweep and sets aside the finished run of
another config that this job's number now names. A training run then finds the checkpoint it
continues from, which must belong to this config; config.yaml is written last, so a refused
claim leaves the directory as it found it (but for the lock file).
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from harness.errors import OutputError, RunError
from harness.outputs.lock import LOCK_FILE, RunDirLock
from harness.outputs.paths import launch_dir, user_path
from harness.outputs.atomic import write_text
from harness.outputs.results import RESULTS_FILE, read_results


@dataclass(frozen=True)
class Where:
    """What the caller knows of the place before the claim: Hydra's run directory, whether this is
    a job of a sweep (and the sweep's directory), and whether out_dir is new to this start (it did
    not exist before the command: a refused run removes it again)."""
    run_dir: Path | None = None
    multirun: bool = False
    sweep_dir: Path | None = None
    fresh: bool = False


@dataclass
class RunDir:
    """A claimed run directory: its path, its lock, and the checkpoint a training run continues
    from (loaded once, here); ``done``: a finished run of this config found elsewhere in the sweep
    (nothing is claimed then)."""
    path: Path
    lock: RunDirLock | None = None
    resume: dict[str, Any] | None = None
    done: Path | None = None

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()


def claim(cfg: DictConfig, flat: dict[str, Any], digest: str, where: Where) -> RunDir:
    """The run's directory, claimed; ValueError or RunError (one line) if it cannot be."""
    from harness.outputs.checkpoint import find_resume, resume_dir

    path = resume_dir(cfg) or (user_path(cfg.out_dir) if cfg.out_dir else (where.run_dir or Path("outputs/run")))
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the output directory {path}: {exc.strerror or exc}") from exc
    lock = _lock(path, where.multirun)
    try:
        if where.multirun and where.sweep_dir is not None:
            done = find_completed(where.sweep_dir, digest) if cfg.sweep.skip_completed else None
            if done is not None:
                lock.release()
                return RunDir(path, done=done)
            set_aside_other_run(path, where.sweep_dir, digest)
        # before config.yaml: a checkpoint of another config there is refused with the directory untouched
        resume = find_resume(cfg.trainer.resume, flat, digest, path) if cfg.mode == "train" else None
        write_text(path / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    except BaseException:
        lock.release()
        raise
    return RunDir(path, lock, resume)


def _lock(path: Path, multirun: bool) -> RunDirLock:
    """The lock on path, taken before anything is written there. In a sweep a job whose
    directory another process holds (a second copy of the sweep) waits for it, and says so;
    a single run refuses at once."""
    try:
        lock = RunDirLock(path)
        if lock.try_acquire():
            return lock
    except OSError as exc:
        raise OutputError(f"cannot write {path / LOCK_FILE}: {exc.strerror or exc}") from exc
    if not multirun:
        lock.release()
        raise RunError(f"{path} is in use by another harness process (pid {lock.holder()}); wait for it "
                       "to finish, or choose another out_dir")
    print(f"[harness] wait: {path} is being written by another process (pid {lock.holder()}); "
          "this job waits for it, then skips the run if it finished", flush=True)
    lock.acquire()
    return lock


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


def discard_refused(cfg: DictConfig, where: Where) -> None:
    """A refused run leaves nothing: a run directory this start made (Hydra's timestamped one, or
    an out_dir that did not exist) goes again if it holds only what this start put there (Hydra's
    .hydra/ and log, config.yaml). Any other directory is left as it was."""
    if where.run_dir is None or (cfg.out_dir and not where.fresh):
        return
    out_dir = Path(where.run_dir)
    try:
        entries = list(out_dir.iterdir())
    except OSError:
        return
    if not all(e.name in (".hydra", "config.yaml", LOCK_FILE) or e.suffix == ".log" for e in entries):
        return
    shutil.rmtree(out_dir, ignore_errors=True)
    cwd, parent = launch_dir().resolve(), out_dir.resolve().parent
    while parent != cwd and cwd in parent.parents:  # outputs/<task>-<model>/ made for it, now empty
        try:
            parent.rmdir()
        except OSError:
            break
        parent = parent.parent
