"""Synthetic runs of the induction sweep: the payloads its figure's tests draw it from
(FigureSpec.synthetic).
"""
from __future__ import annotations

import numpy as np

from analysis.synthetic import result


def induction_runs(rng) -> list[dict]:
    runs = []
    for model, reach in {"softmax": 1000.0, "elu": 64.0, "mamba": 16.0, "deltanet": 100.0}.items():
        for seed in (0, 1):
            for lr in (3e-3, 1e-2):
                scale = (1.0 if lr == 3e-3 else 0.8) * (0.98 + 0.02 * seed)
                slices = [{"slice": "distance", "value": dist, "seq_len": 256,
                           "accuracy": scale / (1 + dist / reach), "loss": 0.1, "count": 64}
                          for dist in (1, 4, 16, 64, 128)]
                accuracy = float(np.mean([s["accuracy"] for s in slices]))
                summary = {"accuracy": accuracy, "val_accuracy": accuracy}
                runs.append(result("train", "induction", model,
                                   {"model.d_model": 32, "seed": seed, "trainer.lr": lr},
                                   summary, slices=slices))
    return runs
