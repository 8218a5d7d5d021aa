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
# # The anatomy of recall: gather and aggregate heads
#
# Which heads gather (bind a key to its value at the value token) and which aggregate (read the
# bound value at the query), by criteria fixed before the runs (analysis.gather_aggregate, after
# Bick, Xing & Gu 2025): 2-layer models of 4 heads, softmax, gated_deltanet and a hybrid of the
# two, with the short convolution and without it. Each run's own ablation rows (trainer.ablate:
# zero, mean and resample ablation, patching under three corruptions, path patching, each head's
# weights; harness.measure.ablate) are in its results.json; a run without them is reopened.
#
# Results come from `$HARNESS_RESULTS/anatomy` (default `results/quick/anatomy`), the sweep
# `python -m harness -m +experiment=anatomy`.

# %% tags=["parameters"]
results_dir = None  # a run or sweep directory; None: $HARNESS_RESULTS/anatomy, else results/quick/anatomy

# %%
# %matplotlib inline
from analysis import params
from analysis.gather_aggregate import Criteria
from analysis.plots.anatomy import ablation_rows, anatomy_figure, anatomy_tables, trained_runs

results = params.results("anatomy", results_dir)
results.groupby("table").size()

# %% [markdown]
# Every head of every run with the numbers the criteria read and the roles it meets; then each
# run's A and G candidates.

# %%
found = anatomy_tables(ablation_rows(results), Criteria.of_runs(trained_runs(results)))
found["heads"][["label", "layer", "head", "necessity_resample", "necessity_zero", "necessity_mean",
                "restore_query", "restore_key", "value_on_key", "query_on_answer", "is_A", "is_G"]].round(3)

# %%
found["candidates"][["label", "A_layer", "A_head", "A_is", "G_layer", "G_head", "G_is", "G_path", "ga"]].round(3)

# %%
anatomy_figure(results)
