"""Linear (kernel) attention: the parallel and recurrent forms, the step and the weights (forms),
the chunk form's autograd Functions (chunk), its fused CPU kernel (linear_cpu.cpp) and the naive
reference (naive)."""

from .forms import linear_attention, linear_attention_step, linear_weights
from .naive import naive_linear_attention
