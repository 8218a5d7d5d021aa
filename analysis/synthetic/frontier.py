"""Synthetic runs of the recall-state frontier, trained on a mixture: the payloads its figure's
tests draw it from (FigureSpec.synthetic).
"""
from __future__ import annotations

import numpy as np

from analysis.synthetic import linear_accuracy, result


# Frontier (Based): trained on a mixture of (seq_len, pairs), tested up to larger settings.
FRONTIER_MIXTURE = [[64, 4], [128, 16]]
FRONTIER_TESTS = ((64, 4), (128, 16), (256, 32), (512, 64))


def frontier_runs(rng) -> list[dict]:
    runs = []
    longest = FRONTIER_TESTS[-1][0]
    mixers = {"softmax": ("softmax", {}, lambda d: 2 * longest * d, 0.0),
              "swa": ("swa", {}, lambda d: 2 * 32 * d, 1.5),
              "elu": ("elu", {}, lambda d: d * d + d, 0.8),
              "taylor": ("taylor", {}, lambda d: 273 * d + 273, 0.3),
              "deltanet delta": ("deltanet", {"model.rule": "delta"}, lambda d: d * d, 0.25),
              "deltanet additive": ("deltanet", {"model.rule": "additive"}, lambda d: d * d, 0.8)}
    for _, (model, options, per_width, softness) in mixers.items():
        for d_model in (32, 64):
            for seed in (0, 1):
                elements = per_width(d_model)
                settings = []
                for seq_len, pairs in FRONTIER_TESTS:
                    acc = linear_accuracy(pairs * 64 / elements ** 0.5 / 8, softness) * (1 - 0.02 * seed)
                    settings.append({"name": f"seq_len={seq_len},num_pairs={pairs}", "seq_len": seq_len,
                                     "accuracy": acc, "loss": 1 - acc, "count": 256})
                config = {"model.d_model": d_model, "model.n_layers": 2, "model.qk_dim": None, "seed": seed,
                          "model.rule": None, "task.mixture": FRONTIER_MIXTURE, **options}
                summary = {"accuracy": float(np.mean([s["accuracy"] for s in settings])),
                           "state_elements_per_layer": elements, "state_bytes": 2 * 4 * elements,
                           "params": 1000 * d_model + elements // 10}
                runs.append(result("train", "recall", model, config, summary, settings=settings))
    return runs
