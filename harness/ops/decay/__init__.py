"""Decayed (gated) linear attention, one scalar gate per head or one per key dimension: the
parallel and recurrent forms, the step and the weights (forms), the chunk form's autograd
Functions (chunk), their fused CPU kernels (decay_cpu.cpp for scalar gates, gated_cpu.cpp for
per-dimension gates) and the naive reference (naive)."""

from .forms import decay_attention, decay_attention_step, decay_weights
from .naive import naive_decay_attention
