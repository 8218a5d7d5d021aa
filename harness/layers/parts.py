"""Parts the mixers are built from: norms, rotary embedding, short convolution, MLP, head split."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from harness.ops.conv import causal_conv


# --------------------------------------------------------------------------------------------
# Norms

NORMS = ("layernorm", "rmsnorm")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def make_norm(kind: str, dim: int) -> nn.Module:
    if kind == "layernorm":
        return nn.LayerNorm(dim)
    if kind == "rmsnorm":
        return RMSNorm(dim)
    raise ValueError(f"unknown norm {kind!r}; valid: {list(NORMS)}")


class HeadNorm(nn.Module):
    """Per-head normalisation of a (B, H, T, D) read-out, then a per-channel gain.

    This is RetNet's group norm (one group per head) with kind="layernorm" and Mamba-2's
    per-head RMSNorm with kind="rmsnorm". Decay mixers have no denominator, so this norm is
    what keeps their read-out on a fixed scale.
    """

    def __init__(self, n_heads: int, d_head: int, kind: str, eps: float = 1e-5) -> None:
        super().__init__()
        if kind not in NORMS:
            raise ValueError(f"unknown norm {kind!r}; valid: {list(NORMS)}")
        self.kind, self.eps = kind, eps
        self.weight = nn.Parameter(torch.ones(n_heads, 1, d_head))
        self.bias = nn.Parameter(torch.zeros(n_heads, 1, d_head)) if kind == "layernorm" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, H, T, D)
        if self.kind == "layernorm":
            x = x - x.mean(-1, keepdim=True)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        return x + self.bias if self.bias is not None else x


# --------------------------------------------------------------------------------------------
# Rotary position embedding (rotate-half layout). Positions are computed per call: the model
# has no learned absolute positions, and this keeps float64 runs exact.


def qk_width(cfg) -> int:
    """Per-head width of q and k: cfg.qk_dim, else that of v (d_model / n_heads)."""
    return cfg.qk_dim or cfg.d_model // cfg.n_heads


def rotary_enabled(cfg) -> bool:
    """cfg.rotary; off when None (softmax takes learned absolute positions by default)."""
    return bool(cfg.rotary)


class Rotary(nn.Module):
    def __init__(self, d_head: int, base: float = 10000.0) -> None:
        super().__init__()
        if d_head % 2:
            raise ValueError(f"rotary needs an even head dimension, got {d_head}")
        inv_freq = base ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, H, T, D)
        T = x.shape[-2]
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        t = torch.arange(T, device=x.device, dtype=dtype)
        angles = t[:, None] * self.inv_freq.to(device=x.device, dtype=dtype)[None, :]  # (T, D/2)
        cos = torch.cat([angles.cos(), angles.cos()], -1).to(x.dtype)  # (T, D)
        sin = torch.cat([angles.sin(), angles.sin()], -1).to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin


# --------------------------------------------------------------------------------------------
# Short causal depthwise convolution: each channel mixes its last `size` positions. One such
# layer lets a single attention layer see the previous token, which MQAR needs.


class ShortConv(nn.Module):
    def __init__(self, dim: int, size: int) -> None:
        super().__init__()
        self.size = size
        self.conv = nn.Conv1d(dim, dim, size, groups=dim, padding=size - 1, bias=True)  # holds the taps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, C)
        # y_t = b + sum_i w_i x_{t-size+1+i} on the (B, T, C) layout, one fused op on CPU
        # (harness.ops.conv), without nn.Conv1d's two transposes.
        return causal_conv(x, self.conv.weight[:, 0, :], self.conv.bias)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The same convolution by nn.Conv1d (the oracle of the tests)."""
        T = x.shape[1]
        return self.conv(x.transpose(1, 2))[..., :T].transpose(1, 2)  # left padding only -> causal


# --------------------------------------------------------------------------------------------
# MLP


class MLP(nn.Module):
    def __init__(self, d_model: int, ratio: int, dropout: float) -> None:
        super().__init__()
        self.in_proj = nn.Linear(d_model, ratio * d_model)
        self.out_proj = nn.Linear(ratio * d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.out_proj(F.gelu(self.in_proj(x))))


# --------------------------------------------------------------------------------------------
# Head split / merge shared by every mixer.


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    B, T, C = x.shape
    return x.view(B, T, n_heads, C // n_heads).transpose(1, 2)  # (B, H, T, D)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    B, H, T, D = x.shape
    return x.transpose(1, 2).reshape(B, T, H * D)  # (B, T, C)


def split_decay_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: int):
    """(B, H, T, .) -> (B, H g, T, .): g decay heads per q/k head (Mamba-2's heads sharing B and C,
    RetNet's multi-scale heads here), q and k repeated for each decay head of their head, v cut
    into the decay heads' slices of width D / g. Decay head i g + j is slice j of q/k head i."""
    if g == 1:
        return q, k, v
    B, H, T, D = v.shape
    v = v.view(B, H, T, g, D // g).transpose(2, 3).reshape(B, H * g, T, D // g)  # (B, H g, T, D/g)
    return q.repeat_interleave(g, dim=1), k.repeat_interleave(g, dim=1), v


def merge_decay_heads(o: torch.Tensor, g: int) -> torch.Tensor:
    """(B, H g, T, D/g) -> (B, H, T, D): the decay heads of a q/k head side by side again."""
    if g == 1:
        return o
    B, Hg, T, Dg = o.shape
    return o.view(B, Hg // g, g, T, Dg).transpose(2, 3).reshape(B, Hg // g, T, g * Dg)


def inverse_softplus(y: torch.Tensor) -> torch.Tensor:
    """x with softplus(x) = y, stable for small y."""
    return y + torch.log(-torch.expm1(-y))


# silu(GATE_BIAS_OPEN) = 1: an output gate silu(x W + b) with W = 0 and this bias passes the
# read-out unchanged, the same for every token.
GATE_BIAS_OPEN = 1.2784645


@torch.no_grad()
def open_gate_(gate: nn.Linear) -> None:
    """Start a silu output gate open and equal for every token (W = 0, silu(b) = 1), in place.

    With a Xavier-initialised gate, silu(x W) multiplies each read-out by a different random
    factor per token, many of them near zero, which starves the mixer of gradient while the
    residual stream grows. Open, the layer starts as its plain decayed state and learns the
    gating (DeltaNet's starting point; what it changed on the needle task is in
    docs/reproductions.md).
    """
    nn.init.zeros_(gate.weight)
    nn.init.constant_(gate.bias, GATE_BIAS_OPEN)

