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
# # MQAR: recall against model width
#
# Multi-query associative recall (the Zoology layout) at several sequence lengths and numbers
# of pairs. Each point is the best accuracy over the learning rates swept (mean over seeds
# first), as in Zoology's figures: a mixer is judged at its own best setting.
#
# Results come from `$HARNESS_RESULTS/mqar` (default `results/quick/mqar`), the sweep
# `python -m harness -m +experiment=mqar`.

# %% tags=["parameters"]
results_dir = None  # a run or sweep directory; None: $HARNESS_RESULTS/mqar, else results/quick/mqar

# %%
# %matplotlib inline
from analysis import params
from analysis.plots.common import select_on_validation
from analysis.plots.mqar import POINT, WIDTH, best_over_lr, mqar_figure, mqar_points, width_trend

results = params.results("mqar", results_dir)
results.groupby("table").size()

# %% [markdown]
# Best accuracy per mixer and width (columns: sequence length, pairs), and the learning rate
# that gave it.

# %%
points = mqar_points(results)
best = best_over_lr(points)
best.pivot_table(index=["label", WIDTH], columns=["seq_len", "pairs"], values="accuracy").round(3)

# %%
best.pivot_table(index=["label", WIDTH], columns=["seq_len", "pairs"], values="best_lr")

# %% [markdown]
# Whether accuracy changes with width: a paired t-test across seeds against the next narrower
# width, per mixer and setting.

# %%
picked, _ = select_on_validation(points, POINT)
width_trend(picked).filter(items=["label", "seq_len", "pairs", WIDTH, "n", "mean", "vs_width", "diff",
                                  "p_value", "loses_with_width", "gains_with_width"]).round(4)

# %%
mqar_figure(results)
