"""Normalised kernel (linear) attention: linear, elu, favor and taylor.

o_i = phi(q_i)^T S_i / phi(q_i)^T z_i with S_i = sum_{j<=i} phi(k_j) v_j^T, z_i = sum_{j<=i} phi(k_j),
computed by ops.linear_attention in the configured form (chunk for training; parallel and
recurrent give the same numbers). The feature maps come from harness.features:

  linear  identity          m = d      (exact, hand-checkable; the denominator can change sign)
  elu     elu(x) + 1        m = d      (Katharopoulos et al. 2020)
  favor   FAVOR+            m features (Performer); phi(q).phi(k) estimates exp(q.k / sqrt(d))
  taylor  [1, x, x(x)x/sqrt2]  m = 1 + d + d^2; phi(q).phi(k) = 1 + s + s^2/2, s = q.k / sqrt(d)

favor and taylor approximate exp, so q and k are scaled by d^-1/4 *before* the feature map:
their product then carries softmax's 1/sqrt(d) temperature.
"""

from __future__ import annotations

import torch
from torch import nn

from harness import features, ops
from harness.layers.common import Mixer, merge_heads, register

FEATURES = {"linear": "identity", "elu": "elu1", "favor": "favor", "taylor": "taylor"}
EXP_KERNELS = ("favor", "taylor")  # feature maps that estimate exp(q.k): scale inputs by d^-1/4
FAVOR_SEED_STRIDE = 1_000_000  # layer l draws seeds l * stride, l * stride + 1, ... (one per redraw)


@register(*FEATURES)
class KernelAttention(Mixer):
    family = "linear"

    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.form, self.chunk_size, self.eps = cfg.form, cfg.chunk_size, cfg.eps
        self.redraw_each_step = cfg.name == "favor" and cfg.favor_redraw == "step"
        self.out_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.input_scale = self.d_qk**-0.25 if cfg.name in EXP_KERNELS else 1.0
        m = cfg.favor_features if cfg.name == "favor" else None
        # FAVOR+ features differ between layers and are shared by the heads of one layer, as in
        # the Performer. They are a pure function of their seed, so the seed (which advances on
        # every redraw) is what the state_dict keeps.
        seed = FAVOR_SEED_STRIDE * layer_idx
        self.phi = features.feature_map(FEATURES[cfg.name], self.d_qk, m=m, seed=seed)
        self.d_key = features.feature_dim(FEATURES[cfg.name], self.d_qk, m=m)
        if cfg.name == "favor":
            self.register_buffer("favor_seed", torch.tensor(seed, dtype=torch.long))
            self.register_load_state_dict_post_hook(lambda module, keys: module.sync_favor_seed())

    def sync_favor_seed(self) -> None:
        """Redraw the FAVOR+ projections for the seed in `favor_seed` (after loading a checkpoint)."""
        seed = int(self.favor_seed)
        if self.phi.seed != seed:
            self.phi.seed = seed - 1
            self.phi.redraw()

    def redraw_features(self) -> None:
        """New FAVOR+ projections (the next seed)."""
        self.phi.redraw()
        self.favor_seed.fill_(self.phi.seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, C)
        if self.redraw_each_step and self.training:
            self.redraw_features()  # one forward pass in training mode is one step
        q, k, v = self.project_qkv(x)  # (B, H, T, D)
        if self.rotary is not None:  # before the feature map: keeps phi >= 0 and one denominator
            q, k = self.rotary(q), self.rotary(k)
        q, k = self.hook_q_raw(q * self.input_scale), self.hook_k_raw(k * self.input_scale)
        q = self.hook_q(self.phi(q, is_query=True))  # (B, H, T, m)
        k = self.hook_k(self.phi(k, is_query=False))
        v = self.hook_v(v)
        o = ops.linear_attention(
            q, k, v, form=self.form, causal=True, normalize=True, eps=self.eps, chunk_size=self.chunk_size
        )  # (B, H, T, D)
        o = self.hook_out(o)
        return self.out_proj(merge_heads(o))

    def effective_weights(self, q, k, log_decay=None) -> torch.Tensor:
        return ops.linear_weights(q, k, causal=True, normalize=True, eps=self.eps)  # (B, H, T, T)
