"""Regenerate every figure from sweep results, running the sweeps that are missing first.

    python -m analysis.figures --profile quick --out figures/quick       # run missing sweeps, plot
    python -m analysis.figures --results results/quick --out figs       # plot existing results only
    python -m analysis.figures --profile paper --smoke                   # every paper job, one step each
    python -m analysis.figures --profile findings --only lr_window      # one figure's sweep, then its figure
    python -m analysis.figures --results docs/results/findings --out f  # from committed results (gzip'd)

Each sweep's results live in ``<results>/<experiment>/``; the default results root is
``results/<profile>``. A missing or unfinished sweep is run as
``python -m harness -m +experiment=<name> hydra.sweep.dir=<results>/<name>``
(``+experiment=<profile>/<name>`` for the paper and findings profiles); a sweep killed part-way
is run again by the same command, which trains only the runs it lacks. The findings profile
(harness/conf/experiment/findings/) draws only the figures whose experiment it holds. Every figure is written as PNG and
PDF; a figure whose data is absent is skipped with a warning, and the command then exits 1
naming it. Bad arguments (a results path that does not exist, an unknown figure, an output
folder that cannot be written) stop it with one line and exit code 2 before any work. A run
whose results.json is damaged or malformed is left out of its figure with a note naming the
file. The attention and anatomy figures reopen runs with harness.load_run; a run whose config
names outside code (a dotted model.name, a hybrid's slot or model.attn, a task module) is
refused before anything of it is imported, unless ``--trust-code`` is given.

``--smoke`` runs every experiment file of the profile (discovered from
harness/conf/experiment/<profile>/, so a new experiment needs no list here) through the same
launcher with one training step per job on the CPU at the profile's sizes, draws every figure
from those results, and prints what the full profile would cost (analysis.smoke).

The figures are those the modules of analysis/plots declare (``FIGURES`` at the top of each;
analysis.plots.figures finds them): each figure function takes the long frame of
``analysis.loader.load_all`` (or a results path) and returns a matplotlib Figure.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from analysis import archive, smoke
from analysis.loader import NoResultsError, find_results
# The pipeline's pieces, importable from here as before (notebooks, tests).
from analysis.pipeline import (FORMATS, PROFILES, TRUST_FLAG, FigureSpec, has_results, load_figure_data,  # noqa: F401
                               profile_figures, render, report, extend_edge_rates, run_missing_sweeps,
                               save_figure, sweep_command)
from analysis.plots import figures


# Every figure a module of analysis/plots declares (its FIGURES): a new figure is listed by its
# own module, never here.
FIGURES = figures()


class ArgumentError(ValueError):
    """A bad argument of this command: one line, exit code 2."""


def check_arguments(args) -> tuple[Path, Path]:
    """(results root, output folder), both usable, before any work; ArgumentError otherwise.
    Settles ``args.profile``: the one given, else that of committed results (analysis.archive's
    manifest in --results), else quick; and refuses a figure (--only) the profile does not draw."""
    if args.profile is None:
        args.profile = (archive.profile_of(Path(args.results)) if args.results else None) or "quick"
    if args.only:
        drawn = {s.name for s in profile_figures(FIGURES, args.profile)}
        outside = [name for name in args.only if name not in drawn]
        if outside:
            raise ArgumentError(f"--only {', '.join(outside)}: not a figure of the {args.profile} profile "
                                f"(its figures: {', '.join(sorted(drawn))})")
    root = Path(args.results) if args.results else Path("results") / (
        f"{args.profile}-smoke" if args.smoke else args.profile)
    out_dir = Path(args.out) if args.out else Path("figures") / (f"{args.profile}-smoke" if args.smoke else args.profile)
    if args.results:
        if args.smoke:
            raise ArgumentError("--smoke runs its own sweeps: give --out (and no --results)")
        if not root.exists():
            raise ArgumentError(f"--results {root}: no such file or directory")
        if not root.is_dir():
            raise ArgumentError(f"--results {root} is a file: give the folder that holds the sweeps "
                                "(results/<profile>, one folder per experiment)")
        try:
            find_results(root)
        except NoResultsError as err:
            raise ArgumentError(f"--results {root}: {err}") from None
    _check_writable(out_dir, "--out")
    if not args.results:
        _check_writable(root, "results folder")
    return root, out_dir


def _check_writable(folder: Path, what: str) -> None:
    """Never inside the package's config (harness.outputs.paths, as every writer of the harness);
    then create ``folder`` (and its parents) and write a file there: a place that cannot take the
    figures fails now, not after an hour of sweeps."""
    import tempfile

    from harness.outputs.paths import refuse_config_folder

    try:
        refuse_config_folder(what, folder)
    except ValueError as err:
        raise ArgumentError(str(err)) from None
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
    specs = [s for s in profile_figures(FIGURES, args.profile) if not args.only or s.name in args.only]
    if args.smoke:
        chosen = {s.experiment for s in specs if s.experiment} if args.only else None
        return smoke.run(args.profile, root, out_dir, specs, smoke_grid=args.smoke_grid, only=chosen)
    if not args.results:
        experiments = dict.fromkeys(e for s in specs for e in s.experiments)
        run_missing_sweeps(root, experiments, args.profile)
    written, missed = render(specs, root, out_dir, trust_code=args.trust_code)
    return report(written, missed, specs, out_dir)


class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (exit code 2), without the usage block."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="python -m analysis.figures", description=__doc__.split("\n")[0])
    parser.add_argument("--profile", choices=PROFILES, default=None,
                        help="sweep size: experiment files <name> (quick, the default), paper/<name> (paper) or "
                             "findings/<name> (findings: its own figures only); with --results of committed "
                             "results (analysis.archive), theirs")
    parser.add_argument("--out", help="folder for the PNG and PDF files (default figures/<profile>)")
    parser.add_argument("--results", help="plot existing results under this root; run nothing")
    parser.add_argument("--only", nargs="+", choices=[s.name for s in FIGURES], metavar="FIGURE",
                        help="draw only these figures: " + ", ".join(s.name for s in FIGURES))
    parser.add_argument(TRUST_FLAG, action="store_true",
                        help="let figures that reopen trained runs (attention, anatomy) import the outside code a "
                             "run's config names (a dotted model.name, a hybrid's slot, a task module); without it "
                             "such a run is refused")
    parser.add_argument("--smoke", action="store_true",
                        help="run every experiment of the profile with one training step per job on the CPU "
                             "(results under results/<profile>-smoke), draw the figures, print the full cost")
    parser.add_argument("--smoke-grid", choices=("all", "last"), default="all",
                        help="with --smoke: every job of each grid (all), or only the last value of each "
                             "swept key but the mixer (last: the largest sizes, a quicker check)")
    return parser


if __name__ == "__main__":
    sys.exit(main())
