"""Feature maps phi: (..., d) -> (..., m) for kernel (linear) attention.

Every map acts on each position on its own (nothing is computed across positions, so a
causal mixer stays causal), and every map takes ``is_query`` so that callers can treat
them alike; only FAVOR+ uses it.

- ``identity``: phi(x) = x (exact, hand-checkable; not non-negative).
- ``elu1``: phi(x) = elu(x) + 1 > 0 (Katharopoulos et al. 2020; rounds to 0 for x below
  about -37 in float64, -17 in float32), m = d.
- ``taylor2``: [1, x, vec(x x^T)/sqrt(2)], so phi(q).phi(k) = 1 + q.k + (q.k)^2/2, the
  second-order Taylor expansion of exp(q.k) (Based); always > 0, m = 1 + d + d^2.
- ``dpfp``: the deterministic parameter-free projection of Schlag, Irie & Schmidhuber (2021):
  r = [relu(x), relu(-x)] (2d), then products of r with itself rolled by 1 .. nu positions,
  m = 2 d nu, every entry >= 0.
- :class:`Favor`: FAVOR+ positive orthogonal random features (Performer), unbiased for
  exp(q.k); ``signs="both"`` is the form Schlag, Irie & Schmidhuber (2021) ran (their
  ``prime``), each random projection w giving two features, exp(+w.x - |x|^2/2) and
  exp(-w.x - |x|^2/2): their "m = 64" is 64 projections and 128 features.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

FAVOR_SIGNS = ("positive", "both")  # features per projection: exp(+w.x - ...) alone, or with exp(-w.x - ...)


def identity(x: torch.Tensor, *, is_query: bool = False) -> torch.Tensor:
    return x


def elu1(x: torch.Tensor, *, is_query: bool = False) -> torch.Tensor:
    return F.elu(x) + 1.0


def taylor2(x: torch.Tensor, *, is_query: bool = False) -> torch.Tensor:
    """(..., d) -> (..., 1 + d + d^2): [1, x, vec(x x^T)/sqrt(2)]."""
    outer = (x.unsqueeze(-1) * x.unsqueeze(-2)).flatten(-2) / math.sqrt(2.0)  # (..., d^2)
    return torch.cat([torch.ones_like(x[..., :1]), x, outer], dim=-1)


def dpfp(x: torch.Tensor, nu: int = 1, *, is_query: bool = False) -> torch.Tensor:
    """(..., d) -> (..., 2 d nu): DPFP (Schlag, Irie & Schmidhuber 2021, their Eq. for phi_nu).

    r = [relu(x), relu(-x)] in R^2d; the block for shift j = 1 .. nu is r_i r_{i-j} over the 2d
    positions i (indices mod 2d; torch.roll's direction, as their code; the paper writes
    r_i r_{i+j}, the same products in another order, so phi(q).phi(k) is the same). A feature is
    non-zero only where both of its inputs have the matching signs, so the map is sparse and
    non-negative, and its width 2 d nu is set by nu, not by the model. Shifts beyond d repeat
    products (shift 2d - j holds those of shift j; shift d pairs relu(x_c) with relu(-x_c),
    always 0), so nu <= d - 1 gives distinct features.
    """
    r = torch.cat([F.relu(x), F.relu(-x)], dim=-1)  # (..., 2d)
    return torch.cat([r * r.roll(j, dims=-1) for j in range(1, nu + 1)], dim=-1)  # (..., 2 d nu)


def default_favor_features(d: int, signs: str = "positive") -> int:
    """m about d ln d (Performer's recommendation), and at least d; even for signs="both"."""
    m = max(d, round(d * math.log(d))) if d > 1 else 1
    return m + m % 2 if signs == "both" else m


def draw_favor_weights(d: int, m: int, generator: torch.Generator, *, orthogonal: bool = True,
                       draws: int | None = None) -> torch.Tensor:
    """Random projections w_1..w_m (m, d), float64, each marginally N(0, I_d); (draws, m, d) for many.

    orthogonal=True: rows in blocks of d that are exactly orthogonal (Haar-random rotations
    from QR with the sign fix), each row rescaled by an independent chi(d) norm (the norm
    of a Gaussian d-vector), so that every row is still marginally Gaussian and the
    estimator stays unbiased, with lower variance than iid rows.
    """
    n = 1 if draws is None else draws
    if orthogonal:
        blocks = -(-m // d)
        g = torch.randn(n * blocks, d, d, generator=generator, dtype=torch.float64)
        qmat, r = torch.linalg.qr(g)  # one batched factorisation for every block of every draw
        qmat = qmat * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)  # Haar measure
        rows = qmat.transpose(-1, -2).reshape(n, blocks * d, d)[:, :m]  # orthonormal rows per block
        norms = torch.randn(n, m, d, generator=generator, dtype=torch.float64).norm(dim=-1)  # chi(d)
        w = rows * norms.unsqueeze(-1)
    else:
        w = torch.randn(n, m, d, generator=generator, dtype=torch.float64)
    return w[0] if draws is None else w


def favor_features(x: torch.Tensor, weights: torch.Tensor, *, offset: float = 0.0, is_query: bool = False,
                   signs: str = "positive") -> torch.Tensor:
    """phi(x) = exp(w.x - |x|^2/2 - offset) / sqrt(m): x (..., d) -> (..., m), m the rows of weights;
    signs="both": [exp(+w.x - ...), exp(-w.x - ...)] / sqrt(2m), x (..., d) -> (..., 2m).

    weights: (m, d), or (draws, m, d) for many independent draws at once (the result then
    leads with the draws, as matmul broadcasts). is_query subtracts each position's own
    maximum over its features (see :class:`Favor`).
    """
    proj = torch.matmul(x, weights.transpose(-1, -2))  # (..., m)
    if signs == "both":
        proj = torch.cat([proj, -proj], dim=-1)  # (..., 2m): the + half, then the - half
    expo = proj - 0.5 * x.pow(2).sum(dim=-1, keepdim=True) - offset
    if is_query:
        expo = expo - expo.amax(dim=-1, keepdim=True).detach()  # this position only
    return torch.exp(expo) / math.sqrt(proj.shape[-1])


class Favor:
    """FAVOR+ positive random features: phi(x) = exp(w.x - |x|^2/2 - c) / sqrt(m).

    For w ~ N(0, I): E[exp(w.q - |q|^2/2) exp(w.k - |k|^2/2)] = exp(q.k), so
    E[phi(q).phi(k)] = exp(q.k - 2c). The stabiliser c is a data-independent constant:
    ``offset=0.0`` (default) keeps phi unbiased as it stands; ``offset="bound"`` uses
    c = max_r |w_r|^2/2, the largest value w_r.x - |x|^2/2 can take, so that phi(k) <= 1
    for every key. c cancels in normalised attention, but it shrinks the denominator by
    exp(-2c) against the floor eps, so prefer 0 unless overflow is a concern (without c,
    phi <= exp(max_r |w_r|^2/2)/sqrt(m), finite in float32 while that exponent is < 88).

    ``is_query=True`` also subtracts each query position's own maximum over the m features
    (it cancels within that query's row of normalised attention); nothing is ever computed
    across positions, so causality is preserved. Draws are seeded; ``redraw()`` draws new
    projections from the next seed.

    m counts features, the state's key side. ``signs="both"`` draws m / 2 projections and gives
    each two features, exp(+w.x - |x|^2/2 - c) and exp(-w.x - |x|^2/2 - c), over sqrt(m): the
    antithetic form, still unbiased for exp(q.k), and the one Schlag et al. (2021) count by its
    projections (m must be even).
    """

    def __init__(self, d: int, m: int | None = None, *, seed: int = 0, orthogonal: bool = True,
                 offset: float | str = 0.0, signs: str = "positive"):
        if d < 1:
            raise ValueError(f"d must be >= 1, got {d}")
        if signs not in FAVOR_SIGNS:
            raise ValueError(f"signs must be one of {', '.join(FAVOR_SIGNS)}, got {signs!r}")
        self.d, self.signs = d, signs
        self.m = default_favor_features(d, signs) if m is None else int(m)
        if self.m < 1:
            raise ValueError(f"m must be >= 1, got {m}")
        if signs == "both" and self.m % 2:
            raise ValueError(f"signs='both' gives two features per projection: m must be even, got {self.m}")
        self.projections = self.m // 2 if signs == "both" else self.m
        if not (offset == "bound" or isinstance(offset, (int, float))):
            raise ValueError(f"offset must be a number or 'bound', got {offset!r}")
        self.orthogonal = orthogonal
        self.offset_rule = offset
        self.seed = seed
        self._draw()

    def _draw(self) -> None:
        gen = torch.Generator().manual_seed(self.seed)
        self.weights = draw_favor_weights(self.d, self.projections, gen, orthogonal=self.orthogonal)  # (p, d) float64
        self.bound = float(self.weights.pow(2).sum(dim=1).max()) / 2.0
        self.offset = self.bound if self.offset_rule == "bound" else float(self.offset_rule)
        self._cast: dict[tuple, torch.Tensor] = {}

    def redraw(self) -> None:
        """New random projections from the next seed (seed + 1)."""
        self.seed += 1
        self._draw()

    def _weights_like(self, x: torch.Tensor) -> torch.Tensor:
        key = (x.device, x.dtype)
        if key not in self._cast:
            self._cast[key] = self.weights.to(device=x.device, dtype=x.dtype)
        return self._cast[key]

    def __call__(self, x: torch.Tensor, *, is_query: bool = False) -> torch.Tensor:
        """(..., d) -> (..., m), all entries > 0 (up to underflow)."""
        if x.shape[-1] != self.d:
            raise ValueError(f"Favor expects last dim {self.d}, got {tuple(x.shape)}")
        return favor_features(x, self._weights_like(x), offset=self.offset, is_query=is_query, signs=self.signs)

    def __repr__(self) -> str:
        return (f"Favor(d={self.d}, m={self.m}, seed={self.seed}, orthogonal={self.orthogonal}, "
                f"offset={self.offset_rule!r}, signs={self.signs!r})")


@dataclass(frozen=True)
class FeatureMap:
    """A registered feature map: how it is built for inputs of dimension d (``build(d, m=, seed=,
    nu=, signs=)`` -> phi, each map reading the options it has), its output width (``dim(d, m=,
    nu=)``), and the peak bytes of building it (``draw_bytes(d, m)``: FAVOR+'s draw, 0 for the
    fixed maps). A new map is one ``register`` call beside its function; its kernel's d_kernel,
    where one is known, registers in harness.measure.theory (kernel_dim)."""
    name: str
    build: Callable[..., Callable]
    dim: Callable[..., int]
    draw_bytes: Callable[[int, Optional[int]], int] = lambda d, m: 0


MAPS: dict[str, FeatureMap] = {}


def register(name: str, build: Callable[..., Callable], dim: Callable[..., int],
             draw_bytes: Callable[[int, Optional[int]], int] | None = None) -> FeatureMap:
    """Make the map ``name`` known to feature_map, feature_dim and draw_bytes."""
    if name in MAPS:
        raise ValueError(f"feature map {name!r} is registered already")
    MAPS[name] = FeatureMap(name, build, dim, draw_bytes or (lambda d, m: 0))
    return MAPS[name]


def _map(name: str) -> FeatureMap:
    if name not in MAPS:
        raise ValueError(f"unknown feature map {name!r}; expected one of {tuple(MAPS)}")
    return MAPS[name]


def feature_map(name: str, d: int, *, m: int | None = None, seed: int = 0, nu: int = 1, signs: str = "positive"):
    """The feature map called ``name`` for inputs of dimension d (a callable, phi(x, is_query=...));
    m: FAVOR+'s feature count and signs its features per projection, nu: DPFP's number of shifts."""
    return _map(name).build(d, m=m, seed=seed, nu=nu, signs=signs)


def draw_bytes(name: str, d: int, m: int | None = None) -> int:
    """Peak bytes of building the map ``name`` for inputs of dimension d (FeatureMap.draw_bytes)."""
    return _map(name).draw_bytes(d, m)


def feature_dim(name: str, d: int, m: int | None = None, nu: int = 1) -> int:
    """Output dimension of the feature map ``name`` on inputs of dimension d."""
    return _map(name).dim(d, m=m, nu=nu)


def _favor_draw_bytes(d: int, m: int | None) -> int:
    """FAVOR+'s float64 draw: the Gaussian blocks, their QR factors, the rows and their norms."""
    m = feature_dim("favor", d, m)  # projections <= features: the positive form's draw bounds the other's
    blocks = -(-m // d)
    return 8 * (3 * blocks * d * d + 3 * m * d)


register("identity", lambda d, **_: identity, lambda d, **_: d)
register("elu1", lambda d, **_: elu1, lambda d, **_: d)
register("favor", lambda d, m=None, seed=0, signs="positive", **_: Favor(d, m, seed=seed, signs=signs),
         lambda d, m=None, **_: default_favor_features(d) if m is None else int(m), _favor_draw_bytes)
register("taylor", lambda d, **_: taylor2, lambda d, **_: 1 + d + d * d)
register("dpfp", lambda d, nu=1, **_: functools.partial(dpfp, nu=nu), lambda d, nu=1, **_: 2 * d * nu)
NAMES = tuple(MAPS)  # the built-in maps, in registration order
