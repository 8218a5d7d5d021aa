"""Regenerate every figure from sweep results, running the sweeps that are missing first.

    python -m analysis.figures --profile quick --out figures/quick       # run missing sweeps, plot
    python -m analysis.figures --results results/quick --out figs       # plot existing results only

Each sweep's results live in ``<results>/<experiment>/``; the default results root is
``results/<profile>``. A missing sweep is run as
``python -m harness -m +experiment=<name> hydra.sweep.dir=<results>/<name>``
(``+experiment=paper/<name>`` for the paper profile). Every figure is written as PNG and
PDF; a figure whose data is absent is skipped with a warning.

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
from analysis.plots.capacity import capacity_figure
from analysis.plots.common import warn
from analysis.plots.cost import cost_figure, state_figure
from analysis.plots.induction import induction_figure
from analysis.plots.mqar import mqar_figure
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

    @property
    def experiments(self) -> tuple[str, ...]:
        return () if self.experiment is None else (self.experiment, *self.also)


FIGURES = (
    FigureSpec("capacity", "capacity", capacity_figure),
    # trained runs (filled) beside the untrained probe (hollow): the capacity sweep's runs
    FigureSpec("snr", "snr", snr_figure, also=("capacity",)),
    FigureSpec("sharpness", "sharpness", sharpness_figure),
    FigureSpec("mqar", "mqar", mqar_figure),
    FigureSpec("induction", "induction", induction_figure),
    FigureSpec("state_vs_kv", None, state_figure),
    FigureSpec("cost", "cost", cost_figure),
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


def render(specs, root: Path, out_dir: Path) -> tuple[dict[str, list[Path]], list[str]]:
    """Draw and save each figure from ``root``: (paths of the figures written, names that broke).

    Absent data skips a figure quietly apart from its warning; a figure that raises is
    reported and the others still drawn.
    """
    written, broken = {}, []
    for spec in specs:
        try:
            fig = spec.draw() if spec.experiment is None else spec.draw(load_figure_data(root, spec))
        except NoResultsError as err:
            warn(f"figure {spec.name} skipped: {err}")
            continue
        except Exception as err:  # one broken figure must not cost the others
            warn(f"figure {spec.name} failed: {type(err).__name__}: {err}")
            broken.append(spec.name)
            continue
        if fig is not None:
            written[spec.name] = save_figure(fig, out_dir, spec.name)
            print(f"{spec.name}: " + ", ".join(str(p) for p in written[spec.name]), flush=True)
    return written, broken


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    specs = [s for s in FIGURES if not args.only or s.name in args.only]
    root = Path(args.results) if args.results else Path("results") / args.profile
    out_dir = Path(args.out) if args.out else Path("figures") / args.profile
    if not args.results:
        experiments = dict.fromkeys(e for s in specs for e in s.experiments)
        run_missing_sweeps(root, experiments, args.profile)
    written, broken = render(specs, root, out_dir)
    print(f"wrote {len(written)} of {len(specs)} figures to {out_dir}")
    return 1 if broken else 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m analysis.figures", description=__doc__.split("\n")[0])
    parser.add_argument("--profile", choices=PROFILES, default="quick",
                        help="sweep size: experiment files <name> (quick) or paper/<name> (paper)")
    parser.add_argument("--out", help="folder for the PNG and PDF files (default figures/<profile>)")
    parser.add_argument("--results", help="plot existing results under this root; run nothing")
    parser.add_argument("--only", nargs="+", choices=[s.name for s in FIGURES], metavar="FIGURE",
                        help="draw only these figures: " + ", ".join(s.name for s in FIGURES))
    return parser


def _override_value(path: Path) -> str:
    """A path as a Hydra override value: quoted when it holds characters the grammar reserves."""
    text = path.as_posix()
    return text if re.fullmatch(r"[\w./:+-]+", text) else "'" + text.replace("'", r"\'") + "'"


if __name__ == "__main__":
    sys.exit(main())
