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
# # Learning curves: training limit or capacity limit
#
# A mixer that ends below another may not have learnt yet (a training limit) or may have learnt
# all its state holds (a capacity limit). Validation accuracy against step, from each run's
# metrics.jsonl, on the default recall task (the sharpness sweep) and on the capacity task
# (the capacity sweep's runs at its reference training N). Runs may stop early on a plateau
# (summary.stop_reason); each seed's curve ends where its run stopped.
#
# Results come from `$HARNESS_RESULTS/sharpness` and `$HARNESS_RESULTS/capacity` (default
# `results/quick/...`), the sweeps `python -m harness -m +experiment=sharpness` and `capacity`.

# %% tags=["parameters"]
results_dir = None  # a run or sweep directory; None: $HARNESS_RESULTS/sharpness (and capacity), else results/quick/...

# %%
# %matplotlib inline
import pandas as pd

from analysis import params
from analysis.loader import results_root
from analysis.plots.learning import learning_figure, learning_rows, steps_to

results = params.results("sharpness", results_dir)
if results_dir is None and (results_root() / "capacity").exists():  # the capacity task beside it
    results = pd.concat([results, params.results("capacity")], ignore_index=True)
results.groupby("table").size()

# %% [markdown]
# The first step at which each seed reached 0.9 validation accuracy ("never" where it did not),
# the mean over seeds where all did, and the steps each run trained.

# %%
steps_to(learning_rows(results))

# %%
learning_figure(results)
