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
# # The anatomy of recall
#
# Which head carries recall: each trained run of the anatomy sweep (softmax, gated_deltanet and
# a hybrid of the two, 2 layers of 2 heads) is reopened and each layer and head ablated (zero
# and mean ablation) and patched from clean into key-swapped examples, by the function
# `python -m harness mode=ablate ablate.run=<run>` runs (harness.measure.ablate).
#
# Results come from `$HARNESS_RESULTS/anatomy` (default `results/quick/anatomy`), the sweep
# `python -m harness -m +experiment=anatomy`.

# %% tags=["parameters"]
results_dir = None  # a run or sweep directory; None: $HARNESS_RESULTS/anatomy, else results/quick/anatomy

# %%
# %matplotlib inline
from analysis import params
from analysis.plots.anatomy import ablation_rows, anatomy_figure, anatomy_points, sharpness

results = params.results("anatomy", results_dir)
results.groupby("table").size()

# %% [markdown]
# Recall lost per head (mean over seeds), by ablation kind, beside each head's weight on the
# correct key; then the fraction of the clean logit difference each head restores when patched.

# %%
drops, patched = anatomy_points(ablation_rows(results), sharpness(results))
drops.pivot_table(index=["model", "layer", "head"], columns="kind", values="mean").join(
    drops.groupby(["model", "layer", "head"])["target_weight"].first()).round(3)

# %%
patched[["model", "layer", "head", "n", "mean"]].round(3)

# %%
anatomy_figure(results)
