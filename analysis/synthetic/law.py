"""Synthetic runs of the capacity-at-length sweep the law figure reads: the payloads its figure's
tests draw it from (FigureSpec.synthetic).
"""
from __future__ import annotations

import math

import numpy as np

from analysis.synthetic import SEEDS, result


# The decayed mixer against length (findings/capacity_length): retnet at N = 16 tested with
# filler to 768 tokens, its recall fading with the gap; the pre-registered law follows the fade,
# both baselines decline more slowly.
CAPACITY_LENGTHS = (48, 96, 192, 384, 768)


def _faded(length: int) -> float:
    return 1 / 32 + (0.95 - 1 / 32) * math.exp(-(length - 48) / 150)


def capacity_length_runs(rng) -> list[dict]:
    predicted = [{"part": "length", "model": "retnet", "qk_dim": 8, "num_pairs": 16, "seq_len": t,
                  "source_qk_dim": 8, "source_num_pairs": 16, "law": round(_faded(t), 4),
                  "nominal": round(min(0.97, _faded(t) + 0.3), 4), "anchored": round(min(0.96, _faded(t) + 0.2), 4),
                  "seeds": 5, "law_anchored_by_algebra": False, "discriminating": t > 48} for t in CAPACITY_LENGTHS]
    runs = []
    for seed in SEEDS:
        settings = [{"name": f"seq_len={t}", "accuracy": min(1.0, _faded(t) * (1 + 0.03 * rng.standard_normal())),
                     "loss": 1.0, "count": 1024, "seq_len": t} for t in CAPACITY_LENGTHS]
        config = {"model.d_model": 64, "model.qk_dim": 8, "model.n_heads": 1, "task.num_pairs": 16,
                  "task.test_seq_len": list(CAPACITY_LENGTHS), "task.key_regime": "schlag", "seed": seed,
                  "trainer.lr": 1e-2, "analysis.law_predictions": predicted, "analysis.law_margin_logodds": 0.25}
        summary = {"accuracy": float(np.mean([r["accuracy"] for r in settings])), "family": "decay",
                   "stop_reason": "plateau", "steps": 900}
        runs.append(result("train", "interference", "retnet", config, summary, settings=settings))
    return runs
