"""Mixers: nn.Modules that own projections, feature maps, gates and norms and call harness.ops.

One module per family; each registers its built-in names (harness.layers.registry), and
harness.layers.protocol says what the harness reads off a mixer.
"""

from harness.layers.parts import MLP, HeadNorm, RMSNorm, Rotary, ShortConv, make_norm
from harness.layers.protocol import Mixer, ProbeMemory
from harness.layers.registry import build, builtin_names, register, resolve

__all__ = ["MLP", "HeadNorm", "Mixer", "ProbeMemory", "RMSNorm", "Rotary", "ShortConv", "build",
           "builtin_names", "make_norm", "register", "resolve"]
