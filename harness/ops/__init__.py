"""Mixer cores as pure functions on tensors laid out (batch, heads, time, dim).

Four families — softmax, linear (kernel), decayed/gated linear attention and the (gated) delta
rule — each with a parallel, a recurrent and a chunk form (softmax: the fused and the banded
sliding-window kernels instead), a one-token step for decoding, the effective
attention weights for analysis, and a naive loop reference the fast forms are tested against.

One folder per family (softmax/, linear/, decay/, delta/, and conv/ for the mixers' short
convolution) holds its forms, its chunk Functions, its fused CPU kernel source and its naive
reference side by side; common/ holds what they share, csrc/ the extension's bindings and shared
header, fused_cpu the extension's build and switch, cores the forms each core has, state the
memory each one keeps.
"""

from .common.guards import finite_checks_enabled, floor_denominator, set_finite_checks
from .decay import decay_attention, decay_attention_step, decay_weights, naive_decay_attention
from .delta import delta_attention, delta_attention_step, delta_weights, naive_delta_attention
from .fused_cpu import fused_cpu_enabled, set_fused_cpu
from .linear import linear_attention, linear_attention_step, linear_weights, naive_linear_attention
from .softmax import (naive_softmax_attention, softmax_attention, softmax_step, softmax_weights, window_attention,
                      window_step, window_weights)
from .state import attention_matrix_elements, kv_cache_elements, kv_crossover, state_elements

__all__ = [
    "softmax_attention",
    "softmax_weights",
    "softmax_step",
    "window_attention",
    "window_weights",
    "window_step",
    "linear_attention",
    "linear_attention_step",
    "linear_weights",
    "decay_attention",
    "decay_attention_step",
    "decay_weights",
    "delta_attention",
    "delta_attention_step",
    "delta_weights",
    "naive_softmax_attention",
    "naive_linear_attention",
    "naive_decay_attention",
    "naive_delta_attention",
    "state_elements",
    "kv_cache_elements",
    "kv_crossover",
    "attention_matrix_elements",
    "set_finite_checks",
    "finite_checks_enabled",
    "floor_denominator",
    "set_fused_cpu",
    "fused_cpu_enabled",
]
