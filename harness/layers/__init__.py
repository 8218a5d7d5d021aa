"""Mixers (nn.Modules that own projections, feature maps, gates and norms and call harness.ops).

One module per family; importing this package registers them all in `MIXERS`.
"""

from harness.layers import kernel, mamba, retnet, softmax  # noqa: F401  (registration)
from harness.layers.common import MIXERS, MLP, HeadNorm, Mixer, RMSNorm, Rotary, ShortConv, build_mixer, make_norm

__all__ = ["MIXERS", "MLP", "HeadNorm", "Mixer", "RMSNorm", "Rotary", "ShortConv", "build_mixer", "make_norm"]
