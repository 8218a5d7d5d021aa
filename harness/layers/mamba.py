"""Mamba-2 style input-dependent gating (and GLA's per-key-dimension gate as an option).

The SSD recurrence is the shared decay core with q = C, k = B, v = dt * x, log a = dt * A:

  S_t = exp(dt_t A_h) S_{t-1} + k_t (dt_t v_t)^T,   o_t = q_t^T S_t

Heads as in Mamba-2. Each q/k head (Mamba-2's group: one B and one C, ngroups = model.n_heads)
is shared by model.options.mamba_heads *decay heads* (default 4); decay head h reads its own
d_head / mamba_heads wide slice of v with its own dt and A_h, so the heads of a group hold the
same keys over different timescales. The state is d_key x d_head per q/k head, whatever the
split. (Mamba-2 at scale has nheads = 2 d_model / 64 heads of width 64; at the widths here, 4
heads per group keep the spread of timescales at a cost of about 1.5 times the one-head step:
each decay head scores its queries against the shared keys again.)

dt_t = softplus(x_t W_dt + b_dt) per decay head, with b_dt set so that the heads' dt at
initialisation spread log-uniformly over [1e-3, 1e-1] (one draw per equal-width stratum of
log dt, so that even 2 heads get a short and a long memory), and A_h = -exp(A_log_h),
A_log_h = log(uniform(1, 16)) (Mamba-2's ranges). W_dt starts as torch's default Linear
init, as Mamba-2's in_proj does: x W_dt then has a standard deviation of about 0.58 for
unit-variance inputs. (The model's Xavier init gives a one-output projection a standard
deviation of about 1.4, which spreads dt over e^(+-2.8) around its bias and, with a single
head, left the only memory a few tokens long; see docs/reproductions.md.) dt_bias and A_log
are marked `_no_weight_decay`, as Mamba-2 marks them, and harness.train.loop keeps them
out of weight decay.

gate="per_dim" replaces the scalar decay by a per-key-dimension one (GLA):
log a_t = logsigmoid(x_t W_g + b_g) / 16, and leaves v unscaled (one decay head per q/k head).
Either way the read-out of each q/k head goes through an RMSNorm over its d_head channels
(Mamba-2's grouped norm) and a silu gate. Mamba-2's D skip term is left out so that the
mixer's read-out is exactly the decay core that the measurements decompose.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from harness import checks, ops
from harness.hooks import HookPoint
from harness.layers.options import Options
from harness.layers.parts import (HeadNorm, inverse_softplus, merge_decay_heads, merge_heads, open_gate_, split_decay_heads,
                                  split_heads)
from harness.layers.protocol import Mixer, ProbeMemory, identity_map
from harness.layers.registry import register

DT_MIN, DT_MAX = 1e-3, 1e-1
A_MIN, A_MAX = 1.0, 16.0
GLA_GATE_TEMPERATURE = 16.0


GATES = ("scalar", "per_dim")


@dataclass(frozen=True)
class MambaOptions(Options):
    gate: str = "scalar"  # scalar (Mamba-2, per decay head) | per_dim (GLA, per key dimension)
    mamba_heads: int = 4  # decay heads per q/k head (Mamba-2's heads sharing B and C), each its own dt, A

    def check(self) -> None:
        checks.choice("model.options.gate", self.gate, GATES)
        checks.integer("model.options.mamba_heads", self.mamba_heads)

    def decay_heads_per_group(self) -> int:
        """Decay heads sharing one q/k head: mamba_heads for the scalar gate, 1 for per_dim."""
        return self.mamba_heads if self.gate == "scalar" else 1


def stratified_log_uniform(n: int, lo: float, hi: float) -> torch.Tensor:
    """n values, one log-uniform draw in each of n equal strata of [log lo, log hi], shuffled."""
    u = (torch.arange(n, dtype=torch.float64) + torch.rand(n, dtype=torch.float64)) / n
    return torch.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))[torch.randperm(n)]


# Mamba-2's scalar decay per head, shared with the gated delta rule (harness.layers.deltanet).

@torch.no_grad()
def init_scalar_decay(dt_proj: nn.Linear, dt_bias: torch.Tensor, A_log: torch.Tensor) -> None:
    """Mamba-2's initialisation, in place: the dt projection at torch's default init (as Mamba-2's
    in_proj; the model's Xavier init spreads x W_dt so wide that dt * A reaches -40 and a head
    forgets everything at a token), softplus(dt_bias) log-uniform in [DT_MIN, DT_MAX] (spread by
    strata, so that a few heads still cover the range), exp(A_log) uniform in [A_MIN, A_MAX],
    one value per head."""
    dt_proj.reset_parameters()
    H = dt_bias.numel()
    dt_bias.copy_(inverse_softplus(stratified_log_uniform(H, DT_MIN, DT_MAX)))
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
    tags = frozenset({"gated"})
    Options = MambaOptions

    @classmethod
    def check_config(cls, config) -> None:
        """mamba_heads must split the head's v evenly (called by harness.model.validate)."""
        d_head, opts = config.d_model // config.n_heads, cls.options_of(config)
        checks.require(opts.gate != "scalar" or d_head % opts.mamba_heads == 0,
                       f"model.options.mamba_heads={opts.mamba_heads} must divide the head width "
                       f"model.d_model/model.n_heads = {d_head}")

    def __init__(self, config, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        opts = self.options_of(config)
        self.form, self.chunk_size, self.gate = config.form, config.chunk_size, opts.gate
        C, H = config.d_model, self.n_heads
        self.per_group = self.decay_heads_for(config)  # decay heads per q/k head
        self.heads_per_readout = self.per_group  # a group's decay heads are normed and read out together
        self.decay_head_dim = self.d_head // self.per_group
        self.gate_proj = nn.Linear(C, C)  # silu output gate (Mamba's z), starts open
        self.out_proj = nn.Linear(C, C, bias=False)
        self.norm = HeadNorm(H, self.d_head, "rmsnorm")
        if self.gate == "scalar":
            Hd = H * self.per_group
            self.dt_proj = nn.Linear(C, Hd, bias=False)
            self.dt_bias = nn.Parameter(torch.empty(Hd))
            self.A_log = nn.Parameter(torch.empty(Hd))
            self.dt_bias._no_weight_decay = True
            self.A_log._no_weight_decay = True
            self.hook_dt = HookPoint()  # (B, Hd, T): the write scale of each step, for N_eff
        else:  # "per_dim"
            self.decay_proj = nn.Linear(C, H * self.d_qk, bias=False)  # one gate per key dimension
            self.decay_bias = nn.Parameter(torch.empty(H * self.d_qk))
        self.reset_decay_parameters()

    @torch.no_grad()
    def reset_decay_parameters(self) -> None:
        """Mamba-2 / GLA initialisation of the decay and an open output gate
        (harness.layers.parts.open_gate_); the model calls this again after its generic init."""
        open_gate_(self.gate_proj)
        if self.gate == "scalar":
            init_scalar_decay(self.dt_proj, self.dt_bias, self.A_log)
        else:
            # logsigmoid(b)/16 with b ~ U(1, 5): per-step decay between 0.98 and 0.9996
            self.decay_bias.uniform_(1.0, 5.0)

    def log_decay(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(log_decay, dt): both (B, Hd, T) (one per decay head) for scalar; (B, H, T, D) and
        None for per_dim."""
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
        q, k, v = split_decay_heads(q, k, v, self.per_group)  # (B, Hd, T, .)
        q, k = self.hook_q_raw(q), self.hook_k_raw(k)  # no feature map: raw == fed
        log_decay, dt = self.log_decay(x)
        if dt is not None:
            v = v * self.hook_dt(dt).unsqueeze(-1)  # SSD: the input is discretised with the same step as the decay
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        log_decay = self.hook_log_decay(log_decay)
        o = ops.decay_attention(q, k, v, log_decay, form=self.form, chunk_size=self.chunk_size)  # (B, Hd, T, D/g)
        o = self.norm(merge_decay_heads(self.hook_out(o), self.per_group))  # (B, H, T, D)
        return self.out_proj(merge_heads(o) * F.silu(self.gate_proj(x)))

    @property
    def core(self) -> str:
        return self.gate_core(self.gate)

    @classmethod
    def decay_heads_for(cls, config) -> int:
        """model.options.mamba_heads for the scalar gate, 1 for per_dim."""
        return cls.options_of(config).decay_heads_per_group()

    @classmethod
    def core_for(cls, config) -> str:
        return cls.gate_core(cls.options_of(config).gate)

    @staticmethod
    def gate_core(gate: str) -> str:
        """The decay core of a gate: one log decay per head (scalar) or per key dimension."""
        return "decay_scalar" if gate == "scalar" else "decay_per_dim"

    def state_size(self, sequence_length: int = 2048) -> int:
        return self.n_heads * ops.state_elements(self.d_key, self.d_head, normalize=False)

    def effective_weights(self, hooks, rows=None) -> torch.Tensor:
        """a_ij per decay head, (B, Hd, R, T): the measurements see each decay head as a head."""
        return ops.decay_weights(hooks["q"], hooks["k"], hooks["log_decay"], rows=rows)  # (B, Hd, R, T)

    @classmethod
    def probe_memory(cls, d: int, seed: int) -> ProbeMemory:
        """One decay head of Mamba-2's SSD core at its initialisation (scalar_decay_draws);
        writes scaled by dt, no denominator."""
        return ProbeMemory(read="state", phi_k=identity_map, phi_q=identity_map, d_key=d,
                           decay=scalar_decay_draws(seed))
