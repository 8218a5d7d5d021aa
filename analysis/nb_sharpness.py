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
# # Sharpness: how much weight lands on the right key
#
# Softmax can put almost all its weight on one key; a bounded positive feature map smears
# it over the prefix. From the effective weights a_ij of each mixer the run measures, per
# layer and head: entropy (and entropy over log of the prefix length), effective support,
# maximum weight, and the weight on the correct key with its rank.
#
# Results come from `$HARNESS_RESULTS/sharpness` (default `results/quick/sharpness`), the
# sweep `python -m harness -m +experiment=sharpness`.

# %% tags=["parameters"]
results_dir = None  # a run or sweep directory; None: $HARNESS_RESULTS/sharpness, else results/quick/sharpness

# %%
# %matplotlib inline
from analysis import params
from analysis.plots.sharpness import sharpness_figure, sharpness_rows

results = params.results("sharpness", results_dir)
results.groupby("table").size()

# %% [markdown]
# Mean of each measurement per mixer, over layers, heads, slices and seeds.

# %%
rows = sharpness_rows(results)
metrics = ["entropy", "norm_entropy", "eff_support", "max_weight", "target_weight", "target_rank",
           "monotonicity"]
rows.groupby("model")[[m for m in metrics if m in rows.columns]].mean().round(3)

# %%
sharpness_figure(results)
