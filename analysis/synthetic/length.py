"""Synthetic runs of recall against length: the payloads its figure's tests draw it from
(FigureSpec.synthetic).
"""
from __future__ import annotations

import math

import numpy as np

from analysis.synthetic import result


LENGTHS = (64, 256, 1024, 4096, 16384)


def length_runs(rng) -> list[dict]:
    """Recall trained at 64, evaluated to 16,384, in both filler layouts; decay mixers fade with T."""
    runs = []
    mixers = {"softmax": (0.0, None), "elu": (0.15, None), "retnet": (0.5, math.log(1 - 2**-5)),
              "mamba": (0.35, -0.01), "deltanet": (0.1, None)}
    for filler in ("zero", "random"):
        for model, (fade, log_decay) in mixers.items():
            for seed in (0, 1):
                slices, settings = [], []
                for t in LENGTHS:
                    loss_of_length = fade * math.log2(t / 64) / 8 * (1.5 if filler == "random" else 1.0)
                    acc = max(0.01, 0.99 - loss_of_length - 0.01 * seed)
                    slices.append({"slice": "num_pairs", "value": 4, "seq_len": t, "accuracy": acc, "count": 256})
                    settings.append({"name": f"seq_len={t}", "seq_len": t, "accuracy": acc, "loss": 1 - acc,
                                     "count": 256, "peak_mem_bytes": 3_000_000 * (t // 64 if model != "softmax" else 1),
                                     "examples_per_pass": max(1, 16384 // t), "form": "chunk"})
                summary = {"accuracy": float(np.mean([s["accuracy"] for s in slices])), "d_key": 64, "d_head": 64,
                           # softmax keeps a key and a value per token (two layers, float32, 16,384 tokens)
                           "attention_kv_cache_bytes": 2 * 2 * 64 * 16384 * 4 if model == "softmax" else 0}
                if log_decay is not None:
                    summary["log_decay"] = log_decay
                runs.append(result("train", "recall", model,
                                   {"model.d_model": 64, "task.seq_len": 64, "task.num_pairs": 4, "seed": seed,
                                    "task.vocab_size": 256, "task.filler": filler, "task.filler_rate": 1.0,
                                    "task.power_a": 0.01, "task.num_queries": None,
                                    "task.test_seq_len": list(LENGTHS)},
                                   summary, slices=slices, settings=settings))
    return runs
