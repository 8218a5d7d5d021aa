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
# # Attention maps: sharp against smeared
#
# One trained run per mixer family (softmax attention, then the first kernel map, decay and
# delta-rule mixer in reading order) on the default recall task, reopened with
# `harness.load_run`: their weights, config and results. One held-out example runs through the
# hook points, and each run's retrieval head's effective weights a_ij (the ones its sharpness
# measurements used) are drawn as query rows against key columns, the position of each query's
# answer circled. Softmax puts nearly all of a query's weight on the answer; the others spread
# it over the prefix, each as its family does.
#
# Runs come from `$HARNESS_RESULTS/sharpness` (default `results/quick/sharpness`), the sweep
# `python -m harness -m +experiment=sharpness` (it keeps each run's model.pt).

# %% tags=["parameters"]
results_dir = None  # a run or sweep directory; None: $HARNESS_RESULTS/sharpness, else results/quick/sharpness

# %%
# %matplotlib inline
import harness
from analysis import params
from analysis.plots.attention import attention_figure, attention_map, trained_runs

results = params.results("sharpness", results_dir)
runs = trained_runs(results)
runs.filter(items=["model", "run_dir", "summary.accuracy", "summary.target_weight", "summary.retrieval_layer",
                   "summary.retrieval_head"])

# %% [markdown]
# One run reopened: the model with its trained weights, its resolved config and its results.

# %%
run = harness.load_run(runs["run_dir"].iloc[0])
run.config.model.name, run.results["summary"]["accuracy"], sum(p.numel() for p in run.model.parameters())

# %% [markdown]
# On each query row, the weight on the answer position against the largest weight elsewhere.

# %%
for run_dir in runs["run_dir"]:
    amap = attention_map(run_dir)
    on_answer = amap.weights[amap.queries, amap.answers]
    print(f"{amap.model:8s} weight on the answer: mean {on_answer.mean():.3f}, "
          f"rows where it is the largest: {(amap.weights[amap.queries].argmax(-1) == amap.answers).mean():.2f}")

# %%
attention_figure(results)
