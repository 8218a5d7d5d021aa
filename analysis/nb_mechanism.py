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
# # Where each mixer binds a key to its value
#
# Interchange interventions by position (Arora et al. 2025): every run of the mechanism sweep
# (2 layers, short convolution on and off) corrupted the queried pair's key, or its value, at
# the end of training and restored the clean hidden state at one layer, component and position
# role at a time (`trainer.intervene=true`, harness.measure.intervene); the rule of
# harness.measure.mechanism, fixed before the runs, named each run's mechanism from its map.
# `python -m harness mode=intervene intervene.run=<run>` prints the same table for one run.
#
# Results come from `$HARNESS_RESULTS/mechanism` (default `results/quick/mechanism`), the sweep
# `python -m harness -m +experiment=mechanism`.

# %% tags=["parameters"]
results_dir = None  # a run or sweep directory; None: $HARNESS_RESULTS/mechanism, else results/quick/mechanism

# %%
# %matplotlib inline
from analysis import params
from analysis.plots.mechanism import label_table, mechanism_figure, mechanism_points, mechanism_rows

results = params.results("mechanism", results_dir)
results.groupby("table").size()

# %% [markdown]
# The label the rule gave each seed, per mixer and short-convolution arm.

# %%
points = mechanism_points(mechanism_rows(results))
label_table(points)

# %% [markdown]
# The key-corruption map of each arm: the mean share of the answer restored at the value token
# (binding there: induction after a block, or inside the mixer's write by its short convolution)
# and at the query.

# %%
key = points[(points["corrupt"] == "key") & points["role"].isin(["value", "between", "query"])]
key.pivot_table(index=["label", "short_conv", "layer", "component"], columns="role", values="mean").round(2)

# %%
mechanism_figure(results)
