"""Synthetic runs of the cost sweep: the payloads its figure's tests draw it from
(FigureSpec.synthetic).
"""
from __future__ import annotations

import math

from analysis.synthetic import result


def cost_runs(rng) -> list[dict]:
    rows = []
    forms = {("softmax", "parallel"): 2, ("linear", "parallel"): 2, ("linear", "chunk"): 1,
             ("linear", "recurrent"): 1, ("decay", "chunk"): 1}
    for (family, form), power in forms.items():
        for seq_len in (64, 128, 256, 512, 1024):
            for pass_, factor in (("fwd", 1.0), ("fwdbwd", 3.0)):
                base = 1e-7 * (seq_len ** power) * factor * (30.0 if form == "recurrent" else 1.0)
                rows.append({"family": family, "form": form, "seq_len": seq_len, "pass": pass_,
                             "time_s": base * math.exp(0.03 * rng.standard_normal()),
                             "peak_mem_bytes": 4 * seq_len ** power, "batch": 2, "d": 16})
    return [result("cost", "none", "none", {}, {"wall_time_s": 3.0}, cost=rows)]
