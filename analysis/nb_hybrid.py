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
# # Hybrid stacks under pressure
#
# Four-layer stacks of one recurrent mixer with attention layers in chosen slots
# (`model.layers=[gated_deltanet,gated_deltanet,gated_deltanet,softmax]`), trained on a recall
# mixture that reaches past a pure recurrent stack's capacity: how much attention, and where,
# recall needs in distribution, and what each attention layer costs in decoding memory (its KV
# cache grows with length).
#
# Results come from `$HARNESS_RESULTS/hybrid` (default `results/quick/hybrid`), the sweep
# `python -m harness -m +experiment=hybrid`.

# %% tags=["parameters"]
results_dir = None  # a run or sweep directory; None: $HARNESS_RESULTS/hybrid, else results/quick/hybrid

# %%
# %matplotlib inline
from analysis import params
from analysis.plots.hybrid import hybrid_figure, hybrid_points, hybrid_rows, hybrid_summary

results = params.results("hybrid", results_dir)
results.groupby("table").size()

# %% [markdown]
# Mean recall over seeds per recurrent mixer (rows) and attention pattern (columns: `k@i`, k
# attention layers at layers i), then against the attention share with the mean decoding memory
# (bytes), then what one attention layer adds and how recall follows the attention share.

# %%
rows = hybrid_rows(results)
by_pattern, by_count = hybrid_points(rows)
by_pattern.pivot_table(index="recurrent", columns="pattern", values="mean").round(3)

# %%
by_count[["recurrent", "attention_share", "n", "mean", "runs_at_max_steps", "memory_bytes"]].round(3)

# %%
hybrid_summary(rows).round(3)

# %%
hybrid_figure(results)
