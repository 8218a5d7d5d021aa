"""The pieces `python -m analysis.figures` and its smoke (analysis.smoke) share: the profiles and
their experiments, the multirun that makes a sweep's results (run again until every job of its
grid has finished), drawing and saving figures from results (each figure as its module declares
it: analysis.plots.FigureSpec; a figure with five seeds also says whether each mixer's rate lies
in its learning-rate window, analysis.windows), and the closing report. Both entry points import
this module; it imports neither.
"""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from analysis import lr_edge
from analysis.loader import NoResultsError, find_results, load_all
from analysis.plots import FigureSpec  # noqa: F401  (what a figure is, declared beside its drawing code)
from analysis.plots.common import FORMATS, save_figure, warn  # noqa: F401 (FORMATS: analysis.figures)
from harness.errors import OutputError
from harness.outputs.trust import UntrustedCode

TRUST_FLAG = "--trust-code"  # python -m analysis.figures's flag for harness.load_run's trust_code


# The profiles, each a folder of experiment files: quick (harness/conf/experiment/ itself: a 2-core
# CPU in an hour), paper (paper/: the full grids) and findings (findings/: the designs with
# pressure that do not fit the quick hour, at most 2.5 hours of sweeps on 2 cores; it holds only
# the experiments of its own figures).
PROFILES = ("quick", "paper", "findings")
# a profile whose folder holds the experiment of every figure; the others draw their own figures only
FULL_PROFILES = ("quick", "paper")


def profile_experiments(profile: str) -> list[str]:
    """The experiment names of a profile, from its files (a new experiment is listed nowhere)."""
    from harness.config.compose import CONF_DIR

    root = CONF_DIR / "experiment"
    folder = root if profile == "quick" else root / profile
    return sorted(p.stem for p in folder.glob("*.yaml"))


def profile_figures(specs, profile: str) -> list:
    """The figures a profile draws: every one for a full profile; for another (findings), those
    whose own experiment it has, each reading only the other sweeps it also has."""
    names = set(profile_experiments(profile))
    if profile in FULL_PROFILES:  # a figure whose sweep only another profile runs is not drawn
        return [s for s in specs if s.experiment is None or s.experiment in names]
    return [replace(s, also=tuple(e for e in s.also if e in names)) for s in specs
            if s.experiment is not None and s.experiment in names]


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


def finished_runs(sweep_dir: Path) -> int:
    """The runs under ``sweep_dir`` that finished (status ok), those the edge rule added
    (analysis.lr_edge) left out."""
    from analysis.loader import read_text

    try:
        files = find_results(sweep_dir)
    except NoResultsError:
        return 0
    done = 0
    for file in files:
        if lr_edge.EXTENDED_DIR in file.relative_to(sweep_dir).parts:
            continue
        try:
            done += json.loads(read_text(file)).get("status") == "ok"
        except (OSError, ValueError, EOFError, AttributeError):
            continue
    return done


def sweep_complete(root: Path, experiment: str, profile: str) -> bool:
    """Whether every job of the experiment's grid has finished under ``root``: a sweep killed
    part-way is not, and the figures command runs it again (each finished run is skipped,
    harness's sweep.skip_completed, so only what is missing is trained). An experiment whose
    grid does not compose counts as complete where it has any results."""
    try:
        jobs = job_count(sweep_params(profile, experiment))
    except Exception:  # its own sweep reports the error
        return has_results(root / experiment)
    return finished_runs(root / experiment) >= jobs


def job_count(params: dict[str, list[str]], grid: str = "all") -> int:
    """The jobs of a grid (``last``: only the mixer swept, analysis.smoke's quicker check)."""
    counts = [len(v) for k, v in params.items() if grid == "all" or k == "model"]
    return math.prod(counts) if counts else 1


def run_missing_sweeps(root: Path, experiments, profile: str, runner=None) -> list[str]:
    """Run each experiment whose sweep under ``root`` is missing or unfinished; returns the ones
    run. An unfinished sweep (killed, or with failed runs) is run again with the same command,
    which trains only the runs it lacks.

    ``runner`` is subprocess.run unless given. A sweep that fails is reported and left: its
    figure draws from what it wrote, or is skipped.
    """
    runner = runner or subprocess.run
    ran = []
    for experiment in experiments:
        sweep_dir = root / experiment
        if sweep_complete(root, experiment, profile):
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
    import io

    from harness.outputs.atomic import write_text

    try:
        name = rate_pilot(profile, experiment)
        params = sweep_params(profile, experiment) if in_profile(profile, name) else None
    except Exception:  # an experiment that does not compose: its own sweep reports the error
        return {}
    if params is None or len(lr_edge.grid_rates(params)) >= 2:
        return {}  # no pilot, or a grid that chooses its rate per point itself
    pilot_dir = root / name
    if not sweep_complete(root, name, profile):
        cmd = sweep_command(profile, name, pilot_dir)
        print(f"running rate pilot {name}: {' '.join(cmd)}", flush=True)
        code = (runner or subprocess.run)(cmd, check=False).returncode
        if code != 0:
            warn(f"rate pilot {name} exited with status {code}")
    choices = lr_edge.pilot_choices(lr_edge.run_scores(pilot_dir))
    if choices:
        table = io.StringIO(newline="")
        writer = csv.DictWriter(table, fieldnames=list(choices[0]))
        writer.writeheader()
        writer.writerows(choices)
        write_text(pilot_dir / "chosen_rates.csv", table.getvalue())  # whole or not at all
    else:
        warn(f"rate pilot {name}: no finished run; {experiment} runs at its own grid's rates")
    # a pilot shared with another experiment chose rates for mixers this grid may not run: only
    # the grid's own mixers run, each at its chosen rate
    own = set(params.get("model", ()))
    return lr_edge.rate_groups([row for row in choices if not own or row["model"] in own])


def rate_pilot(profile: str, experiment: str) -> str:
    """The rate pilot an experiment runs at: its own, <experiment>_rates, where the profile has
    one; else ``analysis.rate_pilot`` where its file names one (an experiment trained as another's
    runs, findings/capacity_length as findings/capacity's, uses that one's choices)."""
    from omegaconf import OmegaConf

    own = lr_edge.pilot_name(experiment)
    if in_profile(profile, own):
        return own  # no composing for the experiments with a pilot of their own
    named = OmegaConf.select(compose_experiment(profile, experiment), "analysis.rate_pilot")
    return str(named) if named else own


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
    return name in profile_experiments(profile)


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
    ``trust_code``: figures that reopen runs may import the outside code their configs name (a
    dotted model.name, a hybrid's slot, a task module: harness.outputs.trust); otherwise such a
    figure is skipped with one warning that names TRUST_FLAG.
    """
    written, missed = {}, []
    windows = MeasuredWindows(root)
    for spec in specs:
        options = {"trust_code": trust_code} if spec.reopens_runs else {}
        try:
            data = None if spec.experiment is None else load_figure_data(root, spec)
            fig = spec.draw() if data is None else spec.draw(data, **options)
        except NoResultsError as err:
            warn(f"figure {spec.name} skipped: {err}")
            missed.append(spec.name)
            continue
        except UntrustedCode as err:  # refused before any import: say what to add to this command
            warn(f"figure {spec.name} skipped: {err.asking(TRUST_FLAG)}")
            missed.append(spec.name)
            continue
        except Exception as err:  # one broken figure must not cost the others
            warn(f"figure {spec.name} failed: {type(err).__name__}: {err}")
            missed.append(spec.name)
            continue
        if fig is None:
            missed.append(spec.name)
            continue
        if data is not None and spec.experiment != WINDOWS_EXPERIMENT:
            check_rates(fig, spec.name, data, windows)
        try:
            written[spec.name] = save_figure(fig, out_dir, spec.name)
        except OutputError as err:  # a full disk: every figure after it would fail the same way
            raise SystemExit(f"python -m analysis.figures: error: {err}") from None
        print(f"{spec.name}: " + ", ".join(str(p) for p in written[spec.name]), flush=True)
    return written, missed


# The sweep that measures each mixer's learning-rate window (analysis.windows), in the same results
# root as the figures it checks.
WINDOWS_EXPERIMENT = "lr_window"


class MeasuredWindows:
    """The windows measured under a results root (its lr_window sweep), read once when a figure
    first asks; None where that sweep has no results."""

    def __init__(self, root: Path):
        self.root, self._table, self._read = root, None, False

    def table(self):
        if not self._read:
            self._read = True
            from analysis.windows import measured_windows

            try:
                self._table = measured_windows(load_all(self.root / WINDOWS_EXPERIMENT))
            except NoResultsError:
                self._table = None
        return self._table


def check_rates(fig, name: str, data, windows: MeasuredWindows) -> None:
    """A figure that ranks mixers (five seeds of some mixer: analysis.stats.MIN_SEEDS) says, in a
    table ``<name>_lr_window`` and a caption sentence, whether each mixer's rate lies inside the
    learning-rate window measured for it (analysis.windows.rate_check), or that none was."""
    from analysis import stats
    from analysis import windows as lr_windows
    from analysis.plots.common import extend_caption, labelled

    runs = lr_windows.trained_runs(data)
    if runs.empty or "model" not in runs.columns or stats.SEED not in runs.columns or \
            runs.groupby("model")[stats.SEED].nunique().max() < stats.MIN_SEEDS:
        return  # an illustration: it orders no mixers
    check = lr_windows.rate_check(labelled(runs), windows.table())
    if check.empty:
        return
    fig.tables = {**getattr(fig, "tables", {}), f"{name}_lr_window": check}
    extend_caption(fig, lr_windows.check_sentence(check) + f" ({name}_lr_window.csv)")


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
