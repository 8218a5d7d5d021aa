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
# # Re-assignment as a 2x2: the delta rule against its additive control
#
# Keys written twice, the latest value wanted, where Schlag, Irie & Schmidhuber (2021) measured
# the update rule's gain: overwritten and untouched keys in the same runs, the delta rule beside
# the same layer with the delta term removed (`model.options.rule=additive`), five seeds. The interaction
# (the rule's gain on overwritten keys minus its gain on untouched ones) tells replacing a stale
# value apart from cancelling crosstalk in general; the stale share says how many of a rule's
# wrong answers on overwritten keys are the key's earlier value.
#
# Results come from `$HARNESS_RESULTS/reassignment` (default `results/quick/reassignment`), the
# sweep `python -m harness -m +experiment=reassignment` (`findings/reassignment` for both pairs,
# each mixer at its own chosen rate).

# %% tags=["parameters"]
results_dir = None  # a run or sweep directory; None: $HARNESS_RESULTS/reassignment, else results/quick/reassignment

# %%
# %matplotlib inline
from analysis import params
from analysis.plots.forgetting import reassignment_runs, two_by_two

results = params.results("reassignment", results_dir)
kinds, runs, how = reassignment_runs(results)
print("rates:", how)

# %% [markdown]
# The 2x2 per delta-rule mixer: each cell, the gains paired by seed, their interaction and the
# stale share, each with its named interval.

# %%
two_by_two(kinds, runs, how)[["model", "quantity", "n", "mean", "low", "high", "interval_method"]].round(3)

# %%
from analysis.plots.forgetting import reassignment_figure

reassignment_figure(results)
