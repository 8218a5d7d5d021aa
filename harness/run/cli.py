"""Command-line entry: a strict pre-check, then Hydra.

Hydra reports composition errors over several lines and a stack-trace hint. A researcher who
misspelled `trainer.lr` wants one line that names the valid options, and wants it before a
model is built, so the command is composed once before Hydra starts (harness.run.precheck, with
Hydra's compose API and Hydra's own node, which its directory and sweep-size checks read), and
every refusal is one line (harness.errors.refuse; exit code 2) unless HYDRA_FULL_ERROR=1 asks
for the traceback. For a single run that composition, less Hydra's node, is the run's config: its
plan (harness.config.plan.prepare: the one validation; then the resource check) is made here and
handed to the job Hydra starts. Sweeps (`-m`) make no plan here: each job prepares its own, and a
failing job is recorded without stopping the others.
"""
from __future__ import annotations

import sys
from pathlib import Path

from harness.config.compose import CONF_DIR, compose_config, rewrite_overrides
from harness.errors import refuse, refusing
from harness.outputs.console import keep_running_when_the_reader_leaves
from harness.outputs.paths import check_destination, user_path
from harness.run.precheck import refuse_bad_command

OVERWRITE = ("+overwrite=true", "overwrite=true")  # a finished run of another config may be replaced

def _is_multirun(argv: list[str]) -> bool:
    return any(a in ("-m", "--multirun") for a in argv)


def _wants_hydra_only(argv: list[str]) -> bool:
    return any(a.startswith("-") and a not in ("-m", "--multirun") for a in argv)


def _run_dir_is_out_dir(argv: list[str]) -> tuple[list[str], bool]:
    """With `out_dir=DIR` a single run keeps Hydra's own files (.hydra/, the log) in DIR too,
    rather than in a second directory under outputs/. A DIR that does not exist yet is this
    run's own (True beside the arguments): a refused run removes it again
    (harness.outputs.rundir.discard_refused)."""
    keys = {a.split("=", 1)[0].lstrip("+~") for a in argv}
    given = [a.split("=", 1)[1] for a in argv if a.split("=", 1)[0] == "out_dir"]
    if "hydra.run.dir" in keys or _is_multirun(argv) or not given or given[-1] in ("", "null"):
        return argv, False
    return [*argv, f"hydra.run.dir={given[-1]}"], not Path(given[-1]).exists()


def _run_overrides(argv: list[str]) -> list[str]:
    """The overrides a run's own config reads: Hydra's keys are Hydra's business, but for the
    search path (a user's config groups, hydra.searchpath=[file://my_conf])."""
    return [a for a in argv if not a.lstrip("+~").startswith("hydra") or a.lstrip("+~").startswith("hydra.searchpath")]


def run_config(composed):
    """A composition with Hydra's node (return_hydra_config) as the job sees it: a copy without
    that node, made as Hydra makes the job's (hydra.core.utils.run_job)."""
    import copy

    from omegaconf import open_dict, read_write

    cfg = copy.deepcopy(composed)
    with read_write(cfg), open_dict(cfg):
        del cfg["hydra"]
    return cfg


def _check_held(out_dir: Path) -> None:
    """A directory another harness process holds is refused before Hydra writes its .hydra/ there."""
    from harness.outputs.lock import RunDirLock

    if not (out_dir / ".harness.lock").exists():
        return
    lock = RunDirLock(out_dir)
    try:
        if lock.try_acquire():
            return
        holder = lock.holder()
    except OSError:
        return  # harness.run.job says what is wrong with the lock file
    finally:
        lock.release()
    refuse(f"{out_dir} is in use by another harness process (pid {holder}); wait for it to finish, "
           "or choose another out_dir", code=1)


def _check_finished(plan, out_dir: Path) -> None:
    """A finished run in out_dir of another config is not overwritten: refused, naming the keys
    that differ, unless `+overwrite=true`. The same config is the usual resume or rerun."""
    from harness.outputs.results import read_results

    res = read_results(out_dir)
    if not isinstance(res, dict) or res.get("status") != "ok" or res.get("config_hash") in (None, plan.digest):
        return
    old = res.get("config") if isinstance(res.get("config"), dict) else {}
    new = plan.flat
    keys = sorted(k for k in set(old) | set(new) if k != "out_dir" and old.get(k) != new.get(k))
    named = ", ".join(f"{k} ({old.get(k)!r} there, {new.get(k)!r} now)" for k in keys[:8])
    more = f" and {len(keys) - 8} more" if len(keys) > 8 else ""
    refuse(f"{out_dir} holds a finished run of another config ({named or 'its config hash'}{more}); "
            "choose another out_dir, or add +overwrite=true to replace it")


def main(argv: list[str] | None = None) -> None:
    keep_running_when_the_reader_leaves()  # `python -m harness ... | head` must not fail the run
    try:
        _main(argv)
    except KeyboardInterrupt:  # Ctrl-C where no run handles it (starting up; a second Ctrl-C in training)
        refuse("stopped by SIGINT (Ctrl-C); a training run's last checkpoint stands: run the same command "
               "again to resume", code=130)


def _main(argv: list[str] | None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    overwrite = any(a.lower() in OVERWRITE for a in argv)
    argv = [a for a in argv if a.lower() not in OVERWRITE]
    # environment switches, Hydra's directories, a sweep's size; the command's one composition
    composed = refuse_bad_command(argv)
    plan = None
    if not _is_multirun(argv) and not _wants_hydra_only(argv):
        with refusing():
            from harness.run.job import plan_for

            # the job's config is the composition without Hydra's node, as Hydra hands it to the
            # job; one that did not compose is composed again here only to say why, in one line
            cfg = run_config(composed) if composed is not None else compose_config(_run_overrides(argv), validate=False)
            # validated once, its resources checked (a run the device cannot hold is refused
            # here), and handed to the job Hydra starts
            plan = plan_for(cfg)
            cfg = plan.cfg
            if cfg.out_dir:
                out_dir = user_path(cfg.out_dir)  # the directory the run writes in, chdir or not
                check_destination("out_dir", out_dir)
                _check_held(out_dir)
                if not overwrite:
                    _check_finished(plan, out_dir)

    import hydra
    from hydra.core.global_hydra import GlobalHydra

    from harness.config.schema import register

    GlobalHydra.instance().clear()  # the pre-check's compose context; hydra.main makes its own
    from harness.run.job import run_job

    register()
    argv, fresh = _run_dir_is_out_dir(argv)
    with refusing():
        argv = rewrite_overrides(argv)  # in a sweep too: each job composes its task's schema
    sys.argv = [sys.argv[0], *argv]
    hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")(_job(run_job, plan, fresh))()


def _job(run_job, plan, fresh: bool):
    """run_job with the pre-check's plan (None for a sweep, whose jobs prepare their own) and
    whether out_dir is new to this start; Hydra reads the job's name off the wrapped function."""
    import functools

    @functools.wraps(run_job)
    def job(cfg):
        return run_job(cfg, plan, fresh)
    return job
