"""Decoding cost against context length: one token with a recurrent state, and with a KV cache.

A linear family decodes with a fixed-size state: one `step` costs the same after 256 tokens
as after 16,384 (flatness = time at the longest context / time at the shortest, ideally 1).
Softmax decodes against a KV cache of every earlier token: its step reads (and, with
ops.softmax_step, copies) the whole cache, so its time grows with the context.

The state entering the step is the real one: the chunk form runs over the whole context
first (return_state=True). Steps at the different contexts are interleaved and each figure
is a median.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from harness import ops
from harness.bench.cases import Shape, make_inputs
from harness.bench.timing import interleaved, median

DECODE_FAMILIES = ("linear", "decay_scalar", "decay_per_dim", "delta", "delta_gated", "softmax")
STEPS_PER_SAMPLE = 8
REFERENCE_CONTEXT = 16384  # flatness/growth: one step at this context over one at the shortest


def _step_fn(family: str, shape: Shape, device: torch.device, dtype: torch.dtype) -> Callable[[], object]:
    """One decoding step of `family` after `shape.seq_len` tokens of context."""
    step = _one_step(family, shape, device, dtype)

    def steps() -> None:  # several steps per sample: the first may find cold caches
        for _ in range(STEPS_PER_SAMPLE):
            step()

    return steps


def _one_step(family: str, shape: Shape, device: torch.device, dtype: torch.dtype) -> Callable[[], object]:
    ctx = make_inputs(family, shape, device, dtype)
    one = Shape(shape.batch, shape.heads, 1, shape.d_key, shape.d_value)
    tok = {name: x[:, :, 0] for name, x in make_inputs(family, one, device, dtype, seed=1).items()}
    with torch.no_grad():
        if family == "softmax":
            cache = (ctx["k"], ctx["v"])
            return lambda: ops.softmax_step(tok["q"], tok["k"], tok["v"], cache)
        if family == "linear":
            _, state = ops.linear_attention(ctx["q"], ctx["k"], ctx["v"], return_state=True)
            return lambda: ops.linear_attention_step(tok["q"], tok["k"], tok["v"], state)
        if family in ("delta", "delta_gated"):
            decay = ctx.get("log_decay")
            _, state = ops.delta_attention(ctx["q"], ctx["k"], ctx["v"], ctx["beta"], decay, return_state=True)
            return lambda: ops.delta_attention_step(tok["q"], tok["k"], tok["v"], tok["beta"], tok.get("log_decay"),
                                                    state)
        _, state = ops.decay_attention(ctx["q"], ctx["k"], ctx["v"], ctx["log_decay"], return_state=True)
        return lambda: ops.decay_attention_step(tok["q"], tok["k"], tok["v"], tok["log_decay"], state)


def decode_times(contexts: list[int], *, batch: int, heads: int, d_key: int, d_value: int, device: torch.device,
                 dtype: torch.dtype = torch.float32, repeats: int = 30,
                 families: tuple[str, ...] = DECODE_FAMILIES) -> dict:
    """Median time of one step per family and context, and each family's growth: time at
    REFERENCE_CONTEXT (or the longest context) over time at the shortest ("flatness" for the
    linear families), plus the same ratio at every context."""
    cells = {}
    with torch.no_grad():
        for family in families:
            for t in contexts:
                cells[(family, t)] = _step_fn(family, Shape(batch, heads, t, d_key, d_value), device, dtype)
        samples, _ = interleaved(cells, repeats, device, warmup=2)
    lo = min(contexts)
    ref = REFERENCE_CONTEXT if REFERENCE_CONTEXT in contexts else max(contexts)
    out: dict = {"contexts": list(contexts), "reference_context": ref, "repeats": repeats,
                 "steps_per_sample": STEPS_PER_SAMPLE, "families": {}}
    for family in families:
        times = {t: median(samples[(family, t)]) / STEPS_PER_SAMPLE for t in contexts}
        growth = {str(t): (times[t] / times[lo] if times[lo] > 0 else math.nan) for t in contexts}
        out["families"][family] = {"time_s": {str(t): times[t] for t in contexts}, "growth": growth[str(ref)],
                                   "growth_by_context": growth}
    return out
