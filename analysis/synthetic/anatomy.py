"""Synthetic runs of the anatomy's ablations: the payloads its figure's tests draw it from
(FigureSpec.synthetic).
"""
from __future__ import annotations

import numpy as np

from analysis.synthetic import SEEDS
from analysis.synthetic.hybrid import stack_run


# Anatomy: 2 layers of 4 heads, five seeds per model, each run's own ablate rows in its
# results.json (trainer.ablate=true). Per model: where its A head and G head sit ((layer) or
# None), by construction; each seed puts them at its own head index (heads are not matched
# across seeds). One more run, of the old layout, has no rows and keeps a model.pt: the figure
# reopens it.
ANATOMY_MODELS = {("softmax", "softmax", False): (1, 0), ("gated_deltanet", "gated_deltanet", False): (1, 0),
                  ("gated_deltanet", "softmax", False): (1, 0), ("softmax", "softmax", True): (0, None)}
ANATOMY_HEADS = 4
ANATOMY_PAIRS = 8
ANATOMY_LOWER_BOUND = ("gated_deltanet", "gated_deltanet", False)  # its seed 0 ends at max_steps
# (necessity share under resample, zero, mean; restores under query, key, value; weights on key, on answer)
ANATOMY_ROLE_NUMBERS = {"A": ((0.9, 0.95, 0.6), (0.9, 0.85, 0.9), (0.1, 0.8)),
                        "G": ((0.8, 0.9, 0.3), (0.02, 0.8, 0.05), (0.85, 0.1)),
                        "": ((0.02, 0.05, 0.01), (0.01, 0.01, 0.01), (0.15, 0.1))}
ANATOMY_PATH = 0.7  # what G's path into A restores of the key corruption; other paths 0.02


def ablate_rows(roles: dict, rng, *, base: float = 0.98, heads: int = ANATOMY_HEADS, layers: int = 2,
                pairs: int = ANATOMY_PAIRS) -> list[dict]:
    """A run's ablate table (harness.measure.ablate) for heads of the given roles
    ({(layer, head): "A" | "G"}); noise of 0.01 on every number."""
    chance = 1.0 / pairs
    jitter = lambda: 0.01 * rng.standard_normal()  # noqa: E731
    rows = []
    for layer in range(layers):
        for head in [None, *range(heads)]:
            numbers = ANATOMY_ROLE_NUMBERS[roles.get((layer, head), "")]
            for kind, share in zip(("resample", "zero", "mean"), numbers[0]):
                share = 0.99 if head is None and any(k[0] == layer for k in roles) else share
                acc = float(np.clip(base - (share + jitter()) * (base - chance), 0, 1))
                rows.append({"layer": layer, "head": head, "kind": kind, "point": f"layers.{layer}",
                             "accuracy": acc, "base_accuracy": base, "drop": base - acc, "chance": chance})
            if head is None:
                continue
            for corrupt, restored in zip(("query", "key", "value"), numbers[1]):
                rows.append({"layer": layer, "head": head, "kind": "patch", "corrupt": corrupt,
                             "restored": restored + jitter()})
            rows.append({"layer": layer, "head": head, "kind": "weights", "value_on_key": numbers[2][0] + jitter(),
                         "query_on_answer": numbers[2][1] + jitter()})
    g = next((k for k, v in roles.items() if v == "G"), None)
    a = next((k for k, v in roles.items() if v == "A"), None)
    for sender in range(heads):
        for receiver in range(heads):
            on_path = g == (0, sender) and a == (1, receiver)
            rows.append({"kind": "path", "corrupt": "key", "sender_layer": 0, "sender_head": sender, "layer": 1,
                         "head": receiver, "restored": (ANATOMY_PATH if on_path else 0.02) + jitter()})
    return rows


def anatomy_runs(rng) -> list[dict]:
    runs = []
    for (first, second, conv), (a_layer, g_layer) in ANATOMY_MODELS.items():
        for seed in SEEDS:
            a_head, g_head = rng.choice(ANATOMY_HEADS, 2, replace=False)
            roles = {(a_layer, int(a_head)): "A"}
            if g_layer is not None:
                roles[(g_layer, int(g_head))] = "G"
            run = stack_run([first, second], 0.98, seed, {"model.d_model": 32, "model.n_heads": ANATOMY_HEADS,
                                                           "model.short_conv": conv, "trainer.lr": 3e-3,
                                                           "trainer.ablate": True, "analysis.ga_necessity": 0.5,
                                                           "analysis.ga_restore": 0.5, "analysis.ga_attention": 0.5})
            run["ablate"] = ablate_rows(roles, rng)
            at_max = (first, second, conv) == ANATOMY_LOWER_BOUND and seed == 0
            run["summary"]["stop_reason"] = "max_steps" if at_max else "plateau"
            runs.append(run)
    # reopened and ablated by the figure, at its own ablate.examples (few: the suite draws it often)
    legacy = stack_run(["gated_deltanet", "softmax"], 0.9, 0, {"model.d_model": 64, "model.n_heads": 2,
                                                               "ablate.examples": 32})
    legacy["_model"] = True
    runs.append(legacy)
    return runs
