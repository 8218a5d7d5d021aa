"""Synthetic runs of forgetting, and re-assignment (the delta rule against its additive control):
the payloads its figure's tests draw it from (FigureSpec.synthetic).
"""
from __future__ import annotations

import math

import numpy as np

from analysis.synthetic import SEEDS, result


def forgetting_runs(rng) -> list[dict]:
    runs = []
    mixers = {"softmax": ("softmax", {}, 0.98, 0.95), "elu": ("elu", {}, 0.9, 0.45),
              "retnet": ("retnet", {}, 0.7, 0.85), "deltanet delta": ("deltanet", {"model.rule": "delta"}, 0.95, 0.9),
              "deltanet additive": ("deltanet", {"model.rule": "additive"}, 0.9, 0.5)}
    for _, (model, options, untouched, overwritten) in mixers.items():
        for seed in (0, 1):
            shift = -0.02 * seed
            slices = [{"slice": "overwritten", "value": 0, "seq_len": 64, "accuracy": untouched + shift, "count": 128},
                      {"slice": "overwritten", "value": 1, "seq_len": 64, "accuracy": overwritten + shift, "count": 128}]
            slices += [{"slice": "age", "value": age, "seq_len": 64, "count": 32,
                        "accuracy": float(np.clip((untouched + overwritten) / 2 - 0.05 * math.log2(age) + shift, 0, 1))}
                       for age in (1, 2, 4, 8, 16, 32)]
            runs.append(result("train", "forgetting", model,
                               {"model.d_model": 64, "task.num_overwrites": 2, "seed": seed, "model.rule": None, **options},
                               {"accuracy": (untouched + overwritten) / 2}, slices=slices))
    return runs


# Re-assignment as a 2x2: (model, rule) -> (untouched, overwritten); deltanet's rule gains on
# overwritten keys by REASSIGNMENT_GAIN and not on untouched ones (the interaction), gated_deltanet's
# ties its control; an additive control's wrong answers on overwritten keys are the stale value
# in the share STALE_SHARE, the delta rule's in none. Each rule at its own rate (REASSIGNMENT_LR);
# one deltanet_additive seed ends at max_steps.
REASSIGNMENT = {("deltanet", "delta"): (0.9, 0.9), ("deltanet", "additive"): (0.9, 0.6),
                ("gated_deltanet", "delta"): (0.8, 0.7), ("gated_deltanet", "additive"): (0.8, 0.7)}
REASSIGNMENT_GAIN = 0.3
REASSIGNMENT_LR = {"delta": 3e-3, "additive": 1e-2}
STALE_SHARE = {"delta": 0.0, "additive": 0.9}


def reassignment_runs(rng) -> list[dict]:
    runs = []
    for (model, rule), (untouched, overwritten) in REASSIGNMENT.items():
        for seed in SEEDS:
            shift, shift_over = 0.02 * rng.standard_normal(2)
            count = 256
            hits = round(count * (overwritten + shift_over))
            slices = [{"slice": "overwritten", "value": 0, "seq_len": 48, "accuracy": untouched + shift,
                       "count": count, "stale": 0},
                      {"slice": "overwritten", "value": 1, "seq_len": 48, "accuracy": hits / count,
                       "count": count, "stale": round(STALE_SHARE[rule] * (count - hits))}]
            stop = "max_steps" if (model, rule, seed) == ("deltanet", "additive", 4) else "plateau"
            runs.append(result("train", "forgetting", model,
                               {"model.d_model": 32, "model.qk_dim": 8, "task.num_pairs": 8,
                                "task.num_overwrites": 4, "seed": seed, "model.rule": rule,
                                "trainer.lr": REASSIGNMENT_LR[rule]},
                               {"accuracy": (untouched + overwritten) / 2, "stop_reason": stop,
                                "val_accuracy": (untouched + overwritten) / 2}, slices=slices))
    return runs
