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
# # Recall against context length
#
# Each mixer is trained on the recall task at a short length and evaluated far past it
# (`task.test_seq_len`), with the number of pairs fixed. An additive state does not care how
# long the zero filler runs, but counts every distractor (`task.filler=random`) as a crosstalk
# write; a decayed state forgets pairs as the queries move away from them. The dashed lines are
# `harness.measure.theory.predicted_length_accuracy` for each run's key dimension and decay.
#
# Results come from `$HARNESS_RESULTS/length` (default `results/quick/length`), the sweep
# `python -m harness -m +experiment=length`.

# %% tags=["parameters"]
results_dir = None  # a run or sweep directory; None: $HARNESS_RESULTS/length, else results/quick/length

# %%
# %matplotlib inline
from analysis import params
from analysis.plots.length import FILLER, length_figure, length_points

results = params.results("length", results_dir)
results.groupby("table").size()

# %% [markdown]
# Accuracy per mixer and evaluation length, in each filler layout.

# %%
points = length_points(results)
points.pivot_table(index=[FILLER, "model"], columns="seq_len", values="accuracy").round(3)

# %% [markdown]
# Peak memory of one evaluation pass per length, and per example of the pass: the chunk forms
# (and softmax's fused kernel) keep it linear in T.

# %%
settings = results[results["table"] == "settings"]
if "peak_mem_bytes" in settings.columns:
    per_example = settings.assign(mb_per_example=settings["peak_mem_bytes"] / settings["examples_per_pass"] / 2**20)
    display(per_example.pivot_table(index="model", columns="seq_len", values="mb_per_example").round(3))

# %%
length_figure(results)
