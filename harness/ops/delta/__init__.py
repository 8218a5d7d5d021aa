"""The delta rule and the gated delta rule: the parallel and recurrent forms, the step and the
weights (forms), the chunk form's blocks and autograd Function (chunk), its fused CPU kernel
(delta_cpu.cpp) and the naive reference (naive)."""

from .forms import delta_attention, delta_attention_step, delta_weights
from .naive import naive_delta_attention
