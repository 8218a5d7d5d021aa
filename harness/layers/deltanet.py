"""DeltaNet and Gated DeltaNet: the delta rule, a state that writes corrections (harness.ops.delta).

    S_t = a_t S_{t-1} + k_t (beta_t (v_t - a_t S_{t-1}^T k_t))^T,   o_t = S_t^T q_t

deltanet (Schlag et al. 2021; Yang et al. 2024) has a_t = 1; gated_deltanet (Yang, Kautz &
Hatamizadeh 2024) puts Mamba-2's data-dependent scalar decay in front of S_{t-1}:
log a_t = -exp(A_log_h) softplus(x_t W_a + b_dt), with Mamba-2's parameterisation and
initialisation (harness.layers.mamba). The write strength is beta_t = sigmoid(x_t W_beta),
one per head and token.

The control (`model.options.rule=additive`): the same layer with the delta term removed,

    S_t = a_t S_{t-1} + k_t (beta_t v_t)^T,   o_t = S_t^T q_t,

with everything else as it is (projections, short convolution, silu and L2-normalised q and k,
q scaled by d_qk^-1/2, beta, the decay of gated_deltanet, output norm and gate, initialisation).
It runs on the additive cores (ops.linear_attention undivided for deltanet, ops.decay_attention
for gated_deltanet: a decayed additive state), so a difference between the two rules is the
rule's own. Its hooks are the delta rule's (hook_v the values, hook_beta the write strengths),
and its effective weights carry beta: a_ij = beta_j q_i . (prod_{j<s<=i} a_s) k_j.

As fla's DeltaNet / GatedDeltaNet layers: q, k and v projected and short-convolved (the Mixer
base), q and k through silu and L2-normalised per head (so |k| = 1 and every step is a
contraction), q scaled by d_qk^-1/2, and the read-out through a per-head RMSNorm and a silu
output gate before the output projection. fla also passes v through silu (its convolution's
activation); here v stays linear, as in every other mixer of the harness, so that comparisons
between mixers differ only in the state update. Rotary, when on, acts on the projections
before silu.

Why beta starts small and equal. Every write also erases along its key, so the layer has to
learn to gate its writes by token: beta high at value positions, low at key and query tokens.
With fla's Xavier-initialised W_beta (beta near 0.5 for every token from the start) the key
and query tokens erase as much as the values write, and the layer can sit on the interference
plateau. Started with weak, equal writes (beta = BETA_START for every token) and an open
output gate, it starts near additive linear attention and learns the gating from there (the
capacity experiment, `+experiment=capacity model=elu,deltanet`, compares the two). The short convolution keeps
the harness's bias, which fla's layer does not have.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from harness import checks, ops
from harness.hooks import HookPoint
from harness.layers.mamba import init_scalar_decay, scalar_decay_draws, scalar_log_decay
from harness.layers.options import Options, only_here
from harness.layers.parts import HeadNorm, merge_heads, open_gate_
from harness.layers.protocol import Mixer, ProbeMemory
from harness.layers.registry import register

L2_EPS = 1e-6  # floor of |silu(q)|, |silu(k)| in the L2 normalisation
BETA_START = 0.05  # every token's write strength at initialisation (see the module docstring)


def unit_rows(x: torch.Tensor) -> torch.Tensor:
    """x / |x| along the last dimension: the keys and queries the delta rule is fed."""
    return F.normalize(x, dim=-1, eps=L2_EPS)


RULES = ("delta", "additive")


@dataclass(frozen=True)
class DeltaOptions(Options):
    # delta | additive (the same layer without the delta term); refused on the mixers without it
    rule: str = only_here("delta")

    def check(self) -> None:
        checks.choice("model.options.rule", self.rule, RULES)


@register("deltanet")
class DeltaNet(Mixer):
    family = "delta"  # the rule's default; an instance carries its rule's (families)
    kernel = "identity"
    Options = DeltaOptions
    cores = {"delta": "delta", "additive": "linear"}  # the harness.ops core of each rule
    families = {"delta": "delta", "additive": "linear"}

    def __init__(self, config, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        self.form, self.chunk_size, self.rule = config.form, config.chunk_size, self.options_of(config).rule
        self.family = self.families[self.rule]
        C, H = config.d_model, self.n_heads
        self.beta_proj = nn.Linear(C, H)
        self.gate_proj = nn.Linear(C, C)  # silu output gate
        self.out_proj = nn.Linear(C, C, bias=False)
        self.norm = HeadNorm(H, self.d_head, "rmsnorm")
        self.hook_beta = HookPoint()  # (B, H, T): the write strength of each step
        self.q_scale = self.d_qk**-0.5
        self.reset_write_parameters()

    @torch.no_grad()
    def reset_write_parameters(self) -> None:
        """Write strength and output gate start the same for every token (see the module
        docstring): beta = BETA_START (W_beta = 0, its bias logit(BETA_START)), and the gate
        silu(x W_g + b_g) = 1 (harness.layers.parts.open_gate_)."""
        nn.init.zeros_(self.beta_proj.weight)
        nn.init.constant_(self.beta_proj.bias, math.log(BETA_START / (1 - BETA_START)))
        open_gate_(self.gate_proj)

    @torch.no_grad()
    def reset_decay_parameters(self) -> None:
        """Called by the model after its generic (Xavier, zero-bias) init: puts back this
        mixer's own starting point."""
        self.reset_write_parameters()

    def log_decay(self, x: torch.Tensor):
        """(B, H, T) log a_t, or None (a = 1)."""
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, C)
        q, k, v = self.project_qkv(x)  # (B, H, T, D)
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        q, k = self.hook_q_raw(q), self.hook_k_raw(k)
        q = self.hook_q(unit_rows(F.silu(q)) * self.q_scale)
        k = self.hook_k(unit_rows(F.silu(k)))
        v = self.hook_v(v)
        beta = self.hook_beta(torch.sigmoid(self.beta_proj(x)).transpose(1, 2))  # (B, H, T)
        log_decay = self.log_decay(x)
        if self.rule == "delta":
            o = ops.delta_attention(q, k, v, beta, log_decay, form=self.form, chunk_size=self.chunk_size)  # (B, H, T, D)
        else:
            o = self.additive(q, k, v * beta.unsqueeze(-1).to(v.dtype), log_decay)  # (B, H, T, D)
        o = self.norm(self.hook_out(o))
        return self.out_proj(merge_heads(o) * F.silu(self.gate_proj(x)))

    def additive(self, q, k, v, log_decay):
        """The additive rule's read-out, v already scaled by beta: S_t = S_{t-1} + k_t v_t^T."""
        return ops.linear_attention(q, k, v, form=self.form, causal=True, normalize=False, chunk_size=self.chunk_size)

    @property
    def core(self) -> str:
        return self.cores[self.rule]

    @classmethod
    def core_for(cls, config) -> str:
        """The harness.ops core of model.options.rule: the delta rule's, or the additive state's."""
        return cls.cores[cls.options_of(config).rule]

    def state_size(self, sequence_length: int = 2048) -> int:
        return self.n_heads * ops.state_elements(self.d_key, self.d_head, normalize=False)

    def effective_weights(self, hooks, rows=None) -> torch.Tensor:
        log_decay = hooks.get("log_decay")
        if self.rule == "delta":
            return ops.delta_weights(hooks["q"], hooks["k"], hooks["beta"], log_decay, rows=rows)  # (B, H, R, T)
        if log_decay is None:
            w = ops.linear_weights(hooks["q"], hooks["k"], causal=True, normalize=False, rows=rows)
        else:
            w = ops.decay_weights(hooks["q"], hooks["k"], log_decay, rows=rows)
        return w * hooks["beta"].unsqueeze(-2).to(w.dtype)  # (B, H, R, T): write j scaled by beta_j

    @classmethod
    def probe_memory(cls, d: int, seed: int, rule: str = "delta") -> ProbeMemory:
        """Unit keys written with beta = 1: each write overwrites what the state held for its key
        (the delta rule), or adds to it (model.options.rule=additive, the plain linear memory of unit keys)."""
        read = "delta" if rule == "delta" else "state"
        return ProbeMemory(read=read, phi_k=unit_rows, phi_q=unit_rows, d_key=d)


@register("gated_deltanet")
class GatedDeltaNet(DeltaNet):
    has_decay = True
    tags = frozenset({"gated"})
    cores = {"delta": "delta_gated", "additive": "decay_scalar"}
    families = {"delta": "delta", "additive": "decay"}

    def __init__(self, config, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        H = self.n_heads
        self.dt_proj = nn.Linear(config.d_model, H, bias=False)
        self.dt_bias = nn.Parameter(torch.empty(H))
        self.A_log = nn.Parameter(torch.empty(H))
        self.reset_decay_parameters()

    @torch.no_grad()
    def reset_decay_parameters(self) -> None:
        """Mamba-2's initialisation of the decay, and DeltaNet's write strength and gate."""
        super().reset_decay_parameters()
        init_scalar_decay(self.dt_proj, self.dt_bias, self.A_log)

    def log_decay(self, x: torch.Tensor) -> torch.Tensor:
        log_decay, _ = scalar_log_decay(self.dt_proj(x), self.dt_bias, self.A_log)  # (B, H, T); v is not dt-scaled
        return self.hook_log_decay(log_decay)

    def additive(self, q, k, v, log_decay):
        """The decayed additive state, v already scaled by beta: S_t = a_t S_{t-1} + k_t v_t^T."""
        return ops.decay_attention(q, k, v, log_decay, form=self.form, chunk_size=self.chunk_size)

    @classmethod
    def probe_memory(cls, d: int, seed: int, rule: str = "delta") -> ProbeMemory:
        """Unit keys written with beta = 1 into a state decayed as Mamba-2's at initialisation
        (harness.layers.mamba.scalar_decay_draws), by the delta rule or (model.options.rule=additive)
        added; writes are not scaled by dt."""
        draws = scalar_decay_draws(seed)

        def decay(shape, gen):
            log_a, _ = draws(shape, gen)
            return log_a, None

        read = "delta" if rule == "delta" else "state"
        return ProbeMemory(read=read, phi_k=unit_rows, phi_q=unit_rows, d_key=d, decay=decay)
