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
# # Capacity: how many pairs fit in a linear state
#
# N key/value pairs superposed in a d-dimensional state give a signal of 1 and crosstalk of
# about sqrt(N/d), so SNR = sqrt(d/N). Top-1 recall is not the SNR: the correct value only has
# to beat the other candidates, so recall survives past N = d. Here each mixer's accuracy on
# the interference task is laid against N/d, with harness.measure.theory's predicted accuracy over it.
#
# Results come from `$HARNESS_RESULTS/capacity` (default `results/quick/capacity`), the sweep
# `python -m harness -m +experiment=capacity`.

# %% tags=["parameters"]
results_dir = None  # a run or sweep directory; None: $HARNESS_RESULTS/capacity, else results/quick/capacity

# %%
# %matplotlib inline
from analysis import params
from analysis.plots.capacity import capacity_figure, capacity_points

results = params.results("capacity", results_dir)
results.groupby("table").size()

# %% [markdown]
# One row per run: which finished, and the key dimension d of each mixer's state.

# %%
runs = results[results["table"] == "runs"]
runs.filter(items=["run_dir", "model", "status", "error", "summary.d_key", "summary.accuracy"])

# %% [markdown]
# Accuracy by N/d and mixer, mean over seeds.

# %%
points = capacity_points(results)
points.pivot_table(index="n_over_d", columns="model", values="accuracy").round(3)

# %%
capacity_figure(results)
