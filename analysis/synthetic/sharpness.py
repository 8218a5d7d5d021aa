"""Synthetic runs of the sharpness sweep (the attention and learning figures read it too): the
payloads its figure's tests draw it from (FigureSpec.synthetic).
"""
from __future__ import annotations

import math

import numpy as np

from analysis.synthetic import SEEDS, result, val_curve


# Sharpness (the default recall task): every seed's run stops on its own plateau.
SHARPNESS = {"softmax": (0.9, 0.99, 40.0), "linear": (0.35, 0.7, 150.0), "elu": (0.3, 0.93, 120.0),
             "favor": (0.5, 0.85, 200.0), "deltanet": (0.6, 0.97, 90.0)}  # target weight, final accuracy, tau
SHARPNESS_MAX_STEPS = 1000


def sharpness_runs(rng) -> list[dict]:
    runs = []
    for model, (weight, final, tau) in SHARPNESS.items():
        for seed in SEEDS:
            heads = []
            for n in (8, 32):
                prefix = 2 * n + 4
                for head in (0, 1):
                    w = weight * (0.95 + 0.1 * rng.random()) * (1.0 if model == "softmax" else 8 / n)
                    entropy = (1 - w) * math.log(prefix)
                    heads.append({"layer": 0, "head": head, "slice": "num_pairs", "value": n,
                                  "entropy": entropy, "norm_entropy": entropy / math.log(prefix),
                                  "eff_support": math.exp(entropy), "max_weight": max(w, 1 / prefix),
                                  "target_weight": w, "target_rank": 1 if w > 0.2 else 3,
                                  # 1 by their maps (linear's a float32 rounding of near ties below it),
                                  # which they declare
                                  "monotonicity": {"softmax": 1.0, "linear": 0.9998}.get(model, 0.6),
                                  "monotone_in_score": model in ("softmax", "linear")})
            # Layer 1 holds other heads: diffuse, never on the target (not the retrieval head).
            heads += [dict(h, layer=1, target_weight=0.01, norm_entropy=0.99) for h in heads]
            retrieval = [h for h in heads if h["layer"] == 0 and h["head"] == 0]
            # seeds 0-2 stop on a plateau, the others run to max_steps
            stop = SHARPNESS_MAX_STEPS if seed >= 3 else int(min(SHARPNESS_MAX_STEPS, 6 * tau + 100 * seed))
            final_seed = final * (1 - 0.01 * seed)
            curve = val_curve(final_seed, tau * (1 + 0.1 * seed), stop)
            summary = {"accuracy": final_seed, "val_accuracy": curve[-1]["accuracy"], "retrieval_layer": 0,
                       "retrieval_head": 0, "steps": stop, "stop_reason": "plateau" if stop < SHARPNESS_MAX_STEPS
                       else "max_steps", "best_val_accuracy": max(r["accuracy"] for r in curve),
                       "best_val_step": curve[-1]["step"],
                       "entropy": float(np.mean([h["entropy"] for h in retrieval])),
                       "target_weight": float(np.mean([h["target_weight"] for h in retrieval]))}
            payload = result("train", "recall", model, {"model.d_model": 32, "model.n_layers": 2, "seed": seed,
                                                        "trainer.lr": 3e-3,
                                                        "trainer.max_steps": SHARPNESS_MAX_STEPS},
                             summary, heads=heads)
            payload["_metrics"] = curve
            if model in ("softmax", "elu") and seed == 0:
                payload["_model"] = True  # the attention figure reopens these runs
            runs.append(payload)
    return runs
