"""DPFP linear attention (Schlag, Irie & Schmidhuber 2021), written outside the harness.

An example of the mixer protocol (docs/extending.md): a plain nn.Module the harness builds
from `model.name=examples.dpfp.DPFPAttention`, with keyword arguments it supplies (d_model,
n_heads, layer_idx) and one of its own (`nu`, from `model.options.nu=2`). The library's own
DPFP mixer is the built-in `model=dpfp` (harness.layers.kernel); both use the one feature map,
harness.features.dpfp, which an outside module imports like any other public function.

The deterministic parameter-free projection of a d-vector x: r = [relu(x), relu(-x)] (2d), then
phi_nu(x) = [r * roll(r, 1), r * roll(r, 2), ..., r * roll(r, nu)] with 2 d nu features. Its
features are non-negative and sparse, so phi(q).phi(k) is large only for matching signs and the
feature dimension (the key side of the state) is set by nu, independently of the model width.

Everything the harness measures comes from the members declared below; delete one and the
matching measurement is skipped with its reason in results.json.
"""
from __future__ import annotations

import torch
from torch import nn

from harness import ops
from harness.features import dpfp  # (..., d) -> (..., 2 d nu), every entry >= 0
from harness.hooks import HookPoint
from harness.layers import ProbeMemory
from harness.layers.parts import ShortConv


class DPFPAttention(nn.Module):
    # what theory, the probe and mode=cost read off the mixer (harness.layers.protocol)
    family = "linear"          # normalised additive state: the crosstalk law applies
    core = "linear"            # the harness.ops core it runs: mode=cost times ops.linear_attention
    kernel = None              # no closed-form kernel dimension: the trained statistics measure it
    positive_denominator = False  # phi >= 0 but may be exactly 0: the floor eps handles a zero row

    def __init__(self, d_model: int, n_heads: int, layer_idx: int = 0, nu: int = 1, conv_size: int = 4,
                 eps: float = 1e-6) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not a multiple of n_heads={n_heads}")
        self.n_heads, self.d_head, self.nu, self.eps = n_heads, d_model // n_heads, nu, eps
        self.d_key = 2 * self.d_head * nu  # key side of the state
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        # Without a short convolution a single layer cannot tie a value to the key before it.
        self.conv = ShortConv(3 * d_model, conv_size)
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.hook_q_raw, self.hook_k_raw = HookPoint(), HookPoint()  # before the feature map
        self.hook_q, self.hook_k, self.hook_v, self.hook_out = HookPoint(), HookPoint(), HookPoint(), HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C)
        B, T, C = x.shape
        q, k, v = self.conv(self.qkv(x)).view(B, T, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)  # (B, H, T, D)
        q, k = self.hook_q_raw(q), self.hook_k_raw(k)
        q, k, v = self.hook_q(dpfp(q, self.nu)), self.hook_k(dpfp(k, self.nu)), self.hook_v(v)  # (B, H, T, m)
        o = self.hook_out(ops.linear_attention(q, k, v, form="chunk", eps=self.eps))  # (B, H, T, D)
        return self.out(o.transpose(1, 2).reshape(B, T, C))

    def state_size(self, sequence_length: int = 2048) -> int:
        """S (m x d_head) and z (m) per head: elements kept per layer, whatever the length."""
        return self.n_heads * ops.state_elements(self.d_key, self.d_head)

    def effective_weights(self, hooks, rows=None) -> torch.Tensor:
        """a_ij = phi(q_i).phi(k_j) / sum_l phi(q_i).phi(k_l), (B, H, R, T): what the op computed."""
        return ops.linear_weights(hooks["q"], hooks["k"], causal=True, normalize=True, eps=self.eps, rows=rows)

    @classmethod
    def probe_memory(cls, d: int, seed: int, nu: int = 1) -> ProbeMemory:
        """For `mode=probe`: random keys through the same feature map, read normalised."""
        phi = lambda x: dpfp(x, nu)  # noqa: E731
        return ProbeMemory(read="state", phi_k=phi, phi_q=phi, d_key=2 * d * nu, normalize=True)
