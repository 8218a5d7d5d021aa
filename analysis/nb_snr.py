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
# # SNR: measured against predicted
#
# The crosstalk law predicts SNR = sqrt(d/N) for the read vector of a d-dimensional state
# holding N pairs. The untrained probe measures it with random keys (its own setting);
# trained runs measure it per head by splitting each read-out into the target's term and
# the rest. On log-log axes the law is the diagonal: a fitted slope of 1 and prefactor 1.
#
# Trained runs (filled markers) come from the capacity sweep, beside the probe (hollow). The
# right panel tests the trained law out of sample: the kernel statistics measured once at a
# run's training N predict its accuracy at every other N it is tested at.
#
# Results come from `$HARNESS_RESULTS/snr` and `$HARNESS_RESULTS/capacity` (default
# `results/quick/...`), the sweeps `python -m harness -m +experiment=snr` and `capacity`.

# %% tags=["parameters"]
results_dir = None  # a run or sweep directory; None: $HARNESS_RESULTS/snr, else results/quick/snr

# %%
# %matplotlib inline
import pandas as pd

from analysis import params
from analysis.loader import results_root
from analysis.plots.snr import fit_slopes, out_of_sample_points, out_of_sample_table, snr_figure, snr_points

results = params.results("snr", results_dir)
if results_dir is None and (results_root() / "capacity").exists():  # the trained runs beside the probe
    results = pd.concat([results, params.results("capacity")], ignore_index=True)
results.groupby("table").size()

# %% [markdown]
# The probe table: one row per (mixer, d, N).

# %%
probe = results[results["table"] == "probe"]
probe.filter(items=["model", "d", "n", "snr_measured", "snr_predicted", "acc_measured", "acc_predicted"])

# %% [markdown]
# Fitted slope and prefactor of log measured on log predicted SNR, per source and mixer.

# %%
points = snr_points(results)
fit_slopes(points).round(3)

# %% [markdown]
# Out of sample: per mixer, training N and tested N, the predicted accuracy and the measured
# one (n, mean, interval, seeds).

# %%
oos = out_of_sample_points(results)
out_of_sample_table(oos).round(3) if len(oos) else "no acc_predicted_from_train in these results"

# %%
snr_figure(results)
