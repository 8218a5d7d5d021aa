"""Retention (RetNet): multi-scale constant decay, no denominator.

S_t = gamma_h S_{t-1} + k_t v_t^T, o_t = q_t^T S_t with gamma_h = 1 - 2^(-5-h) for decay head
h = 0, 1, ..., so the heads see exponentially different horizons (1/(1-gamma): 32, 64, 128,
... tokens). Each q/k head is shared by model.options.retnet_heads *decay heads* (default 4), laid out
as Mamba-2's (harness.layers.parts.split_decay_heads): decay head h reads its own
d_head / retnet_heads wide slice of v with its own gamma, so the heads of a q/k head hold the
same keys over different horizons, and h counts over every decay head of the layer (q/k head
i, decay head j: h = i * retnet_heads + j). So even model.n_heads = 1 has four horizons, up to
256 tokens; with one decay head per q/k head (model.options.retnet_heads=1) and one q/k head, the layer
would have only gamma = 1 - 2^-5 and forget everything older than a few dozen tokens by
construction. The state stays d_key x d_head per q/k head, whatever the split.

`model.options.decay` instead gives every decay head the same gamma, one horizon to sweep. q is scaled
by d_qk^-1/2; the read-out goes through a group norm per decay head (RetNet's GroupNorm, one
group per head), a swish gate and an output projection (Sun et al. 2023).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from harness import checks, ops
from harness.errors import warn
from harness.layers.options import Options
from harness.layers.parts import HeadNorm, merge_decay_heads, merge_heads, open_gate_, split_decay_heads
from harness.layers.protocol import Mixer, ProbeMemory, identity_map
from harness.layers.registry import register


def retnet_log_gammas(n_heads: int, decay: float | None = None) -> torch.Tensor:
    """log gamma_h, h = 0..H-1, in float64: gamma_h = 1 - 2^(-5-h), or `decay` for every head."""
    if decay is not None:
        return torch.full((n_heads,), math.log(decay), dtype=torch.float64)  # (H,)
    h = torch.arange(n_heads, dtype=torch.float64)
    return torch.log1p(-torch.pow(2.0, -5.0 - h))  # (H,)


@dataclass(frozen=True)
class RetNetOptions(Options):
    retnet_heads: int = 4  # decay heads per q/k head, each its own gamma over its own slice of v
    decay: Optional[float] = None  # one gamma in (0, 1) for every decay head; None: 1 - 2^(-5-h)

    def check(self) -> None:
        checks.integer("model.options.retnet_heads", self.retnet_heads)
        checks.number("model.options.decay", self.decay, "(0, 1)", nullable=True)  # log(decay) finite, < 0


@register("retnet")
class Retention(Mixer):
    family = "decay"
    core = "decay_scalar"
    kernel = "identity"
    has_decay = True
    fixed_decays = True  # gamma_h = 1 - 2^(-5-h) per head (retnet_log_gammas): what the cost bench draws
    Options = RetNetOptions

    @classmethod
    def decay_heads_for(cls, config) -> int:
        """model.options.retnet_heads."""
        return cls.options_of(config).retnet_heads

    @classmethod
    def check_config(cls, config) -> None:
        """retnet_heads must split the head's v evenly (called by harness.model.validate)."""
        d_head, heads = config.d_model // config.n_heads, cls.options_of(config).retnet_heads
        checks.require(d_head % heads == 0,
                       f"model.options.retnet_heads={heads} must divide the head width "
                       f"model.d_model/model.n_heads = {d_head}")
        if d_head // heads <= 2:
            # a layer norm over two channels leaves only the sign of their difference: at d_model 8
            # and the default 4 decay heads retnet learns no recall (findings/capacity_narrow),
            # with 1 or 2 it does
            warn(f"model.options.retnet_heads={heads} at head width {d_head} leaves "
                 f"{d_head // heads} channel(s) per decay head, and its group norm keeps "
                 "one bit of them; fewer decay heads (model.options.retnet_heads=1 or 2) keep the read-out",
                 once=("retnet_heads", heads, d_head))

    def __init__(self, config, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        opts = self.options_of(config)
        self.form, self.chunk_size = config.form, config.chunk_size
        self.per_group = self.decay_heads_for(config)  # decay heads per q/k head
        self.heads_per_readout = self.per_group  # a q/k head's decay heads are read out together
        self.decay_head_dim = self.d_head // self.per_group
        n_decay = self.n_heads * self.per_group
        self.gate_proj = nn.Linear(config.d_model, config.d_model)  # swish output gate, starts open
        self.out_proj = nn.Linear(config.d_model, config.d_model, bias=False)
        self.norm = HeadNorm(n_decay, self.decay_head_dim, "layernorm")
        self.register_buffer("log_gamma", retnet_log_gammas(n_decay, opts.decay),
                             persistent=False)  # (Hd,)
        self.q_scale = 1.0 / math.sqrt(self.d_qk)
        self.reset_decay_parameters()

    def reset_decay_parameters(self) -> None:
        """Called by the model after its generic init: the output gate starts open
        (harness.layers.parts.open_gate_; the decays are fixed buffers)."""
        open_gate_(self.gate_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, C)
        B, T, _ = x.shape
        q, k, v = self.project_qkv(x)  # (B, H, T, D)
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        q, k, v = split_decay_heads(q * self.q_scale, k, v, self.per_group)  # (B, Hd, T, .)
        q, k = self.hook_q_raw(q), self.hook_k_raw(k)  # no feature map: raw == fed
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        dtype = torch.promote_types(x.dtype, torch.float32)  # summed over many steps: never bf16
        log_decay = self.log_gamma.to(dtype)[None, :, None].expand(B, self.log_gamma.numel(), T)  # (B, Hd, T)
        log_decay = self.hook_log_decay(log_decay)
        o = ops.decay_attention(q, k, v, log_decay, form=self.form, chunk_size=self.chunk_size)  # (B, Hd, T, D/g)
        o = merge_decay_heads(self.norm(self.hook_out(o)), self.per_group)  # (B, H, T, D)
        return self.out_proj(merge_heads(o) * F.silu(self.gate_proj(x)))

    def state_size(self, sequence_length: int = 2048) -> int:
        """d_key x d_head per q/k head: its decay heads' d_key x (d_head / retnet_heads) states."""
        return self.n_heads * ops.state_elements(self.d_key, self.d_head, normalize=False)

    def effective_weights(self, hooks, rows=None) -> torch.Tensor:
        """a_ij per decay head, (B, Hd, R, T): the measurements see each decay head as a head."""
        return ops.decay_weights(hooks["q"], hooks["k"], hooks["log_decay"], rows=rows)  # (B, Hd, R, T)

    @classmethod
    def probe_memory(cls, d: int, seed: int, n_heads: int = 1, retnet_heads: int = 4,
                     decay: float | None = None) -> ProbeMemory:
        """Identity keys into one decay head's state, no denominator. The layer's decay heads
        (model.n_heads x model.options.retnet_heads, the defaults: one q/k head of four) take turns over
        the probe's pooled states, from a head drawn per row, so a row of many states averages
        over every horizon the layer has and a row of one state reads one of them at random."""
        log_gammas = retnet_log_gammas(n_heads * retnet_heads, decay)  # (Hd,)

        def draw(shape, gen):
            first = int(torch.randint(log_gammas.numel(), (1,), generator=gen))
            head = (first + torch.arange(shape[0])) % log_gammas.numel()  # (B,) one decay head per state
            return log_gammas[head][:, None].expand(shape).clone(), None

        return ProbeMemory(read="state", phi_k=identity_map, phi_q=identity_map, d_key=d, decay=draw)
