"""Mamba-2 style input-dependent gating (and GLA's per-key-dimension gate as an option).

The SSD recurrence is the shared decay core with q = C, k = B, v = dt * x, log a = dt * A:

  S_t = exp(dt_t A_h) S_{t-1} + k_t (dt_t v_t)^T,   o_t = q_t^T S_t

dt_t = softplus(x_t W_dt + b_dt) per head, with b_dt initialised so that dt is log-uniform in
[1e-3, 1e-1], and A_h = -exp(A_log_h) with A_log_h = log(uniform(1, 16)) (both as Mamba-2).
gate="per_dim" replaces the scalar decay by a per-key-dimension one (GLA):
log a_t = logsigmoid(x_t W_g + b_g) / 16, and leaves v unscaled. Either way the read-out goes
through a per-head RMSNorm and a silu gate. Mamba-2's D skip term is left out so that the
mixer's read-out is exactly the decay core that the measurements decompose.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from harness import ops
from harness.hooks import HookPoint
from harness.layers.parts import HeadNorm, inverse_softplus, merge_heads, split_heads
from harness.layers.protocol import Mixer, ProbeMemory, identity_map
from harness.layers.registry import register

DT_MIN, DT_MAX = 1e-3, 1e-1
A_MIN, A_MAX = 1.0, 16.0
GLA_GATE_TEMPERATURE = 16.0


@register("mamba")
class GatedDecay(Mixer):
    family = "decay"
    kernel = "identity"
    has_decay = True

    def __init__(self, config, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        self.form, self.chunk_size, self.gate = config.form, config.chunk_size, config.gate
        C, H = config.d_model, self.n_heads
        self.gate_proj = nn.Linear(C, C, bias=False)  # silu output gate (Mamba's z)
        self.out_proj = nn.Linear(C, C, bias=False)
        self.norm = HeadNorm(H, self.d_head, "rmsnorm")
        if self.gate == "scalar":
            self.dt_proj = nn.Linear(C, H, bias=False)
            self.dt_bias = nn.Parameter(torch.empty(H))
            self.A_log = nn.Parameter(torch.empty(H))
            self.hook_dt = HookPoint()  # (B, H, T): the write scale of each step, for N_eff
        else:  # "per_dim"
            self.decay_proj = nn.Linear(C, H * self.d_qk, bias=False)  # one gate per key dimension
            self.decay_bias = nn.Parameter(torch.empty(H * self.d_qk))
        self.reset_decay_parameters()

    @torch.no_grad()
    def reset_decay_parameters(self) -> None:
        """Mamba-2 / GLA initialisation; the model calls this again after its generic init."""
        if self.gate == "scalar":
            H = self.n_heads
            dt = torch.exp(torch.empty(H).uniform_(math.log(DT_MIN), math.log(DT_MAX)))
            self.dt_bias.copy_(inverse_softplus(dt))
            self.A_log.copy_(torch.log(torch.empty(H).uniform_(A_MIN, A_MAX)))
        else:
            # logsigmoid(b)/16 with b ~ U(1, 5): per-step decay between 0.98 and 0.9996
            self.decay_bias.uniform_(1.0, 5.0)

    def log_decay(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(log_decay, dt): both (B, H, T) for scalar; (B, H, T, D) and None for per_dim."""
        # Decays are summed over many steps: keep them in at least float32 under bf16 autocast.
        dtype = torch.promote_types(x.dtype, torch.float32)
        if self.gate == "scalar":
            dt = F.softplus(self.dt_proj(x).to(dtype) + self.dt_bias.to(dtype)).transpose(1, 2)  # (B, H, T)
            A = -torch.exp(self.A_log.to(dtype))  # (H,)
            return dt * A[None, :, None], dt
        g = F.logsigmoid(self.decay_proj(x).to(dtype) + self.decay_bias.to(dtype)) / GLA_GATE_TEMPERATURE  # (B, T, H d_qk)
        return split_heads(g, self.n_heads), None  # (B, H, T, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, C)
        q, k, v = self.project_qkv(x)  # (B, H, T, D)
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        q, k = self.hook_q_raw(q), self.hook_k_raw(k)  # no feature map: raw == fed
        log_decay, dt = self.log_decay(x)
        if dt is not None:
            v = v * self.hook_dt(dt).unsqueeze(-1)  # SSD: the input is discretised with the same step as the decay
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        log_decay = self.hook_log_decay(log_decay)
        o = ops.decay_attention(q, k, v, log_decay, form=self.form, chunk_size=self.chunk_size)  # (B, H, T, D)
        o = self.norm(self.hook_out(o))
        return self.out_proj(merge_heads(o) * F.silu(self.gate_proj(x)))

    @property
    def core(self) -> str:
        return "decay_scalar" if self.gate == "scalar" else "decay_per_dim"

    def state_size(self, sequence_length: int = 2048) -> int:
        return self.n_heads * ops.state_elements(self.d_key, self.d_head, normalize=False)

    def effective_weights(self, hooks, rows=None) -> torch.Tensor:
        return ops.decay_weights(hooks["q"], hooks["k"], hooks["log_decay"], rows=rows)  # (B, H, R, T)

    @classmethod
    def probe_memory(cls, d: int, seed: int) -> ProbeMemory:
        """Mamba-2's SSD core at its initialisation: A = -uniform(A_MIN, A_MAX), one draw per seed,
        dt log-uniform in [DT_MIN, DT_MAX] per token (an independent draw stands in for the input
        dependence of dt); writes scaled by dt, no denominator."""
        gen = torch.Generator().manual_seed(seed)
        A = float(torch.empty(1, dtype=torch.float64).uniform_(A_MIN, A_MAX, generator=gen))

        def decay(shape, gen):
            lo, hi = math.log(DT_MIN), math.log(DT_MAX)
            dt = torch.exp(torch.empty(*shape, dtype=torch.float64).uniform_(lo, hi, generator=gen))
            return -A * dt, dt

        return ProbeMemory(read="state", phi_k=identity_map, phi_q=identity_map, d_key=d, decay=decay)
