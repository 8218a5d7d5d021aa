"""wandb sweep files, written at use from the paper experiments, validated offline, expanded into
the commands an agent runs.

    python -m harness.run.wandb_sweeps mqar [--out sweeps]     # writes sweeps/mqar.yaml
    wandb sweep sweeps/mqar.yaml && wandb agent <sweep-id>     # agents on many machines

A file is written when it is used, from the experiment as it stands (its mixers are the
registry's of the moment, harness.config.mixers), so none is kept in the repository to drift.
The agent builds every command with wandb's own `create_sweep_command_args`, which is what
`expand` uses too, so what is checked here is what an agent will run. No wandb server is needed
for either.

Each file is the paper profile's experiment file and nothing else (`from_experiment`): the agent
passes `+experiment=paper/<name>`, which fixes every setting, and one value of each key the
experiment's sweeper grids, and logs to wandb online. So a sweep on many machines runs the same
protocol and mixers as `python -m harness -m +experiment=paper/<name>`.
"""
from __future__ import annotations

import argparse
import functools
import itertools
import sys
from pathlib import Path
from typing import Any

import yaml

from harness.conf import CONF_DIR

OUT_DIR = Path("sweeps")  # beside the user's runs; never inside the package (conf/ is Hydra's)
HEADER = ("# Written by `python -m harness.run.wandb_sweeps {name}` from harness/conf/experiment/paper/{name}.yaml.\n"
          "# Run with `wandb sweep` and `wandb agent`; write it again after the experiment changes.\n")
METHODS = ("grid", "random", "bayes")
PARAM_KEYS = ("value", "values", "distribution", "min", "max", "mu", "sigma", "q", "probabilities")


@functools.cache
def swept() -> tuple[str, ...]:
    """The paper experiments that run as wandb sweeps: every one but those of mode=cost, whose
    timings are only comparable when they come from one machine."""
    from harness.config.compose import compose_experiment

    names = sorted(p.stem for p in (CONF_DIR / "experiment" / "paper").glob("*.yaml"))
    return tuple(n for n in names if compose_experiment(f"paper/{n}").mode != "cost")


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(Path(path).read_text())


def validate(sweep: dict[str, Any]) -> list[str]:
    """Problems with a sweep config (empty list: valid)."""
    errors = []
    if sweep.get("method") not in METHODS:
        errors.append(f"method must be one of {', '.join(METHODS)}, got {sweep.get('method')!r}")
    params = sweep.get("parameters")
    if not isinstance(params, dict) or not params:
        errors.append("parameters must be a non-empty mapping")
        params = {}
    for name, spec in params.items():
        if not isinstance(spec, dict) or not any(k in spec for k in PARAM_KEYS):
            errors.append(f"parameter {name!r} needs one of value/values/distribution")
        elif "values" in spec and (not isinstance(spec["values"], list) or not spec["values"]):
            errors.append(f"parameter {name!r}: values must be a non-empty list")
        if sweep.get("method") == "grid" and isinstance(spec, dict) and "distribution" in spec:
            errors.append(f"parameter {name!r}: a grid sweep needs value/values, not a distribution")
    metric = sweep.get("metric")
    if sweep.get("method") == "bayes" and not metric:
        errors.append("a bayes sweep needs a metric")
    if metric is not None and (not isinstance(metric, dict) or "name" not in metric
                               or metric.get("goal", "maximize") not in ("maximize", "minimize")):
        errors.append("metric must be {name: ..., goal: maximize|minimize}")
    command = sweep.get("command")
    if not isinstance(command, list) or "${args_no_hyphens}" not in command:
        errors.append("command must be a list passing ${args_no_hyphens} to python -m harness")
    elif "harness" not in command:
        errors.append("command must run `python -m harness`")
    return errors


def expand(sweep: dict[str, Any]) -> list[list[str]]:
    """Every run of a grid sweep as the list of Hydra overrides an agent would pass."""
    from wandb.sdk.launch.sweeps.utils import create_sweep_command_args

    names = list(sweep["parameters"])
    choices = [spec["values"] if "values" in spec else [spec["value"]]
               for spec in sweep["parameters"].values()]
    runs = []
    for combo in itertools.product(*choices):
        args = {name: {"value": value} for name, value in zip(names, combo)}
        runs.append(create_sweep_command_args({"args": args})["args_no_hyphens"])
    return runs


def _sweep_value(override: str) -> Any:
    """A grid value as the sweep file holds it: as YAML reads it (numbers stay numbers), except a
    value with a mapping inside (a hybrid slot {name: softmax, rotary: true}), which an agent would
    pass as Python's repr, a spelling Hydra cannot parse: that one stays the override's own text."""
    value = yaml.safe_load(override)

    def has_mapping(v) -> bool:
        return isinstance(v, dict) or (isinstance(v, list) and any(has_mapping(x) for x in v))
    return override if has_mapping(value) else value


def from_experiment(name: str) -> dict[str, Any]:
    """The wandb grid sweep of the paper experiment `name`: `+experiment=paper/<name>` fixes
    every setting, the experiment's sweeper grid becomes the sweep's values (each value as YAML
    reads it), and runs log to wandb online."""
    from harness.config.compose import compose_experiment, experiment_grid

    full = f"paper/{name}"
    mode = compose_experiment(full).mode
    params: dict[str, Any] = {"+experiment": {"value": full}}
    for key, values in experiment_grid(full).items():
        params[key] = {"values": [_sweep_value(v) for v in values]}
    params.update({"logger": {"value": "wandb"}, "logger.mode": {"value": "online"}})
    sweep: dict[str, Any] = {"name": name, "program": "harness", "method": "grid"}
    if mode == "train":
        sweep["metric"] = {"name": "accuracy", "goal": "maximize"}
    return {**sweep, "parameters": params, "command": ["python", "-m", "harness", "${args_no_hyphens}"]}


def write(names=None, directory: Path = OUT_DIR) -> list[Path]:
    """Write the sweep file of each experiment of ``names`` (default: every one of `swept`)
    into ``directory`` from its paper experiment (`from_experiment`); returns the paths. The
    folder is checked first (harness.outputs.paths.check_destination: never the package's config
    folder, whose experiment files these would replace; a place that can be a folder and be
    written), and each file is written whole or not at all (a full disk leaves the old one):
    DestinationError or OutputError, one line, otherwise."""
    from harness.outputs.paths import check_destination
    from harness.outputs.atomic import write_text

    directory = Path(directory)
    check_destination("--out", directory)
    paths = []
    for name in names or swept():
        path = directory / f"{name}.yaml"
        body = yaml.safe_dump(from_experiment(name), sort_keys=False, default_flow_style=None, width=100)
        write_text(path, HEADER.format(name=name) + body)
        paths.append(path)
    return paths


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.run.wandb_sweeps", description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", metavar="EXPERIMENT",
                        help="paper experiments to write (default: every one that runs as a wandb sweep)")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help=f"folder for the files (default {OUT_DIR})")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(swept()))
    if unknown:
        print(f"{parser.prog}: error: no wandb sweep for {', '.join(unknown)}; valid: {', '.join(swept())}",
              file=sys.stderr)
        return 2
    from harness.errors import OutputError
    from harness.outputs.paths import DestinationError

    try:
        paths = write(args.names, args.out)
    except (DestinationError, OutputError) as exc:  # bad input (2), or a write that failed (1)
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, DestinationError) else 1
    for path in paths:
        print(f"wrote {path}: run it with `wandb sweep {path}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
