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
# # Learning-rate windows on MQAR
#
# Okpekpe & Orvieto (2025) report that recurrent mixers learn associative recall only inside a
# narrow window of learning rates while attention learns across a broad one, and that one
# attention layer does not solve MQAR where one well-tuned Mamba layer does. Each mixer's test
# accuracy at every rate, one and two layers; its window is the rates where its mean over seeds
# reaches 0.9 of its best (`analysis.windows`).
#
# Results come from `$HARNESS_RESULTS/lr_window` (default `results/quick/lr_window`), the sweep
# `python -m harness -m +experiment=lr_window` (`findings/lr_window` for the five-seed grid).

# %% tags=["parameters"]
results_dir = None  # a run or sweep directory; None: $HARNESS_RESULTS/lr_window, else results/quick/lr_window

# %%
# %matplotlib inline
from analysis import params, windows
from analysis.plots.lr_window import lr_window_figure, points_table, window_points

results = params.results("lr_window", results_dir)
runs = window_points(results)
runs.groupby(["label", "n_layers"]).size()

# %% [markdown]
# Each mixer's window per depth: its edges, its width in decades (with its interval from five
# seeds), whether it is open at an end of the rates tried.

# %%
windows.windows_table(runs).round(3)

# %% [markdown]
# Every point (mixer, depth, rate) with its seeds and the runs that ended at max_steps.

# %%
points_table(runs).round(3)

# %%
lr_window_figure(results)
