"""Notebook parameters, checked before they are used: a bad one is one line, not a traceback.

Each analysis notebook (analysis/nb_*.py) starts with a cell tagged `parameters` (papermill's
convention; jupytext keeps the tag) and passes its values through these checks. A
ParameterError renders as a single line in Jupyter (IPython calls `_render_traceback_`) and is
a ValueError everywhere else.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.loader import NoResultsError, find_results, load_all, results_root


class ParameterError(ValueError):
    """A notebook parameter that cannot work."""

    def _render_traceback_(self) -> list[str]:  # IPython shows this instead of a traceback
        return [f"ParameterError: {self}"]


def results(experiment: str, results_dir: str | Path | None = None) -> pd.DataFrame:
    """The long results frame of a notebook's experiment (analysis.loader.load_all) from
    ``results_dir``, else $HARNESS_RESULTS/<experiment>, else results/quick/<experiment>."""
    if results_dir is not None and not isinstance(results_dir, (str, Path)):
        raise ParameterError(f"results_dir must be a path or None, got {results_dir!r}")
    path = Path(results_dir) if results_dir is not None else results_root() / experiment
    where = "results_dir" if results_dir is not None else "$HARNESS_RESULTS (or results/quick)"
    try:
        find_results(path)
    except NoResultsError as err:
        raise ParameterError(f"{where}: {err}; run `python -m harness -m +experiment={experiment}` "
                             f"or point results_dir at its sweep") from None
    return load_all(path)


def positive_int(name: str, value: object, *, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (maximum and value > maximum):
        bound = f" at most {maximum:,}" if maximum else ""
        raise ParameterError(f"{name} must be a positive integer{bound}, got {value!r}")
    return value
