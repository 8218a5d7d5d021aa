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
# # Needle in a haystack
#
# A few key/value pairs buried at a chosen depth of a haystack of distractor pairs, queried at
# the end (`task=needle`). Each mixer is trained on drawn depths at a short length and evaluated
# on a grid of depths (`task.test_depth`) and lengths (`task.test_seq_len`).
#
# Results come from `$HARNESS_RESULTS/needle` (default `results/quick/needle`), the sweep
# `python -m harness -m +experiment=needle`.

# %% tags=["parameters"]
results_dir = None  # a run or sweep directory; None: $HARNESS_RESULTS/needle, else results/quick/needle

# %%
# %matplotlib inline
from analysis import params
from analysis.plots.needle import needle_figure, needle_points

results = params.results("needle", results_dir)
results.groupby("table").size()

# %% [markdown]
# Mean accuracy over seeds by depth (rows, percent of the context) and length (columns), per
# mixer.

# %%
points = needle_points(results)
points.pivot_table(index=["label", "depth"], columns="seq_len", values="mean").round(3)

# %%
needle_figure(results)
