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
# # Cost: memory and time
#
# A linear mixer keeps a fixed state of d*d + d elements per head; softmax keeps a KV cache
# of 2*N*d that grows with every token. In GPT-2 geometry (d = 64 per head) the cache passes
# the state at about N = 32 tokens. The first figure is that accounting (no runs needed);
# the second is the measured time of each form (parallel, chunkwise, recurrent) against
# sequence length, with n and n^2 reference slopes.
#
# Timings come from `$HARNESS_RESULTS/cost` (default `results/quick/cost`), the sweep
# `python -m harness -m +experiment=cost`.

# %% tags=["parameters"]
results_dir = None  # a run or sweep directory; None: $HARNESS_RESULTS/cost, else results/quick/cost
d_head = 64         # per-head width of the first state-against-KV-cache figure (GPT-2's)
d_head_wide = 128   # and of the second

# %%
# %matplotlib inline
from analysis import params
from analysis.plots.cost import cost_figure, cost_rows, cost_slopes, state_figure

state_figure(d_head=params.positive_int("d_head", d_head, maximum=65536))

# %% [markdown]
# At d = 128 the crossover moves to about 64 tokens, and the materialised softmax weights of
# the parallel form reach 10^10 entries per head at N = 100,000.

# %%
state_figure(d_head=params.positive_int("d_head_wide", d_head_wide, maximum=65536))

# %%
results = params.results("cost", results_dir)
rows = cost_rows(results)
rows.pivot_table(index="seq_len", columns=["pass", "family", "form"], values="time_s")

# %% [markdown]
# Fitted exponent of time against n per form: about 2 for the parallel (quadratic) form and
# about 1 for the chunkwise and recurrent forms once n is large enough.

# %%
cost_slopes(rows).round(2)

# %%
cost_figure(results)
