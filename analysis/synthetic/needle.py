"""Synthetic runs of needle in a haystack: the payloads its figure's tests draw it from
(FigureSpec.synthetic).
"""
from __future__ import annotations

from analysis.synthetic import result


def needle_runs(rng) -> list[dict]:
    runs = []
    for model, reach in {"softmax": 1e9, "elu": 2000.0, "retnet": 300.0, "gated_deltanet": 5000.0}.items():
        for seed in (0, 1):
            slices = []
            for t in (64, 256, 1024):
                for depth in (0, 25, 50, 75, 100):
                    distance = (1 - depth / 100) * t
                    slices.append({"slice": "depth", "value": depth, "seq_len": t, "count": 64,
                                   "accuracy": float(1 / (1 + distance / reach)) * (1 - 0.02 * seed)})
            runs.append(result("train", "needle", model, {"model.d_model": 64, "task.seq_len": 64, "seed": seed},
                               {"accuracy": 0.8}, slices=slices))
    return runs
