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
# # Re-assignment: the delta rule against its additive control
#
# Keys written several times beyond N = d, the latest value wanted: where Schlag, Irie &
# Schmidhuber (2021) measured the update rule's gain. deltanet and gated_deltanet beside the same
# layers with the delta term removed (`model.rule=additive`), five seeds.
#
# Results come from `$HARNESS_RESULTS/reassignment` (default `results/quick/reassignment`), the
# sweep `python -m harness -m +experiment=reassignment`.

# %% tags=["parameters"]
results_dir = None  # a run or sweep directory; None: $HARNESS_RESULTS/reassignment, else results/quick/reassignment

# %%
# %matplotlib inline
from analysis import params
from analysis.plots.forgetting import forgetting_points, rule_table

results = params.results("reassignment", results_dir)
results.groupby("table").size()

# %% [markdown]
# The paired difference per rule (delta - additive, matched by seed), with its named interval.

# %%
rule_table(forgetting_points(results)[0]).round(3)

# %%
from analysis.plots.forgetting import reassignment_figure

reassignment_figure(results)
