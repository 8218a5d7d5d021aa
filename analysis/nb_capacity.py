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
# the interference task is laid against N at equal width and against N / d_key, with the
# accuracy predicted from each mixer's own trained statistics (harness.measure.trained_theory)
# over it. Learning rates are chosen per point on the validation split; intervals are 95%
# bootstrap intervals over seeds.
#
# Results come from `$HARNESS_RESULTS/capacity` (default `results/quick/capacity`), the sweep
# `python -m harness -m +experiment=capacity`.

# %% tags=["parameters"]
results_dir = None  # a run or sweep directory; None: $HARNESS_RESULTS/capacity, else results/quick/capacity

# %%
# %matplotlib inline
from analysis import params
from analysis.plots.capacity import capacity_figure, capacity_selected, half_capacity_table, predicted_points

results = params.results("capacity", results_dir)
results.groupby("table").size()

# %% [markdown]
# One row per run: which finished, and the key dimension d of each mixer's state.

# %%
runs = results[results["table"] == "runs"]
runs.filter(items=["run_dir", "model", "status", "error", "summary.d_key", "summary.accuracy"])

# %% [markdown]
# Accuracy by N and mixer at the learning rate chosen on validation, mean over seeds; and every
# learning rate's mean validation and test accuracy.

# %%
selected, per_lr = capacity_selected(results)
selected.pivot_table(index="value", columns="model", values="accuracy").round(3)

# %%
per_lr.round(3)

# %% [markdown]
# N at 50% accuracy, measured and predicted from the trained statistics (ratio = predicted /
# measured).

# %%
half_capacity_table(selected, predicted_points(results, selected)).round(2)

# %%
capacity_figure(results)
