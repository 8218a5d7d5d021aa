"""Regenerate every figure from sweep results, running the sweeps that are missing first.

    python -m analysis.figures --profile quick --out figures/quick       # run missing sweeps, plot
    python -m analysis.figures --results results/quick --out figs       # plot existing results only
    python -m analysis.figures --profile paper --smoke                   # every paper job, one step each

Each sweep's results live in ``<results>/<experiment>/``; the default results root is
``results/<profile>``. A missing sweep is run as
``python -m harness -m +experiment=<name> hydra.sweep.dir=<results>/<name>``
(``+experiment=paper/<name>`` for the paper profile). Every figure is written as PNG and
PDF; a figure whose data is absent is skipped with a warning, and the command then exits 1
naming it. Bad arguments (a results path that does not exist, an unknown figure, an output
folder that cannot be written) stop it with one line and exit code 2 before any work. A run
whose results.json is damaged or malformed is left out of its figure with a note naming the
file. The attention figure reopens runs with harness.load_run; a run whose config names outside
code (a dotted model.name) is refused unless ``--trust-code`` is given.

``--smoke`` runs every experiment file of the profile (discovered from
harness/conf/experiment/<profile>/, so a new experiment needs no list here) through the same
launcher with one training step per job on the CPU at the profile's sizes, draws every figure
from those results, and prints what the full profile would cost (analysis.smoke).

The figure functions are importable from here for notebooks: each takes the long frame
of ``analysis.loader.load_all`` (or a results path) and returns a matplotlib Figure.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from analysis.loader import NoResultsError, find_results, load_all
from analysis.plots.attention import attention_figure
from analysis.plots.capacity import capacity_figure
from analysis.plots.common import warn
from analysis.plots.cost import cost_figure, state_figure
from analysis.plots.forgetting import forgetting_figure
from analysis.plots.frontier import frontier_figure
from analysis.plots.induction import induction_figure
from analysis.plots.learning import learning_figure
from analysis.plots.length import length_figure
from analysis.plots.mqar import mqar_figure
from analysis.plots.needle import needle_figure
from analysis.plots.sharpness import sharpness_figure
from analysis.plots.snr import snr_figure

PROFILES = ("quick", "paper")
FORMATS = ("png", "pdf")


@dataclass(frozen=True)
class FigureSpec:
    name: str                 # file name stem
    experiment: str | None    # sweep it reads from <results>/<experiment>; None: needs no runs
    draw: Callable
    also: tuple[str, ...] = ()  # other sweeps whose results it draws too (run when missing)
    reopens_runs: bool = False  # draws from runs' weights (harness.load_run): takes trust_code

    @property
    def experiments(self) -> tuple[str, ...]:
        return () if self.experiment is None else (self.experiment, *self.also)


FIGURES = (
    FigureSpec("capacity", "capacity", capacity_figure),
    # trained runs (filled) beside the untrained probe (hollow): the capacity sweep's runs
    FigureSpec("snr", "snr", snr_figure, also=("capacity",)),
    FigureSpec("sharpness", "sharpness", sharpness_figure),
    FigureSpec("attention", "sharpness", attention_figure, reopens_runs=True),  # the sweep's softmax and elu runs
    FigureSpec("mqar", "mqar", mqar_figure),
    FigureSpec("induction", "induction", induction_figure),
    FigureSpec("state_vs_kv", None, state_figure),
    FigureSpec("cost", "cost", cost_figure),
    FigureSpec("length", "length", length_figure),
    FigureSpec("needle", "needle", needle_figure),
    FigureSpec("frontier", "frontier", frontier_figure),
    FigureSpec("forgetting", "forgetting", forgetting_figure),
    FigureSpec("learning", "sharpness", learning_figure, also=("capacity",)),  # default recall and capacity tasks
)


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
        cmd = sweep_command(profile, experiment, sweep_dir)
        print(f"running sweep {experiment}: {' '.join(cmd)}", flush=True)
        code = runner(cmd, check=False).returncode
        if code != 0:
            warn(f"sweep {experiment} exited with status {code}")
        ran.append(experiment)
        extend_edge_rates(root, experiment, profile, runner)
    return ran


def extend_edge_rates(root: Path, experiment: str, profile: str, runner=None, params=None) -> list[Path]:
    """The learning-rate edge rule (analysis.lr_edge): for each mixer whose chosen rate sits at
    an edge of the experiment's grid, a second sweep at the next rate out; returns the folders
    of the second-stage sweeps run."""
    from analysis import lr_edge

    runner = runner or subprocess.run
    if params is None:
        from analysis.smoke import sweep_params

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


def save_figure(fig, out_dir: Path, name: str) -> list[Path]:
    """Write ``fig`` as ``out_dir/name.png`` and ``out_dir/name.pdf``, and each table the
    figure carries (``fig.tables``: every learning rate's result, fitted numbers) as
    ``out_dir/<table>.csv`` beside it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.{fmt}" for fmt in FORMATS]
    for path in paths:
        fig.savefig(path, dpi=150, bbox_inches="tight")
    for table_name, frame in getattr(fig, "tables", {}).items():
        if frame is not None and len(frame):
            path = out_dir / f"{table_name}.csv"
            frame.to_csv(path, index=False)
            paths.append(path)
    return paths


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
        written[spec.name] = save_figure(fig, out_dir, spec.name)
        print(f"{spec.name}: " + ", ".join(str(p) for p in written[spec.name]), flush=True)
    return written, missed


class ArgumentError(ValueError):
    """A bad argument of this command: one line, exit code 2."""


def check_arguments(args) -> tuple[Path, Path]:
    """(results root, output folder), both usable, before any work; ArgumentError otherwise."""
    root = Path(args.results) if args.results else Path("results") / (
        f"{args.profile}-smoke" if args.smoke else args.profile)
    out_dir = Path(args.out) if args.out else Path("figures") / (f"{args.profile}-smoke" if args.smoke else args.profile)
    if args.results:
        if args.smoke:
            raise ArgumentError("--smoke runs its own sweeps: give --out (and no --results)")
        if not root.exists():
            raise ArgumentError(f"--results {root}: no such file or directory")
        try:
            find_results(root)
        except NoResultsError as err:
            raise ArgumentError(f"--results {root}: {err}") from None
    _check_writable(out_dir, "--out")
    if not args.results:
        _check_writable(root, "results folder")
    return root, out_dir


def _check_writable(folder: Path, what: str) -> None:
    """Create ``folder`` (and its parents) and write a file there: a place that cannot take the
    figures fails now, not after an hour of sweeps."""
    import tempfile

    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as err:
        raise ArgumentError(f"{what} {folder}: cannot write there ({err.strerror or err})") from None


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        root, out_dir = check_arguments(args)
    except ArgumentError as err:
        print(f"python -m analysis.figures: error: {err}", file=sys.stderr)
        return 2
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    specs = [s for s in FIGURES if not args.only or s.name in args.only]
    if args.smoke:
        from analysis import smoke

        chosen = {s.experiment for s in specs if s.experiment} if args.only else None
        return smoke.run(args.profile, root, out_dir, specs, smoke_grid=args.smoke_grid, only=chosen)
    if not args.results:
        experiments = dict.fromkeys(e for s in specs for e in s.experiments)
        run_missing_sweeps(root, experiments, args.profile)
    written, missed = render(specs, root, out_dir, trust_code=args.trust_code)
    return report(written, missed, specs, out_dir)


def report(written, missed, specs, out_dir: Path) -> int:
    """The closing lines: what was written, and (exit code 1) which figures were not drawn."""
    print(f"wrote {len(written)} of {len(specs)} figures to {out_dir}")
    if missed:
        print(f"python -m analysis.figures: {len(missed)} figure(s) not drawn: {', '.join(missed)} "
              "(see the warnings above)", file=sys.stderr)
        return 1
    return 0


class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (exit code 2), without the usage block."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="python -m analysis.figures", description=__doc__.split("\n")[0])
    parser.add_argument("--profile", choices=PROFILES, default="quick",
                        help="sweep size: experiment files <name> (quick) or paper/<name> (paper)")
    parser.add_argument("--out", help="folder for the PNG and PDF files (default figures/<profile>)")
    parser.add_argument("--results", help="plot existing results under this root; run nothing")
    parser.add_argument("--only", nargs="+", choices=[s.name for s in FIGURES], metavar="FIGURE",
                        help="draw only these figures: " + ", ".join(s.name for s in FIGURES))
    parser.add_argument("--trust-code", action="store_true",
                        help="let figures that reopen trained runs (attention) import the outside code a run's "
                             "config names (a dotted model.name or task module); without it such a run is refused")
    parser.add_argument("--smoke", action="store_true",
                        help="run every experiment of the profile with one training step per job on the CPU "
                             "(results under results/<profile>-smoke), draw the figures, print the full cost")
    parser.add_argument("--smoke-grid", choices=("all", "last"), default="all",
                        help="with --smoke: every job of each grid (all), or only the last value of each "
                             "swept key but the mixer (last: the largest sizes, a quicker check)")
    return parser


def _override_value(path: Path) -> str:
    """A path as a Hydra override value: quoted when it holds characters the grammar reserves."""
    text = path.as_posix()
    return text if re.fullmatch(r"[\w./:+-]+", text) else "'" + text.replace("'", r"\'") + "'"


if __name__ == "__main__":
    sys.exit(main())
