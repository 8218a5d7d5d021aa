"""The short causal depthwise convolution of the mixers: the op and its fused CPU Function (forms),
the fused kernel (conv_cpu.cpp) and the F.conv1d reference (naive)."""

from .forms import causal_conv
from .naive import causal_conv_reference
