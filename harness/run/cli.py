"""Command-line entry: a strict pre-check, then Hydra.

Hydra reports composition errors over several lines and a stack-trace hint. A researcher who
misspelled `trainer.lr` wants one line that names the valid options, and wants it before a
model is built, so a single run is first composed here with Hydra's compose API and any error
is turned into one line (exit code 2); HYDRA_FULL_ERROR=1 shows the traceback instead. Sweeps
(`-m`) skip the pre-check: each job validates itself, and a failing job is recorded without
stopping the others.
"""
from __future__ import annotations

import sys
from pathlib import Path

from harness.config.compose import CONF_DIR, ConfigError, compose_config, with_outside_tasks
from harness.errors import in_one_line, shown



def _is_multirun(argv: list[str]) -> bool:
    return any(a in ("-m", "--multirun") for a in argv)


def _wants_hydra_only(argv: list[str]) -> bool:
    return any(a.startswith("-") and a not in ("-m", "--multirun") for a in argv)


def _run_dir_is_out_dir(argv: list[str]) -> list[str]:
    """With `out_dir=DIR` a single run keeps Hydra's own files (.hydra/, the log) in DIR too,
    rather than in a second directory under outputs/. A DIR that does not exist yet is this
    run's own: a refused run removes it again (harness.run.job.discard_refused)."""
    from harness.run import job

    keys = {a.split("=", 1)[0].lstrip("+~") for a in argv}
    given = [a.split("=", 1)[1] for a in argv if a.split("=", 1)[0] == "out_dir"]
    if "hydra.run.dir" in keys or _is_multirun(argv) or not given or given[-1] in ("", "null"):
        return argv
    if not Path(given[-1]).exists():
        job.FRESH_DIRS.add(Path(given[-1]).resolve())
    return [*argv, f"hydra.run.dir={given[-1]}"]


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not _is_multirun(argv) and not _wants_hydra_only(argv):
        # Hydra's own keys are Hydra's business, but for the search path: a user's config groups
        # (hydra.searchpath=[file://my_conf]) must be found by the pre-check too.
        overrides = [a for a in argv if not a.lstrip("+~").startswith("hydra")
                     or a.lstrip("+~").startswith("hydra.searchpath")]
        try:
            from harness.run.resources import check_resources

            check_resources(compose_config(overrides))  # a run the device cannot hold: refused here
        except ValueError as exc:
            if not in_one_line(exc):
                raise
            print(f"harness: error: {shown(exc)}", file=sys.stderr)
            raise SystemExit(2) from None

    import hydra
    from hydra.core.global_hydra import GlobalHydra

    from harness.config.schema import register

    GlobalHydra.instance().clear()  # the pre-check's compose context; hydra.main makes its own
    from harness.run.job import run_job

    register()
    argv = _run_dir_is_out_dir(argv)
    try:
        argv = with_outside_tasks(argv)  # in a sweep too: each job composes its task's schema
    except ConfigError as exc:
        print(f"harness: error: {shown(exc)}", file=sys.stderr)
        raise SystemExit(2) from None
    sys.argv = [sys.argv[0], *argv]
    hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")(run_job)()
