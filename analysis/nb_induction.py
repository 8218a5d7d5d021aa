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
# # Induction: copying the token that followed an earlier occurrence
#
# Random tokens; a token A followed by B appears earlier, and at the later A the model must
# predict B. Accuracy is scored at the induction positions and sliced by the distance between
# the two occurrences of A: a state that forgets loses the pair as the distance grows.
#
# Results come from `$HARNESS_RESULTS/induction` (default `results/quick/induction`), the
# sweep `python -m harness -m +experiment=induction`.

# %% tags=["parameters"]
results_dir = None  # a run or sweep directory; None: $HARNESS_RESULTS/induction, else results/quick/induction

# %%
# %matplotlib inline
from analysis import params
from analysis.plots.induction import induction_figure, induction_rows

results = params.results("induction", results_dir)
results.groupby("table").size()

# %% [markdown]
# Accuracy per mixer (run summaries), then by distance (slices).

# %%
runs, slices = induction_rows(results)  # either may be empty, not both
if not runs.empty:
    display(runs.groupby("model")["summary.accuracy"].agg(["mean", "count"]).round(3))
if not slices.empty:
    display(slices.pivot_table(index="value", columns="model", values="accuracy").round(3))

# %%
induction_figure(results)
