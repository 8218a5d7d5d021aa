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


# Mamba-2's scalar decay per head, shared with the gated delta rule (harness.layers.deltanet).

@torch.no_grad()
def init_scalar_decay(dt_bias: torch.Tensor, A_log: torch.Tensor) -> None:
    """Mamba-2's initialisation, in place: softplus(dt_bias) log-uniform in [DT_MIN, DT_MAX],
    exp(A_log) uniform in [A_MIN, A_MAX], one value per head."""
    H = dt_bias.numel()
    dt = torch.exp(torch.empty(H).uniform_(math.log(DT_MIN), math.log(DT_MAX)))
    dt_bias.copy_(inverse_softplus(dt))
    A_log.copy_(torch.log(torch.empty(H).uniform_(A_MIN, A_MAX)))


def scalar_log_decay(dt_logits: torch.Tensor, dt_bias: torch.Tensor, A_log: torch.Tensor):
    """(log a, dt), both (B, H, T), of dt_logits = x W_dt (B, T, H): dt = softplus(x W_dt + b_dt),
    log a = dt * A with A = -exp(A_log) < 0. In at least float32 (decays are summed over many
    steps: never bf16 under autocast)."""
    dtype = torch.promote_types(dt_logits.dtype, torch.float32)
    dt = F.softplus(dt_logits.to(dtype) + dt_bias.to(dtype)).transpose(1, 2)  # (B, H, T)
    A = -torch.exp(A_log.to(dtype))  # (H,)
    return dt * A[None, :, None], dt


def scalar_decay_draws(seed: int):
    """The probe's stand-in for a scalar decay at initialisation: A = -uniform(A_MIN, A_MAX), one
    draw per seed, dt log-uniform in [DT_MIN, DT_MAX] per token (an independent draw stands in
    for the input dependence of dt). Returns decay(shape, gen) -> (log a, dt), float64."""
    gen = torch.Generator().manual_seed(seed)
    A = float(torch.empty(1, dtype=torch.float64).uniform_(A_MIN, A_MAX, generator=gen))

    def decay(shape, gen):
        lo, hi = math.log(DT_MIN), math.log(DT_MAX)
        dt = torch.exp(torch.empty(*shape, dtype=torch.float64).uniform_(lo, hi, generator=gen))
        return -A * dt, dt

    return decay


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
            init_scalar_decay(self.dt_bias, self.A_log)
        else:
            # logsigmoid(b)/16 with b ~ U(1, 5): per-step decay between 0.98 and 0.9996
            self.decay_bias.uniform_(1.0, 5.0)

    def log_decay(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(log_decay, dt): both (B, H, T) for scalar; (B, H, T, D) and None for per_dim."""
        if self.gate == "scalar":
            return scalar_log_decay(self.dt_proj(x), self.dt_bias, self.A_log)
        # Decays are summed over many steps: keep them in at least float32 under bf16 autocast.
        dtype = torch.promote_types(x.dtype, torch.float32)
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
        return self.core_for(self)

    @classmethod
    def core_for(cls, config) -> str:
        """The decay core of a gate: one log decay per head (scalar) or per key dimension."""
        return "decay_scalar" if config.gate == "scalar" else "decay_per_dim"

    def state_size(self, sequence_length: int = 2048) -> int:
        return self.n_heads * ops.state_elements(self.d_key, self.d_head, normalize=False)

    def effective_weights(self, hooks, rows=None) -> torch.Tensor:
        return ops.decay_weights(hooks["q"], hooks["k"], hooks["log_decay"], rows=rows)  # (B, H, R, T)

    @classmethod
    def probe_memory(cls, d: int, seed: int) -> ProbeMemory:
        """Mamba-2's SSD core at its initialisation (scalar_decay_draws); writes scaled by dt, no
        denominator."""
        return ProbeMemory(read="state", phi_k=identity_map, phi_q=identity_map, d_key=d,
                           decay=scalar_decay_draws(seed))
