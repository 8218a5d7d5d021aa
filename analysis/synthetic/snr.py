"""Synthetic runs of the untrained probe's sweep: the payloads its figure's tests draw it from
(FigureSpec.synthetic).
"""
from __future__ import annotations

import math

from analysis.synthetic import result


def snr_runs(rng) -> list[dict]:
    probe = []
    for model, feature_dim in {"linear": lambda d: d, "elu": lambda d: d,
                               "favor": lambda d: round(d * math.log(d))}.items():
        for d in (16, 64):
            m = feature_dim(d)
            for n in (16, 64, 256, 1024, 4096):
                predicted = math.sqrt(m / n)
                measured = predicted * math.exp(0.05 * rng.standard_normal())
                probe.append({"model": model, "d": d, "m": m, "n": n, "snr_measured": measured,
                              "snr_predicted": predicted, "snr_kernel": measured * 1.1,
                              "acc_measured": min(1.0, 0.2 + measured),
                              "acc_predicted": min(1.0, 0.2 + predicted)})
    heads = []
    for n in (8, 16, 32, 64):
        for head in (0, 1):
            predicted = math.sqrt(16 / n)
            heads.append({"layer": 0, "head": head, "slice": "num_pairs", "value": n,
                          "snr_measured": 0.7 * predicted, "snr_predicted": predicted,
                          "snr_readout_trained": 0.8 * predicted})
    trained = result("train", "interference", "elu", {"model.d_model": 32},
                     {"accuracy": 0.6, "d_key": 16, "snr_measured": 0.5, "snr_predicted": 0.7},
                     heads=heads)
    return [result("probe", "interference", "linear", {}, {}, probe=probe), trained]
