"""Normalised kernel (linear) attention: linear, elu, favor, taylor and dpfp.

o_i = phi(q_i)^T S_i / phi(q_i)^T z_i with S_i = sum_{j<=i} phi(k_j) v_j^T, z_i = sum_{j<=i} phi(k_j),
computed by ops.linear_attention in the configured form (chunk for training; parallel and
recurrent give the same numbers). One class per feature map (harness.features):

  linear  identity          m = d      (exact, hand-checkable; unnormalised by default, below)
  elu     elu(x) + 1        m = d      (Katharopoulos et al. 2020)
  favor   FAVOR+            m features (Performer); phi(q).phi(k) estimates exp(q.k / sqrt(d));
                            model.options.favor_signs=both: m / 2 projections, a + and a - feature each (Schlag et al.)
  taylor  [1, x, x(x)x/sqrt2]  m = 1 + d + d^2; phi(q).phi(k) = 1 + s + s^2/2, s = q.k / sqrt(d)
  dpfp    rolled relu(+-x) products   m = 2 d nu (Schlag, Irie & Schmidhuber 2021), nu = model.options.dpfp_nu

favor and taylor approximate exp, so q and k are scaled by d^-1/4 *before* the feature map:
their product then carries softmax's 1/sqrt(d) temperature.

The denominator (`model.options.normalize`; None: the mixer's own default). The positive maps divide
by phi(q).z (z > 0, so the read-out is a weighted mean of values), as Katharopoulos et al.,
the Performer and Based (Zoology divides with eps = 1e-12) do. The identity map does not by
default: q.z has no sign for unconstrained q and k, so a denominator can sit at or near
zero, amplify the read-out by orders of magnitude and let those reads dominate the clipped
gradients (a model trained so can stay at chance). `linear` is therefore fla's LinearAttention default: o = phi(q)^T S with no division,
and a per-head RMSNorm on the read-out (fla's output_norm) to hold its scale, the plain
linear memory that the crosstalk law sqrt(d/N) and the untrained probe describe. With
`model.options.normalize=true` it is Zoology's and Based's divided form (eps = model.options.eps); with
`model.options.normalize=false` the positive maps read unnormalised with the same output norm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from harness import checks, features, ops
from harness.layers.options import KernelOptions
from harness.layers.parts import HeadNorm, merge_heads, qk_width
from harness.layers.protocol import Mixer, ProbeMemory
from harness.layers.registry import register

FAVOR_SEED_STRIDE = 1_000_000  # layer l draws seeds l * stride, l * stride + 1, ... (one per redraw)


class KernelAttention(Mixer):
    """The shared layer; subclasses name the feature map."""

    family = "linear"
    core = "linear"
    feature = kernel = "identity"  # harness.features name; also the kernel theory.kernel_effective_dim knows
    exp_kernel = False       # the map estimates exp(q.k): inputs scaled by d^-1/4
    feature_is_positive = False  # phi > 0: the denominator phi(q).z is positive
    normalize_by_default = False  # divide by phi(q).z unless model.options.normalize says otherwise
    score_map = False  # phi(q).phi(k) is an increasing function of q.k (the identity map)
    Options = KernelOptions

    def __init__(self, config, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        opts = self.options_of(config)
        self.form, self.chunk_size, self.eps = config.form, config.chunk_size, opts.eps
        self.normalize = self.normalize_by_default if opts.normalize is None else bool(opts.normalize)
        # The fault check holds phi(q).z > 0 only where a denominator is taken and must be positive.
        self.positive_denominator = self.normalize and self.feature_is_positive
        # Undivided, the identity map's a_ij is q.k itself; phi(q).z may be negative, which
        # reverses a row's order, so a divided one is monotone by no construction.
        self.monotone_in_score = self.score_map and not self.normalize
        # Without the division nothing bounds the read-out: a per-head RMSNorm holds it (fla).
        self.norm = None if self.normalize else HeadNorm(self.n_heads, self.d_head, "rmsnorm")
        self.out_proj = nn.Linear(config.d_model, config.d_model, bias=False)
        self.input_scale = self.d_qk**-0.25 if self.exp_kernel else 1.0
        self.phi = self.make_feature_map(config, layer_idx)
        self.d_key = self.key_width(self.d_qk, config)

    def make_feature_map(self, config, layer_idx: int):
        return features.feature_map(self.feature, self.d_qk)

    @classmethod
    def key_width(cls, d_qk: int, config=None) -> int:
        """m, the feature map's output width (at its default count: FAVOR+ and DPFP say otherwise)."""
        return features.feature_dim(cls.feature, d_qk)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, C)
        q, k, v = self.project_qkv(x)  # (B, H, T, D)
        if self.rotary is not None:  # before the feature map: keeps phi >= 0 and one denominator
            q, k = self.rotary(q), self.rotary(k)
        q, k = self.hook_q_raw(q * self.input_scale), self.hook_k_raw(k * self.input_scale)
        q = self.hook_q(self.phi(q, is_query=True))  # (B, H, T, m)
        k = self.hook_k(self.phi(k, is_query=False))
        v = self.hook_v(v)
        o = ops.linear_attention(
            q, k, v, form=self.form, causal=True, normalize=self.normalize, eps=self.eps, chunk_size=self.chunk_size
        )  # (B, H, T, D)
        o = self.hook_out(o)
        if self.norm is not None:
            o = self.norm(o)
        return self.out_proj(merge_heads(o))

    def state_size(self, sequence_length: int = 2048) -> int:
        """S (m x d_head), and the normaliser z (m) when it divides, per head, whatever the length."""
        return self.n_heads * ops.state_elements(self.d_key, self.d_head, normalize=self.normalize)

    def effective_weights(self, hooks, rows=None) -> torch.Tensor:
        return ops.linear_weights(hooks["q"], hooks["k"], causal=True, normalize=self.normalize,
                                  eps=self.eps, rows=rows)  # (B, H, R, T)

    @classmethod
    def probe_memory(cls, d: int, seed: int) -> ProbeMemory:
        """Random keys through this feature map, read as the mixer reads by default: divided by
        phi(q).z for the positive maps, the plain linear memory S^T q (that sqrt(d/N)
        describes) for the identity map."""
        phi = features.feature_map(cls.feature, d, seed=seed)
        scale = d**-0.25 if cls.exp_kernel else 1.0
        return ProbeMemory(read="state", phi_k=lambda x: phi(x * scale, is_query=False),
                           phi_q=lambda x: phi(x * scale, is_query=True),
                           d_key=features.feature_dim(cls.feature, d), normalize=cls.normalize_by_default)


@register("linear")
class LinearAttention(KernelAttention):
    feature = kernel = "identity"
    score_map = True


@register("elu")
class EluAttention(KernelAttention):
    feature = kernel = "elu1"
    feature_is_positive = normalize_by_default = True


@register("taylor")
class TaylorAttention(KernelAttention):
    feature = kernel = "taylor"
    feature_is_positive = normalize_by_default = True
    exp_kernel = True
    probe_on_request = True  # m = 1 + d + d^2 features: the probe's default grid would take hours


FAVOR_REDRAW = ("never", "step")


@dataclass(frozen=True)
class FavorOptions(KernelOptions):
    favor_features: Optional[int] = None  # m; None: about d ln d (or favor_per_dim's count)
    favor_redraw: str = "never"  # never | step (redraw the random features every training step)
    favor_signs: str = "positive"  # positive | both (two features per projection, exp(+-w.x - |x|^2/2))
    favor_per_dim: Optional[int] = None  # projections per q/k dimension (Schlag et al.'s m / d_key)

    def check(self) -> None:
        """The features are counted once (favor_features or favor_per_dim), and in pairs where
        each projection gives two."""
        super().check()
        checks.integer("model.options.favor_features", self.favor_features, nullable=True)
        checks.choice("model.options.favor_redraw", self.favor_redraw, FAVOR_REDRAW)
        checks.choice("model.options.favor_signs", self.favor_signs, features.FAVOR_SIGNS)
        checks.integer("model.options.favor_per_dim", self.favor_per_dim, nullable=True)
        checks.require(self.favor_features is None or self.favor_per_dim is None,
                       f"model.options.favor_features={self.favor_features} and model.options.favor_per_dim="
                       f"{self.favor_per_dim} both count FAVOR+'s features: set one")
        checks.require(self.favor_signs != "both" or self.favor_features is None or self.favor_features % 2 == 0,
                       f"model.options.favor_features={self.favor_features} must be even with "
                       f"model.options.favor_signs=both (two features per projection)")


@register("favor")
class FavorAttention(KernelAttention):
    """FAVOR+ features differ between layers and are shared by the heads of one layer, as in the
    Performer. They are a pure function of their seed, so the seed (which advances on every
    redraw) is what the state_dict keeps; `model.options.favor_redraw=step` redraws every step."""

    feature = kernel = "favor"
    feature_is_positive = normalize_by_default = True
    exp_kernel = True
    Options = FavorOptions

    @classmethod
    def key_width(cls, d_qk: int, config=None) -> int:
        """m, the features (the state's key side): favor_features; else favor_per_dim projections
        per q/k dimension (Schlag et al.'s m / d_key), two features each with favor_signs=both;
        else about d ln d."""
        opts = cls.options_of(config)
        if opts.favor_features is not None:
            return int(opts.favor_features)
        if opts.favor_per_dim is not None:
            return opts.favor_per_dim * d_qk * (2 if opts.favor_signs == "both" else 1)
        return features.default_favor_features(d_qk, opts.favor_signs)

    def make_feature_map(self, config, layer_idx: int):
        seed = FAVOR_SEED_STRIDE * layer_idx
        opts = self.options_of(config)
        self.redraw_each_step = opts.favor_redraw == "step"
        self.register_buffer("favor_seed", torch.tensor(seed, dtype=torch.long))
        self.register_load_state_dict_post_hook(lambda module, keys: module.sync_favor_seed())
        return features.feature_map("favor", self.d_qk, m=self.key_width(self.d_qk, config), seed=seed,
                                    signs=opts.favor_signs)

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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.redraw_each_step and self.training:
            self.redraw_features()  # one forward pass in training mode is one step
        return super().forward(x)


@dataclass(frozen=True)
class DPFPOptions(KernelOptions):
    dpfp_nu: int = 1  # shifts of the rolled products; 2 d nu features (Schlag et al. 2021 use 1, 2, 3)

    def check(self) -> None:
        super().check()
        checks.integer("model.options.dpfp_nu", self.dpfp_nu)


@register("dpfp")
class DPFPAttention(KernelAttention):
    """DPFP (Schlag, Irie & Schmidhuber 2021): the map of their capacity experiment, whose key side
    2 d nu grows with `model.options.dpfp_nu` at a fixed width. Normalised by phi(q).z, as their linear
    attention and elu+1 are (its features are >= 0 but a query's can all be 0, where the floor
    eps holds the denominator: no fault check demands it positive). The kernel theory knows it
    as "dpfp<nu>" (theory.dpfp_effective_dim)."""

    feature = "dpfp"
    kernel = "dpfp1"
    normalize_by_default = True
    Options = DPFPOptions

    @classmethod
    def check_config(cls, config) -> None:
        """1 <= dpfp_nu < the q/k width: shift d pairs relu(x) with relu(-x) (always 0) and
        larger shifts repeat the products of smaller ones."""
        d_qk, nu = qk_width(config), cls.options_of(config).dpfp_nu
        checks.require(nu < d_qk, f"model.options.dpfp_nu={nu} must be below the q/k width "
                                  f"{d_qk} (shift d pairs relu(x) with relu(-x), always 0)")

    def __init__(self, config, layer_idx: int) -> None:
        self.nu = self.options_of(config).dpfp_nu
        super().__init__(config, layer_idx)
        self.kernel = f"dpfp{self.nu}"

    def make_feature_map(self, config, layer_idx: int):
        return features.feature_map("dpfp", self.d_qk, nu=self.nu)

    @classmethod
    def key_width(cls, d_qk: int, config=None) -> int:
        return features.feature_dim("dpfp", d_qk, nu=cls.options_of(config).dpfp_nu)

    @classmethod
    def probe_memory(cls, d: int, seed: int, dpfp_nu: int = 1) -> ProbeMemory:
        """Random keys through the map with `dpfp_nu` shifts (model.options.dpfp_nu), read normalised."""
        phi = features.feature_map("dpfp", d, nu=dpfp_nu)
        return ProbeMemory(read="state", phi_k=phi, phi_q=phi, d_key=features.feature_dim("dpfp", d, nu=dpfp_nu),
                           normalize=True, kernel=f"dpfp{dpfp_nu}")
