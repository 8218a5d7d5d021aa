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
# # Forgetting: the latest value of a key written twice
#
# `task=forgetting` writes some keys a second time with a new value; the query wants the latest.
# An additive state holds both values at full weight; decay and gating fade the stale one (and
# the untouched keys' only write with it).
#
# Results come from `$HARNESS_RESULTS/forgetting` (default `results/quick/forgetting`), the sweep
# `python -m harness -m +experiment=forgetting`.

# %% tags=["parameters"]
results_dir = None  # a run or sweep directory; None: $HARNESS_RESULTS/forgetting, else results/quick/forgetting

# %%
# %matplotlib inline
from analysis import params
from analysis.plots.forgetting import forgetting_figure, overwrite_gap

results = params.results("forgetting", results_dir)
results.groupby("table").size()

# %% [markdown]
# Accuracy on overwritten and untouched keys per mixer, and the difference.

# %%
overwrite_gap(results).round(3)

# %%
forgetting_figure(results)
