"""Synthetic runs of accuracy against learning rate: the payloads its figure's tests draw it from
(FigureSpec.synthetic).
"""
from __future__ import annotations

import math

import numpy as np

from analysis.synthetic import SEEDS, result


# Learning-rate windows: per (model, layers) the best rate and the half-width (decades) of a bump
# of accuracy over log10(rate); softmax learns everywhere at two layers, mamba in a narrow window,
# softmax with one layer nowhere (best mean 0.05). Five rates, five seeds; mamba at 1e-3 ends at
# max_steps.
WINDOW_RATES = (1e-3, 3.16e-3, 1e-2, 3.16e-2, 1e-1)
WINDOW_CURVES = {("softmax", 2): (1e-2, 5.0, 0.99), ("mamba", 2): (3.16e-3, 0.5, 0.98),
                 ("mamba", 1): (3.16e-3, 0.5, 0.95), ("softmax", 1): (1e-2, 1.0, 0.05)}


def window_accuracy(model: str, layers: int, lr: float) -> float:
    best_lr, half_width, top = WINDOW_CURVES[(model, layers)]
    distance = abs(math.log10(lr / best_lr)) / half_width
    return float(top * max(0.02, 1.0 - distance ** 2 * 0.6))


def lr_window_runs(rng) -> list[dict]:
    runs = []
    for (model, layers) in WINDOW_CURVES:
        for lr in WINDOW_RATES:
            for seed in SEEDS:
                acc = float(np.clip(window_accuracy(model, layers, lr) + 0.01 * rng.standard_normal(), 0, 1))
                stop = "max_steps" if (model, lr) == ("mamba", 1e-3) else "target_accuracy"
                runs.append(result("train", "recall", model,
                                   {"model.d_model": 64, "model.n_layers": layers, "model.short_conv": True,
                                    "model.rule": "delta", "trainer.lr": lr, "seed": seed, "task.num_pairs": 8},
                                   {"accuracy": acc, "val_accuracy": acc, "stop_reason": stop,
                                    "wall_time_s": 10.0 * layers, "cpu_time_s": 9.0 * layers}))
    return runs
