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
# to beat the other candidates, so recall survives past N = d. At Schlag et al.'s protocol one
# model is trained per N and tested at that N; the runs trained at one reference N are also
# tested at every other N, beside the accuracy their kernel statistics, measured once at the
# training N, predict there (out of sample). Learning rates are chosen per mixer, width and
# training N on the validation split. Every point shows its seeds; an interval is drawn only
# from five seeds (analysis.stats names its method).
#
# Results come from `$HARNESS_RESULTS/capacity` (default `results/quick/capacity`), the sweep
# `python -m harness -m +experiment=capacity`.

# %% tags=["parameters"]
results_dir = None  # a run or sweep directory; None: $HARNESS_RESULTS/capacity, else results/quick/capacity

# %%
# %matplotlib inline
from analysis import params, stats
from analysis.plots.capacity import (capacity_figure, capacity_points, capacity_selected, half_capacity_table,
                                     predicted_points, protocol_rows, readout_points, reference_n, run_labels,
                                     schlag_table)

results = params.results("capacity", results_dir)
results.groupby("table").size()

# %% [markdown]
# One row per run: which finished, its training N, and the key dimension and state size of
# each mixer.

# %%
runs = results[results["table"] == "runs"]
runs.filter(items=["run_dir", "model", "status", "error", "config.task.num_pairs", "summary.d_key",
                   "summary.state_elements_per_layer", "summary.accuracy"])

# %% [markdown]
# The protocol: accuracy at test N = training N per mixer (label) at the learning rate chosen on
# validation, with n, the mean, the interval and every seed; then every learning rate's result.

# %%
selected, per_lr = capacity_selected(results)
stats.summarize(protocol_rows(selected), ["label", "value"], "accuracy", count="count").round(3)

# %%
per_lr.round(3)

# %% [markdown]
# N at 50% accuracy: of the protocol, of the extrapolation from the reference training N
# measured and predicted out of sample, and the ratios; then beside Schlag et al.'s break points.

# %%
ref = reference_n(capacity_points(results))
labels = run_labels(selected[selected["train_n"] == ref])
half = half_capacity_table(selected, predicted_points(results, labels), readout_points(results, labels), ref)
half.round(2)

# %%
schlag_table(half, selected)

# %%
capacity_figure(results)
