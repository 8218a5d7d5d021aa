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
# # Recall against state size
#
# MQAR accuracy against the bytes of state one layer keeps (Based's and Zoology's frontier):
# every mixer across widths and q/k (feature) widths, softmax at its KV cache. The mixers are
# those the sweep runs: every built-in but those the `model` line of
# `harness/conf/experiment/frontier.yaml` excludes, plus the variants it appends.
#
# Results come from `$HARNESS_RESULTS/frontier` (default `results/quick/frontier`), the sweep
# `python -m harness -m +experiment=frontier`.

# %% tags=["parameters"]
results_dir = None  # a run or sweep directory; None: $HARNESS_RESULTS/frontier, else results/quick/frontier

# %%
# %matplotlib inline
from analysis import params
from analysis.plots.frontier import frontier_figure, frontier_points

results = params.results("frontier", results_dir)
results.groupby("table").size()

# %% [markdown]
# One row per run: its setting, state bytes per layer and accuracy.

# %%
points = frontier_points(results)
points.filter(items=["model", "setting", "state_bytes_per_layer", "summary.accuracy"]).sort_values(
    ["model", "state_bytes_per_layer"])

# %%
frontier_figure(results)
