"""The pieces `python -m analysis.figures` and its smoke (analysis.smoke) share: the multirun
that makes a sweep's results, drawing and saving figures from results (each figure as its
module declares it: analysis.plots.FigureSpec), and the closing report. Both entry points import this module; it imports neither.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from analysis import lr_edge
from analysis.loader import NoResultsError, find_results, load_all
from analysis.plots import FigureSpec  # noqa: F401  (what a figure is, declared beside its drawing code)
from analysis.plots.common import FORMATS, save_figure, warn  # noqa: F401 (FORMATS: analysis.figures)
from harness.errors import OutputError


def sweep_command(profile: str, experiment: str, sweep_dir: Path) -> list[str]:
    """The multirun that produces ``sweep_dir`` for one experiment of a profile."""
    name = experiment if profile == "quick" else f"{profile}/{experiment}"
    return [sys.executable, "-m", "harness", "-m", f"+experiment={name}",
            f"hydra.sweep.dir={_override_value(sweep_dir.resolve())}"]


def has_results(sweep_dir: Path) -> bool:
    try:
        return bool(find_results(sweep_dir))
    except NoResultsError:
        return False


def run_missing_sweeps(root: Path, experiments, profile: str, runner=None) -> list[str]:
    """Run each experiment that has no results under ``root``; returns the ones run.

    ``runner`` is subprocess.run unless given. A sweep that fails is reported and left: its
    figure draws from what it wrote, or is skipped.
    """
    runner = runner or subprocess.run
    ran = []
    for experiment in experiments:
        sweep_dir = root / experiment
        if has_results(sweep_dir):
            continue
        if not in_profile(profile, experiment):
            warn(f"sweep {experiment}: the {profile} profile has no such experiment; its figures draw without it")
            continue
        groups = pilot_rates(root, experiment, profile, runner)
        commands = [sweep_command(profile, experiment, lr_edge.chosen_dir(sweep_dir, lr, width))
                    + lr_edge.chosen_overrides(lr, width, models) for (lr, width), models in groups.items()] \
            or [sweep_command(profile, experiment, sweep_dir)]
        for cmd in commands:
            print(f"running sweep {experiment}: {' '.join(cmd)}", flush=True)
            code = runner(cmd, check=False).returncode
            if code != 0:
                warn(f"sweep {experiment} exited with status {code}")
        ran.append(experiment)
        extend_edge_rates(root, experiment, profile, runner)
    return ran


def pilot_rates(root: Path, experiment: str, profile: str, runner=None) -> dict:
    """The rate pilot of ``experiment`` (analysis.lr_edge), where the profile has one
    (<experiment>_rates.yaml): runs it into <root>/<experiment>_rates when missing, writes its
    choices there (chosen_rates.csv: every rate's validation accuracy, the chosen one), and
    returns {(rate, width): models}; {} without a pilot or where the experiment's own grid has
    several rates."""
    import csv

    from harness.config.compose import CONF_DIR

    name = lr_edge.pilot_name(experiment)
    folder = CONF_DIR / "experiment" / ("" if profile == "quick" else profile)
    if not (folder / f"{name}.yaml").exists() or len(lr_edge.grid_rates(sweep_params(profile, experiment))) >= 2:
        return {}  # no pilot, or a grid that chooses its rate per point itself
    pilot_dir = root / name
    if not has_results(pilot_dir):
        cmd = sweep_command(profile, name, pilot_dir)
        print(f"running rate pilot {name}: {' '.join(cmd)}", flush=True)
        code = (runner or subprocess.run)(cmd, check=False).returncode
        if code != 0:
            warn(f"rate pilot {name} exited with status {code}")
    choices = lr_edge.pilot_choices(lr_edge.run_scores(pilot_dir))
    if choices:
        with open(pilot_dir / "chosen_rates.csv", "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(choices[0]))
            writer.writeheader()
            writer.writerows(choices)
    else:
        warn(f"rate pilot {name}: no finished run; {experiment} runs at its own grid's rates")
    return lr_edge.rate_groups(choices)


def extend_edge_rates(root: Path, experiment: str, profile: str, runner=None, params=None) -> list[Path]:
    """The learning-rate edge rule (analysis.lr_edge): for each mixer whose chosen rate sits at
    an edge of the experiment's grid, a second sweep at the next rate out; returns the folders
    of the second-stage sweeps run."""
    runner = runner or subprocess.run
    if params is None:
        try:
            params = sweep_params(profile, experiment)
        except Exception as err:  # an experiment that does not compose was reported by its sweep
            warn(f"sweep {experiment}: learning-rate edge rule skipped ({type(err).__name__}: {err})")
            return []
    sweep_dir = root / experiment
    todo = lr_edge.extensions(lr_edge.run_scores(sweep_dir), lr_edge.grid_rates(params))
    ran = []
    for lr, models in todo.items():
        out = lr_edge.extension_dir(sweep_dir, lr)
        if has_results(out):
            continue
        cmd = sweep_command(profile, experiment, out) + lr_edge.extension_overrides(lr, models)
        print(f"running sweep {experiment} at lr {lr:.3g} (chosen rate at the grid's edge for "
              f"{', '.join(models)}): {' '.join(cmd)}", flush=True)
        code = runner(cmd, check=False).returncode
        if code != 0:
            warn(f"sweep {experiment} at lr {lr:.3g} exited with status {code}")
        ran.append(out)
    return ran


def _full_name(profile: str, name: str) -> str:
    return name if profile == "quick" else f"{profile}/{name}"


def in_profile(profile: str, name: str) -> bool:
    """Whether the profile has an experiment file of that name (a figure may read a sweep that
    only another profile runs: the findings profile's capacity_length)."""
    from harness.config.compose import CONF_DIR

    return (CONF_DIR / "experiment" / f"{_full_name(profile, name)}.yaml").exists()


def compose_experiment(profile: str, name: str, overrides=()):
    """An experiment of a profile composed as its multirun sees it (harness.config.compose)."""
    from harness.config.compose import compose_experiment as compose

    return compose(_full_name(profile, name), overrides)


def sweep_params(profile: str, name: str) -> dict[str, list[str]]:
    """The grid of an experiment: each swept key and its values, as the sweeper will read them."""
    from harness.config.compose import experiment_grid

    return experiment_grid(_full_name(profile, name))


def load_figure_data(root: Path, spec: FigureSpec):
    """The long frame of every sweep ``spec`` reads (its own first); NoResultsError when its
    own sweep has none. A missing extra sweep only leaves its rows out."""
    frames = [load_all(root / spec.experiment)]
    for extra in spec.also:
        try:
            frames.append(load_all(root / extra))
        except NoResultsError:
            warn(f"figure {spec.name}: no results in {root / extra}; drawn without them")
    if len(frames) == 1:
        return frames[0]
    import pandas as pd

    return pd.concat(frames, ignore_index=True, sort=False)


def render(specs, root: Path, out_dir: Path, *, trust_code: bool = False) -> tuple[dict[str, list[Path]], list[str]]:
    """Draw and save each figure from ``root``: (paths of the figures written, names not drawn).

    A figure whose data is absent is skipped with its warning; one that raises is reported;
    the others are still drawn either way. A run whose results.json is damaged or malformed is
    left out of its figure, named in a note (analysis.loader keeps it as a failed run).
    ``trust_code``: figures that reopen runs may import the outside code (a dotted model.name)
    their configs name (harness.load_run's trust_code); otherwise such a run is refused.
    """
    written, missed = {}, []
    for spec in specs:
        options = {"trust_code": trust_code} if spec.reopens_runs else {}
        try:
            fig = spec.draw() if spec.experiment is None else spec.draw(load_figure_data(root, spec), **options)
        except NoResultsError as err:
            warn(f"figure {spec.name} skipped: {err}")
            missed.append(spec.name)
            continue
        except Exception as err:  # one broken figure must not cost the others
            warn(f"figure {spec.name} failed: {type(err).__name__}: {err}")
            missed.append(spec.name)
            continue
        if fig is None:
            missed.append(spec.name)
            continue
        try:
            written[spec.name] = save_figure(fig, out_dir, spec.name)
        except OutputError as err:  # a full disk: every figure after it would fail the same way
            raise SystemExit(f"python -m analysis.figures: error: {err}") from None
        print(f"{spec.name}: " + ", ".join(str(p) for p in written[spec.name]), flush=True)
    return written, missed


def report(written, missed, specs, out_dir: Path) -> int:
    """The closing lines: what was written, and (exit code 1) which figures were not drawn."""
    print(f"wrote {len(written)} of {len(specs)} figures to {out_dir}")
    if missed:
        print(f"python -m analysis.figures: {len(missed)} figure(s) not drawn: {', '.join(missed)} "
              "(see the warnings above)", file=sys.stderr)
        return 1
    return 0


def _override_value(path: Path) -> str:
    """A path as a Hydra override value: quoted when it holds characters the grammar reserves."""
    text = path.as_posix()
    return text if re.fullmatch(r"[\w./:+-]+", text) else "'" + text.replace("'", r"\'") + "'"
