"""A run's label in every figure and table: its mixer's name, plus the model options in which
the runs of that mixer differ within the frame drawn ("dpfp ν=2", "favor m=128", "deltanet
additive").

The options are found, never listed: for each model name, the config.model.* columns whose
values differ among its runs of one sweep (width excluded: it is an axis, not a variant). A
sweep that runs one mixer at one setting labels it by its name alone; a new option or an
outside mixer's model.options.* is labelled the same way the day a sweep varies it. A figure
that draws two sweeps (the SNR figure reads the capacity sweep too) labels each run by what
varies in its own sweep (the folder its run directory sits in, with an experiment's per-rate
sub-sweeps taken together: analysis.lr_edge.experiment_dir), not by how the two differ.
"""
from __future__ import annotations

import re
from pathlib import PurePath

import numpy as np
import pandas as pd

from analysis.lr_edge import experiment_dir

MODEL_PREFIX = "config.model."
WIDTH = "config.model.d_model"
LABEL = "label"
# How an option reads in a label once the mixer's own name is stripped from its key
# (model.dpfp_nu -> nu): the papers' symbols. Any other option reads as key=value. FAVOR+'s
# two counts stay apart: m is its features (the state's key side), projections/d the random
# projections per key dimension that Schlag et al. call m / d (two features each in their form).
SYMBOLS = {"nu": "ν", "features": "m", "per_dim": "projections/d"}


def variant_columns(runs: pd.DataFrame, exclude=(WIDTH,)) -> dict[tuple[str, str], list[str]]:
    """{(sweep, model name): the config.model.* columns whose values differ among its runs};
    sweep is the folder of the run directory ("" without run_dir)."""
    if "model" not in runs.columns:
        return {}
    runs = _with_sweep(runs.drop_duplicates("run_dir") if "run_dir" in runs.columns else runs)
    candidates = [c for c in runs.columns if c.startswith(MODEL_PREFIX)
                  and c not in (f"{MODEL_PREFIX}name", *exclude)]
    out = {}
    for (sweep, model), grp in runs.groupby(["_sweep", "model"], dropna=True):
        out[(sweep, str(model))] = [c for c in candidates if grp[c].map(_text).nunique() > 1]
    return out


def _with_sweep(runs: pd.DataFrame) -> pd.DataFrame:
    sweep = runs["run_dir"].map(lambda d: str(experiment_dir(PurePath(str(d)).parent))) \
        if "run_dir" in runs.columns else ""
    return runs.assign(_sweep=sweep)


def label_runs(rows: pd.DataFrame, exclude=(WIDTH,)) -> pd.DataFrame:
    """``rows`` with a ``label`` column (see the module doc); rows without a model keep NaN."""
    rows = rows.copy()
    if "model" not in rows.columns:
        rows[LABEL] = pd.Series(dtype=object)
        return rows
    varying = variant_columns(rows, exclude)
    key = "run_dir" if "run_dir" in rows.columns else None
    runs = _with_sweep(rows.drop_duplicates(key) if key else rows)
    labels = [_label(run, varying.get((run["_sweep"], str(run["model"])), [])) if pd.notna(run["model"]) else np.nan
              for _, run in runs.iterrows()]
    if key:  # one label per run, every row of the run under it
        rows[LABEL] = rows[key].map(dict(zip(runs[key], labels)))
    else:
        rows[LABEL] = labels
    return rows


def _label(row: pd.Series, columns: list[str]) -> str:
    model = str(row["model"])
    parts = [_option(model, c, row[c]) for c in columns]
    return " ".join([model, *parts])


def _option(model: str, column: str, value) -> str:
    key = column[len(MODEL_PREFIX):]
    key = key[len(model) + 1:] if key.startswith(f"{model}_") else key
    key = key.split(".")[-1]
    if _missing(value):
        return f"{SYMBOLS.get(key, key)}=default"
    if isinstance(value, str):
        return value  # a named variant: "additive"
    return f"{SYMBOLS.get(key, key)}={_text(value)}"


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value))


def _text(value) -> str:
    if _missing(value):
        return "None"
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    if isinstance(value, (np.bool_, bool)):
        return str(bool(value)).lower()
    return f"{value:g}" if isinstance(value, (float, np.floating)) else str(value)


def natural_key(text: str):
    """Sort "favor m=16" before "favor m=128"."""
    return [(0, float(tok), "") if re.fullmatch(r"\d+(\.\d+)?", tok) else (1, 0.0, tok)
            for tok in re.split(r"(\d+(?:\.\d+)?)", str(text))]


def shades(color, count: int) -> list[tuple]:
    """``count`` shades of one colour, dark to light (the mixer's own colour in the middle)."""
    if count <= 1:
        return [tuple(color)]
    rgb = np.asarray(color[:3], dtype=float)
    out = []
    for t in np.linspace(-0.45, 0.45, count):
        out.append(tuple(rgb * (1 + t) if t < 0 else rgb + (1 - rgb) * t))
    return out
