"""Synthetic runs of the mechanism's interchange maps: the payloads its figure's tests draw it from
(FigureSpec.synthetic).
"""
from __future__ import annotations

from analysis.synthetic import SEEDS, result


# Mechanism: interchange maps of 2-layer runs trained with trainer.intervene=true, five seeds, the
# short convolution on and off. The shares follow what each mechanism restores: the value
# token's residual after layer 0 (induction), the writes at the value token inside layer 1's
# mixer (short-convolution binding), nothing (a run that did not learn: one of mamba's seeds
# without its convolution, which also ended at max_steps).
MECHANISM_MAPS = {
    "induction": {(0, "block_out", "value"): 0.95, (1, "block_in", "value"): 0.95, (1, "core_in", "value"): 0.9,
                  (0, "mixer_out", "value"): 0.9, (1, "mixer_out", "query"): 0.97},
    "convolution": {(1, "core_in", "value"): 0.93, (0, "block_out", "key"): 0.97, (1, "block_in", "key"): 0.97,
                    (1, "mixer_out", "query"): 0.98},
}
MECHANISM_ARMS = {("softmax", True): "convolution", ("softmax", False): "induction",
                  ("mamba", True): "convolution", ("mamba", False): "induction"}
MECHANISM_NOT_LEARNED = ("mamba", False, 4)  # (mixer, short_conv, seed): stuck at 1/N, at max_steps


def _intervene_rows(pattern: dict, rng, clean: float, corrupted: float) -> list[dict]:
    from harness.measure.intervene import COMPONENTS, CORRUPTIONS, ROLES

    rows = []
    for corrupt in CORRUPTIONS:
        for layer in (0, 1):
            for component in COMPONENTS:
                for role in ROLES:
                    if (layer, component) == (0, "block_in"):
                        share = 1.0 if role == corrupt else 0.0  # what holds by construction
                    elif (layer, component) == (1, "block_out"):
                        share = 1.0 if role == "query" else 0.0
                    else:
                        share = pattern.get((layer, component, role), 0.0) + 0.02 * rng.standard_normal()
                    rows.append({"corrupt": corrupt, "layer": layer, "component": component, "role": role,
                                 "restored_share": share, "restored_prob": corrupted + share * (clean - corrupted),
                                 "clean_prob": clean, "corrupted_prob": corrupted, "examples": 128})
    return rows


def mechanism_runs(rng) -> list[dict]:
    from harness.measure.mechanism import mechanism_label

    runs = []
    for (model, conv), kind in MECHANISM_ARMS.items():
        for seed in SEEDS:
            stuck = (model, conv, seed) == MECHANISM_NOT_LEARNED
            rows = _intervene_rows({} if stuck else MECHANISM_MAPS[kind], rng, 0.25 if stuck else 0.97, 0.2)
            summary = {"accuracy": 0.25 if stuck else 0.99, "stop_reason": "max_steps" if stuck else "plateau"}
            config = {"model.d_model": 32, "model.n_layers": 2, "model.short_conv": conv, "seed": seed,
                      "trainer.intervene": True}
            runs.append(result("train", "recall", model, config, summary, intervene=rows,
                               mechanism=mechanism_label(rows)))
    return runs
