"""Exact causal softmax attention: the reference mixer.

Training goes through ops.softmax_attention (which may use torch's fused kernel); analysis
materialises the weights with ops.softmax_weights from the hooked q and k.
"""

from __future__ import annotations

import torch
from torch import nn

from harness import ops
from harness.layers.parts import merge_heads
from harness.layers.protocol import Mixer, ProbeMemory
from harness.layers.registry import register


@register("softmax")
class SoftmaxAttention(Mixer):
    family = "softmax"
    core = "softmax"
    memory_kind = "kv_cache"  # a key and a value per token (swa: per token of its window)
    kernel = "softmax"
    wants_learned_positions = True  # no recurrence and rotary off by default: GPT-2's positions
    monotone_in_score = True  # a_ij = softmax of the very score: increasing in it by construction

    def __init__(self, config, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        self.out_proj = nn.Linear(config.d_model, config.d_model, bias=False)
        self.scale = self.d_qk**-0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, C)
        q, k, v = self.project_qkv(x)  # (B, H, T, D)
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        q, k = self.hook_q_raw(q), self.hook_k_raw(k)  # no feature map: raw == fed
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        o = self.hook_out(ops.softmax_attention(q, k, v, causal=True, scale=self.scale))  # (B, H, T, D)
        return self.out_proj(merge_heads(o))

    def state_size(self, sequence_length: int = 2048) -> int:
        """The KV cache after `sequence_length` tokens: a key and a value per token and head."""
        return self.n_heads * ops.kv_cache_elements(sequence_length, self.d_qk, self.d_head)

    def effective_weights(self, hooks, rows=None) -> torch.Tensor:
        return ops.softmax_weights(hooks["q"], hooks["k"], causal=True, scale=self.scale, rows=rows)  # (B, H, R, T)

    @classmethod
    def probe_memory(cls, d: int, seed: int) -> ProbeMemory:
        return ProbeMemory(read="softmax", d_key=d)
