"""wandb sweep files (`harness/sweeps/*.yaml`): derived from the paper experiments, validated
offline, expanded into the commands an agent runs.

A sweep file is run on many machines with `wandb sweep harness/sweeps/<name>.yaml` and then
`wandb agent <id>` on each; the agent builds every command with wandb's own
`create_sweep_command_args`, which is what `expand` uses too, so what is checked here is what
an agent will run. No wandb server is needed for either.

Each file is the paper profile's experiment file and nothing else (`from_experiment`): the agent
passes `+experiment=paper/<name>`, which fixes every setting, and one value of each key the
experiment's sweeper grids, and logs to wandb online. So a sweep on many machines runs the same
protocol and mixers as `python -m harness -m +experiment=paper/<name>`, and the files are
rewritten from the experiments with `python -m harness.run.wandb_sweeps`, never edited.
"""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import yaml

WANDB_DIR = Path(__file__).resolve().parent.parent / "sweeps"  # beside conf/, not in it: no Hydra group
# The paper experiments that are run as wandb sweeps: all but the cost table, whose timings are
# only comparable when they come from one machine.
SWEPT = ("capacity", "forgetting", "frontier", "induction", "length", "mqar", "needle", "sharpness", "snr")
HEADER = ("# Written by `python -m harness.run.wandb_sweeps` from harness/conf/experiment/paper/{name}.yaml:\n"
          "# edit the experiment, then rewrite this file. Run with `wandb sweep` and `wandb agent`.\n")
METHODS = ("grid", "random", "bayes")
PARAM_KEYS = ("value", "values", "distribution", "min", "max", "mu", "sigma", "q", "probabilities")


def sweep_files() -> list[Path]:
    return sorted(WANDB_DIR.glob("*.yaml"))


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


def from_experiment(name: str) -> dict[str, Any]:
    """The wandb grid sweep of the paper experiment `name`: `+experiment=paper/<name>` fixes
    every setting, the experiment's sweeper grid becomes the sweep's values (each value as YAML
    reads it), and runs log to wandb online."""
    from harness.config.compose import compose_experiment, experiment_grid

    full = f"paper/{name}"
    mode = compose_experiment(full).mode
    params: dict[str, Any] = {"+experiment": {"value": full}}
    for key, values in experiment_grid(full).items():
        params[key] = {"values": [yaml.safe_load(v) for v in values]}
    params.update({"logger": {"value": "wandb"}, "logger.mode": {"value": "online"}})
    sweep: dict[str, Any] = {"name": name, "program": "harness", "method": "grid"}
    if mode == "train":
        sweep["metric"] = {"name": "accuracy", "goal": "maximize"}
    return {**sweep, "parameters": params, "command": ["python", "-m", "harness", "${args_no_hyphens}"]}


def write(directory: Path = WANDB_DIR) -> list[Path]:
    """Rewrite every sweep file from its paper experiment (`from_experiment`)."""
    paths = []
    for name in SWEPT:
        path = Path(directory) / f"{name}.yaml"
        body = yaml.safe_dump(from_experiment(name), sort_keys=False, default_flow_style=None, width=100)
        path.write_text(HEADER.format(name=name) + body)
        paths.append(path)
    return paths


if __name__ == "__main__":
    for written in write():
        print(f"wrote {written}")

