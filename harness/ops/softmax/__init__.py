"""Softmax attention and its sliding window: the fused forms (forms) and the naive reference (naive)."""

from .forms import softmax_attention, softmax_step, softmax_weights, window_attention, window_step, window_weights
from .naive import naive_softmax_attention
