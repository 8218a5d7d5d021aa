"""Synthetic runs of the hybrid stacks: the payloads its figure's tests draw it from
(FigureSpec.synthetic).
"""
from __future__ import annotations

import numpy as np

from analysis.synthetic import SEEDS, result


# Hybrid stacks: 4 layers trained on a mixture up to N = 32 pairs, past a pure recurrent stack's
# capacity at key width 4, T = 80; memory is each recurrent layer's state plus each attention
# layer's KV cache at T (fp32 bytes), so it grows with every attention layer.
HYBRID_STATE_BYTES = {"gated_deltanet": 4 * 4 * 32, "mamba": 4 * 4 * 32, "elu": 4 * (4 * 32 + 4)}
HYBRID_KV_BYTES = 4 * 80 * (4 + 32)
HYBRID_PURE = {"gated_deltanet": 0.3, "mamba": 0.15, "elu": 0.05}  # recall of the all-recurrent stack
HYBRID_ONE = (0.6, 0.9, 0.93, 0.95)  # with one attention layer at each position (elu's 0.2 lower)
HYBRID_MIXTURE = [[80, 8, 2], [80, 16, 1], [80, 32, 1]]
HYBRID_LOWER_BOUND = ("elu", "none", 0)  # (recurrent, pattern, seed) of the run that ends at max_steps


def _stack_label(names: list[str]) -> str:
    """harness.model.label of a stack: repeats counted (gated_deltanet*3+softmax)."""
    from harness.model import stack_label

    return stack_label(names)


def stack_run(names: list[str], acc: float, seed: int, config: dict, heads=(), per_n=None) -> dict:
    """A trained hybrid's results.json: its label, layers and memory tables, memory by kind;
    ``per_n``: {N: test recall at the training length}."""
    state = sum(HYBRID_STATE_BYTES.get(n, 0) for n in names if n != "softmax")
    kv = HYBRID_KV_BYTES * names.count("softmax")
    layers = [{"layer": i, "mixer": n, "kwargs": {"config": "<ModelConfig>", "layer_idx": i}, "not_applied": []}
              for i, n in enumerate(names)]
    memory = [{"layer": i, "mixer": n, "kind": "kv_cache" if n == "softmax" else "state",
               "elements": (HYBRID_KV_BYTES if n == "softmax" else HYBRID_STATE_BYTES.get(n, 4096)) // 4,
               "seq_len": 80} for i, n in enumerate(names)]
    summary = {"accuracy": acc, "val_accuracy": min(1.0, acc + 0.01), "state_bytes": state + kv,
               "recurrent_state_bytes": state, "attention_kv_cache_bytes": kv,
               "kv_cache_bytes": HYBRID_KV_BYTES * len(names), "retrieval_layer": 0, "retrieval_head": 0,
               "stop_reason": "plateau", **{f"accuracy/num_pairs={n}": a for n, a in (per_n or {}).items()}}
    flat = {"model.name": "elu", "model.layers": list(names), "model.n_layers": len(names), "seed": seed, **config}
    return result("train", "recall", _stack_label(names), flat, summary, layers=layers, memory=memory,
                  heads=list(heads))


def _interchange(names: list[str], rng) -> list[dict]:
    """A stack's interchange map (the intervene rows a run writes): a key corruption restored most
    by the mixer output at the query of its first attention layer (of layer 0 without one)."""
    taker = names.index("softmax") if "softmax" in names else 0
    rows = []
    for layer in range(len(names)):
        for component in ("block_in", "mixer_out", "block_out"):
            for role in ("key", "value", "between", "query", "other_pair"):
                share = 0.9 if (layer, component, role) == (taker, "mixer_out", "query") else 0.1 * rng.random()
                rows.append({"corrupt": "key", "layer": layer, "component": component, "role": role,
                             "restored_share": share, "restored_prob": share})
    return rows


def hybrid_runs(rng) -> list[dict]:
    """Every stack of the grid, five seeds: one attention layer recovers most of the recall (least
    as the first layer, which has nothing to aggregate yet), two nearly all; the ungated elu less
    with one. The gated_deltanet stacks carry their interchange maps."""
    config = {"model.d_model": 32, "model.n_heads": 1, "model.qk_dim": 4, "task.seq_len": 80,
              "task.num_pairs": 32, "task.mixture": HYBRID_MIXTURE, "trainer.lr": 1e-2}
    runs = []

    def run(names, acc, seed, recurrent):
        acc = float(np.clip(acc - 0.02 * seed + 0.01 * rng.standard_normal(), 0, 1))
        out = stack_run(names, (acc + 2 * min(1.0, acc + 0.3)) / 3, seed, config,
                         per_n={8: min(1.0, acc + 0.3), 16: min(1.0, acc + 0.15), 32: acc})
        if recurrent == "gated_deltanet":
            out["intervene"] = _interchange(names, rng)
        return out

    for recurrent, pure in HYBRID_PURE.items():
        stacks = [([recurrent] * 4, pure, "none")]
        stacks += [([("softmax" if i == at else recurrent) for i in range(4)],
                    HYBRID_ONE[at] - (0.2 if recurrent == "elu" else 0.0), f"1@{at}") for at in range(4)]
        stacks += [([recurrent, "softmax", recurrent, "softmax"], 0.97, "2@1,3")]
        for names, acc, pattern in stacks:
            for seed in SEEDS:
                runs.append(run(names, acc, seed, recurrent))
                if (recurrent, pattern, seed) == HYBRID_LOWER_BOUND:
                    runs[-1]["summary"]["stop_reason"] = "max_steps"
    runs += [run(["softmax"] * 4, 0.99 - 0.005 * seed, seed, None) for seed in SEEDS]
    return runs
