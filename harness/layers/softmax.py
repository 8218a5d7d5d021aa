"""Exact causal softmax attention: the reference mixer.

Training goes through ops.softmax_attention (which may use torch's fused kernel); analysis
materialises the weights with ops.softmax_weights from the hooked q and k.
"""

from __future__ import annotations

import torch
from torch import nn

from harness import ops
from harness.layers.common import Mixer, merge_heads, register


@register("softmax")
class SoftmaxAttention(Mixer):
    family = "softmax"

    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.out_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.scale = self.d_qk**-0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, C)
        q, k, v = self.project_qkv(x)  # (B, H, T, D)
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        q, k = self.hook_q_raw(q), self.hook_k_raw(k)  # no feature map: raw == fed
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        o = self.hook_out(ops.softmax_attention(q, k, v, causal=True, scale=self.scale))  # (B, H, T, D)
        return self.out_proj(merge_heads(o))

    def effective_weights(self, q, k, log_decay=None) -> torch.Tensor:
        return ops.softmax_weights(q, k, causal=True, scale=self.scale)  # (B, H, T, T)
