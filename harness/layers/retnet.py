"""Retention (RetNet): multi-scale constant decay, no denominator.

S_t = gamma_h S_{t-1} + k_t v_t^T, o_t = q_t^T S_t with gamma_h = 1 - 2^(-5-h) for head h, so
the heads see exponentially different horizons (1/(1-gamma): 32, 64, 128, ... tokens);
`model.decay` instead gives every head the same gamma, one horizon to sweep. q is scaled by
d_head^-1/2; the read-out goes through a per-head group norm, a swish gate and an
output projection (Sun et al. 2023).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from harness import ops
from harness.layers.parts import HeadNorm, merge_heads
from harness.layers.protocol import Mixer, ProbeMemory, identity_map
from harness.layers.registry import register


def retnet_log_gammas(n_heads: int, decay: float | None = None) -> torch.Tensor:
    """log gamma_h, h = 0..H-1, in float64: gamma_h = 1 - 2^(-5-h), or `decay` for every head."""
    if decay is not None:
        return torch.full((n_heads,), math.log(decay), dtype=torch.float64)  # (H,)
    h = torch.arange(n_heads, dtype=torch.float64)
    return torch.log1p(-torch.pow(2.0, -5.0 - h))  # (H,)


@register("retnet")
class Retention(Mixer):
    family = "decay"
    core = "decay_scalar"
    kernel = "identity"
    has_decay = True

    def __init__(self, config, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        self.form, self.chunk_size = config.form, config.chunk_size
        self.gate_proj = nn.Linear(config.d_model, config.d_model, bias=False)
        self.out_proj = nn.Linear(config.d_model, config.d_model, bias=False)
        self.norm = HeadNorm(self.n_heads, self.d_head, "layernorm")
        self.register_buffer("log_gamma", retnet_log_gammas(self.n_heads, config.decay),
                             persistent=False)  # (H,)
        self.q_scale = 1.0 / math.sqrt(self.d_qk)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, C)
        B, T, _ = x.shape
        q, k, v = self.project_qkv(x)  # (B, H, T, D)
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        q, k = self.hook_q_raw(q * self.q_scale), self.hook_k_raw(k)  # no feature map: raw == fed
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        dtype = torch.promote_types(x.dtype, torch.float32)  # summed over many steps: never bf16
        log_decay = self.log_gamma.to(dtype)[None, :, None].expand(B, self.n_heads, T)  # (B, H, T)
        log_decay = self.hook_log_decay(log_decay)
        o = ops.decay_attention(q, k, v, log_decay, form=self.form, chunk_size=self.chunk_size)  # (B, H, T, D)
        o = self.norm(self.hook_out(o))
        return self.out_proj(merge_heads(o) * F.silu(self.gate_proj(x)))

    def state_size(self, sequence_length: int = 2048) -> int:
        return self.n_heads * ops.state_elements(self.d_key, self.d_head, normalize=False)

    def effective_weights(self, hooks, rows=None) -> torch.Tensor:
        return ops.decay_weights(hooks["q"], hooks["k"], hooks["log_decay"], rows=rows)  # (B, H, R, T)

    @classmethod
    def probe_memory(cls, d: int, seed: int) -> ProbeMemory:
        """Identity keys into a state decayed by the first head's gamma = 1 - 2^-5, no denominator."""
        log_gamma = float(retnet_log_gammas(1)[0])

        def decay(shape, gen):
            return torch.full(shape, log_gamma, dtype=torch.float64), None

        return ProbeMemory(read="state", phi_k=identity_map, phi_q=identity_map, d_key=d, decay=decay)
