# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # The law's pre-registered predictions
#
# The findings capacity experiment trains its wide model at key width 8 first; from those runs'
# statistics `python -m analysis.preregister --write` writes, into the experiment files and
# before the runs they predict, the law's and both naive baselines' accuracy at the other key
# widths and the decayed mixer's recall against length. Here every predicted setting meets what
# its runs then measured, each source's error in log-odds, and the verdict (a win only by more
# than the margin the files fix).
#
# Results come from `$HARNESS_RESULTS/capacity_length` and `.../capacity` (the findings profile:
# `results/findings`), the sweeps `python -m harness -m +experiment=findings/capacity_length` and
# `+experiment=findings/capacity`.

# %% tags=["parameters"]
results_dir = None  # the length sweep's directory; None: $HARNESS_RESULTS/capacity_length
capacity_dir = None  # the capacity sweep's directory; None: $HARNESS_RESULTS/capacity (left out if absent)

# %%
# %matplotlib inline
import pandas as pd

from analysis import params
from analysis.plots.law import law_figure, law_table

results = params.results("capacity_length", results_dir)
try:
    results = pd.concat([results, params.results("capacity", capacity_dir)], ignore_index=True)
except params.ParameterError:
    pass  # the length sweep alone
results.groupby("table").size()

# %% [markdown]
# Every setting (row "setting": predicted, measured, errors, verdict) and each mixer's verdict
# over its discriminating settings (row "summary").

# %%
table = law_table(results)
table[["row", "part", "model", "qk_dim", "num_pairs", "seq_len", "law", "nominal", "anchored", "n", "mean",
       "err_law_logodds", "err_nominal_logodds", "err_anchored_logodds", "verdict"]].round(3)

# %%
law_figure(results)
