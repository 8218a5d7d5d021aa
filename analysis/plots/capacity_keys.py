"""The state apart from the embedding: how N at 50% of a wide model scales with its key width
(model.qk_dim set apart from model.d_model), and how much of a narrow model's number is its
embedding's.

From the capacity figure's break-point rows (capacity_n50.csv: one per mixer, width and key
width, with each seed's N at 50%), per mixer whatever its key width (``base_label``):

  n50_narrow         N at 50% of the narrow model, whose width is its key width (the quick
                     grid's d = 8): its embedding is as narrow as its state
  wide_over_narrow   the wide model's N at 50% at that key width over the narrow model's
                     (analysis.scaling.ratio, an interval over seeds): the size of the
                     embedding's confound, 1 where there is none
  n50_ratio          N at 50% of the wide model at its largest key width over the next
                     (n50_ratio_of: "16/8"), with its interval
  n50_exponent       the exponent of N at 50% against the key width through every wide key
                     width, with its interval (analysis.scaling.exponent); the crosstalk law,
                     SNR^2 = d_key / N at a fixed value side, says LAW_EXPONENT

Every number rests on the seeds' own N at 50%; a seed that never fell to 50% leaves it NaN, and
the method column says why.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis import scaling, stats
from analysis.plots.common import WIDTH

LAW_EXPONENT = 1.0


def _seeds(row: pd.Series) -> np.ndarray:
    return stats.seed_values(row)


def _is_narrow(half: pd.DataFrame) -> pd.Series:
    return pd.Series(np.isclose(half[WIDTH].astype(float), half["qk_dim"].astype(float)), index=half.index)


def key_width_table(half: pd.DataFrame) -> pd.DataFrame:
    """One row per base_label with a wide model (width above its key width): the columns of the
    module docstring; empty where no mixer was run at a key width set apart."""
    if half.empty or not {"base_label", "qk_dim", WIDTH}.issubset(half.columns):
        return pd.DataFrame(columns=["base_label"])
    narrow = _is_narrow(half)
    rows = []
    for base, grp in half.groupby("base_label"):
        wide = grp[~narrow.loc[grp.index]].sort_values("qk_dim")
        if wide.empty:
            continue
        row = {"base_label": base, "key_widths": "/".join(f"{k:g}" for k in wide["qk_dim"]),
               "law_exponent": LAW_EXPONENT}
        thin = grp[narrow.loc[grp.index]]
        same = wide[wide["qk_dim"].isin(thin["qk_dim"])]
        if len(thin) and len(same):
            w, t = same.iloc[0], thin[thin["qk_dim"] == same.iloc[0]["qk_dim"]].iloc[0]
            row.update({"narrow_width": t[WIDTH], "n50_narrow": t["mean"], "n50_wide_same_key": w["mean"],
                        **scaling.ratio(_seeds(w), _seeds(t)).as_row("wide_over_narrow")})
        if len(wide) >= 2:
            top, below = wide.iloc[-1], wide.iloc[-2]
            row.update({"n50_ratio_of": f"{top['qk_dim']:g}/{below['qk_dim']:g}",
                        **scaling.ratio(_seeds(top), _seeds(below)).as_row("n50_ratio"),
                        **scaling.exponent(wide["qk_dim"], [_seeds(r) for _, r in wide.iterrows()])
                        .as_row("n50_exponent")})
            low, high = row["n50_exponent_low"], row["n50_exponent_high"]
            row["exponent_excludes_law"] = bool(not (low <= LAW_EXPONENT <= high)) \
                if math.isfinite(low) and math.isfinite(high) else math.nan
        rows.append(row)
    return pd.DataFrame(rows)
