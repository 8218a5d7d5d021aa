"""One module per figure family; each declares its figures at its top, and nothing else lists them.

A module of this package declares what each of its figures needs in a module-level ``FIGURES``:

    FIGURES = (FigureSpec("needle", "needle", "needle_figure", notebook="nb_needle",
                          tables=("needle", "needle_by_length")),)

(its file name, the experiment whose sweep it reads, its figure function, its notebook under
analysis/, the CSV tables it writes beside it). :func:`figures` finds every declaration, so the
list `python -m analysis.figures` draws, the sweeps it runs first, the smoke's experiments, the
notebooks tests/test_notebooks.py executes and the experiments a test holds to a figure all
follow from these lines. Each figure function takes the long results frame of its sweeps
(``analysis.loader.load_all``) and returns a matplotlib Figure, or None when its data is absent.
"""
from __future__ import annotations

import pkgutil
from dataclasses import dataclass, replace
from typing import Callable


@dataclass(frozen=True)
class FigureSpec:
    name: str                     # file name stem of its PNG and PDF
    experiment: str | None        # the sweep it reads from <results>/<experiment>; None: needs no runs
    draw: Callable | str          # the figure function (in a declaration: its name in the module)
    also: tuple[str, ...] = ()    # other sweeps whose results it draws too (run when missing)
    reopens_runs: bool = False    # draws from runs' weights (harness.load_run): takes trust_code
    # the trainer switch with which its runs store in results.json what it would otherwise reopen
    # model.pt for (an experiment that sets it redraws from results.json alone)
    stored_by: str | None = None
    notebook: str | None = None   # analysis/<notebook>.py, the notebook that draws it
    tables: tuple[str, ...] = ()  # the CSVs it writes beside it (the figure's ``fig.tables``)
    # the runs its tests draw it from, declared beside it: (rng) -> results.json payloads
    # (analysis.synthetic.result), or its name in the module, or its dotted path (the built-in
    # figures' are in analysis/synthetic/, one module per figure module)
    synthetic: Callable | str | None = None

    @property
    def experiments(self) -> tuple[str, ...]:
        return () if self.experiment is None else (self.experiment, *self.also)


def figures() -> tuple[FigureSpec, ...]:
    """Every figure the modules of this package declare, by module name then declaration order,
    each with its figure function (and synthetic runs) resolved; ValueError for a name declared
    twice or a function the module lacks."""
    specs: list[FigureSpec] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        module = pkgutil.resolve_name(f"{__name__}.{info.name}")  # imports it
        for spec in getattr(module, "FIGURES", ()):
            draw = spec.draw
            if isinstance(draw, str):
                draw = _function(module, spec.name, draw)
            synthetic = spec.synthetic
            if isinstance(synthetic, str):
                synthetic = _function(module, spec.name, synthetic)
            specs.append(replace(spec, draw=draw, synthetic=synthetic))
    names = [s.name for s in specs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"figure name(s) declared twice: {', '.join(twice)}")
    return tuple(specs)


def _function(module, figure: str, name: str) -> Callable:
    """A declaration's function: `name` in the figure's module, or a dotted path (imported
    here, when the figures are listed); ValueError naming the figure where there is none."""
    if "." in name:
        try:
            found = pkgutil.resolve_name(name)
        except (ImportError, AttributeError, ValueError):
            found = None
    else:
        found = getattr(module, name, None)
    if not callable(found):
        raise ValueError(f"{module.__name__}: figure {figure!r} names no function {name!r}")
    return found


def notebooks() -> list[str]:
    """The notebooks the figures declare (analysis/<name>.py), sorted."""
    return sorted({s.notebook for s in figures() if s.notebook})


def experiments() -> list[str]:
    """The experiments the figures read, in order of first mention."""
    return list(dict.fromkeys(e for s in figures() for e in s.experiments))
