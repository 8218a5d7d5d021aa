"""What the command line checks before Hydra starts, each refusal one line (exit code 2).

Hydra creates its run or sweep directory, and expands a sweep's grid, before a job of ours
runs: a directory it cannot create (a read-only mount, a path through a file, characters its
override grammar does not take unquoted) ends in its traceback, and a grid of a million jobs
is expanded in silence for minutes. So the command line checks first:

- the environment switches (harness.env), before anything reads them;
- `hydra.run.dir` (a run) or `hydra.sweep.dir` (a sweep), as given or as the config sets it,
  as `out_dir` is checked (harness.outputs.paths.check_destination): a place that can be a
  directory, with names the file system takes, that can be written, outside the package's config;
- the number of jobs a sweep expands to, against `sweep.max_jobs` (harness/conf/config.yaml),
  counted from the grid's description (a range is never expanded to be counted).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from harness.env import check_switches
from harness.outputs.paths import check_destination

DIR_KEYS = ("hydra.run.dir", "hydra.sweep.dir")
MULTIRUN = ("-m", "--multirun")


class PrecheckError(ValueError):
    """A command line refused before Hydra starts; its message is one line."""


def refuse_bad_command(argv: list[str]):
    """check_command, a refusal printed as one line with exit code 2 (HYDRA_FULL_ERROR=1: the
    traceback); a command for Hydra itself (--help, --cfg job) is left to it (None). Returns
    the config it composed (Hydra's node included), None where it does not compose."""
    from harness.errors import refusing

    if any(a.startswith("-") and a not in MULTIRUN for a in argv):
        return None
    with refusing():
        return check_command([a for a in argv if a not in MULTIRUN], any(a in MULTIRUN for a in argv))


def check_command(overrides: list[str], multirun: bool):
    """Every check of this module on a command line's overrides; returns the config composed for
    them (Hydra's node included: the command's one composition), None where it does not compose."""
    check_switches()
    parsed = _parse(overrides)
    cfg = _compose(parsed)
    if cfg is None:
        return None  # a config that does not compose is reported, in one line, by what runs next
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    given = {o.key_or_group for o in parsed if not o.is_sweep_override()}
    if multirun or key in given or "out_dir" not in given or not cfg.out_dir:
        # a single run with out_dir runs there (harness.run.cli), checked as out_dir
        check_destination(key, _dir_of(cfg, key))
    if multirun:
        check_sweep_size(_grid(cfg, parsed), int(cfg.sweep.max_jobs))
    # an override that did not parse was left out of this composition: it is not the command's,
    # and what runs next composes again to say why, in one line
    return cfg if len(parsed) == len(overrides) else None


def check_sweep_size(grid: dict[str, Any], max_jobs: int) -> None:
    """PrecheckError when the grid (key -> override value) expands to more than max_jobs jobs."""
    counts = {key: _values_in(key, value) for key, value in grid.items()}
    jobs = math.prod(counts.values())
    if jobs > max_jobs:
        widest = ", ".join(f"{k} ({n:,})" for k, n in sorted(counts.items(), key=lambda kv: -kv[1])[:3])
        raise PrecheckError(f"this sweep expands to {jobs:,} jobs (values per key: {widest}), more than "
                            f"sweep.max_jobs={max_jobs:,}; narrow the grid, or add sweep.max_jobs={jobs} to run it")


def _parse(argv: list[str]) -> list:
    """The overrides Hydra will read; a directory key its grammar refuses is a PrecheckError, any
    other unreadable override is left for Hydra to report."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    parsed = []
    for arg in argv:
        try:
            parsed.extend(parser.parse_overrides([arg]))
        except Exception as exc:
            key, _, value = arg.partition("=")
            if key.lstrip("+~") in DIR_KEYS:
                odd = sorted({c for c in value if not c.isascii()})
                hint = (f"characters such as {''.join(odd)!r} must be quoted: {key}='{value}'" if odd
                        else str(exc).strip().splitlines()[0])
                raise PrecheckError(f"bad value for '{key.lstrip('+~')}': {hint}") from None
    return parsed


def _compose(parsed: list):
    """The config with Hydra's own node, composed from the overrides that are not sweeps; None
    when it does not compose."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from harness.config.compose import CONF_DIR, rewrite_overrides
    from harness.config.schema import register

    register()
    plain = rewrite_overrides([o.input_line for o in parsed if not o.is_sweep_override()])
    if not GlobalHydra.instance().is_initialized():
        initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3")
    try:
        return compose(config_name="config", overrides=plain, return_hydra_config=True)
    except Exception:
        return None


def _dir_of(cfg, key: str) -> Path:
    """The directory `key` names; where it cannot be resolved yet (an interpolation of a job's
    own values), the fixed part before the first interpolation."""
    from omegaconf import OmegaConf

    try:
        return Path(str(OmegaConf.select(cfg, key, throw_on_resolution_failure=True)))
    except Exception:
        raw = OmegaConf.to_container(OmegaConf.select(cfg, key.rsplit(".", 1)[0]), resolve=False)
        return Path(str(raw[key.rsplit(".", 1)[1]]).split("${")[0] or ".")


def _grid(cfg, parsed: list) -> dict[str, Any]:
    """The sweep's grid: the config's hydra.sweeper.params, then the command line's sweeps."""
    from omegaconf import OmegaConf

    params = OmegaConf.to_container(cfg.hydra.sweeper.params, resolve=False) if cfg.hydra.sweeper.get("params") else {}
    grid = {str(k): str(v) for k, v in (params or {}).items()}
    grid.update({o.key_or_group: o.input_line.partition("=")[2] for o in parsed if o.is_sweep_override()})
    return grid


def _values_in(key: str, value: str) -> int:
    """How many values one swept key takes, from its description: a range is counted, never
    expanded; a sweep this cannot count (glob, interval) counts as one."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, RangeSweep

    try:
        override = OverridesParser.create().parse_overrides([f"{key}={value}"])[0]
    except Exception:
        return 1
    sweep = override.value()
    if isinstance(sweep, ChoiceSweep):
        return len(sweep.list)
    if isinstance(sweep, RangeSweep) and sweep.step:
        return max(0, math.ceil((sweep.stop - sweep.start) / sweep.step))
    return 1
