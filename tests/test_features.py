"""Feature maps: identities they must satisfy, FAVOR+ unbiasedness and variance, seeding."""

import math

import pytest
import torch

from harness import features, ops

F64 = torch.float64


def test_identity_and_elu1():
    x = torch.tensor([-2.0, -0.5, 0.0, 1.5], dtype=F64)
    assert torch.equal(features.identity(x), x)
    torch.testing.assert_close(features.elu1(x), torch.tensor([math.exp(-2.0), math.exp(-0.5), 1.0, 2.5], dtype=F64))
    wide = torch.randn(1000, generator=torch.Generator().manual_seed(0), dtype=F64) * 10
    assert (features.elu1(wide) >= 0).all()  # exp(x) - 1 + 1 rounds to 0 far below zero
    assert (features.elu1(wide.clamp(min=-30)) > 0).all()


def test_taylor_reproduces_the_second_order_expansion():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(5, 7, generator=g, dtype=F64), torch.randn(5, 7, generator=g, dtype=F64)
    pq, pk = features.taylor2(q), features.taylor2(k)
    assert pq.shape == (5, 1 + 7 + 49) == (5, features.feature_dim("taylor", 7))
    s = (q * k).sum(-1)
    torch.testing.assert_close((pq * pk).sum(-1), 1 + s + s**2 / 2, rtol=0, atol=1e-12)
    assert ((pq * pk).sum(-1) >= 0.5 - 1e-12).all()  # 1 + s + s^2/2 >= 1/2: a valid denominator


def test_favor_shapes_defaults_and_positivity():
    f = features.Favor(64)
    assert f.m == round(64 * math.log(64)) == 266 == features.feature_dim("favor", 64)
    assert f.weights.shape == (266, 64)
    x = torch.randn(2, 3, 10, 64, generator=torch.Generator().manual_seed(0)) * 0.3
    out = f(x)
    assert out.shape == (2, 3, 10, 266) and out.dtype == torch.float32 and (out > 0).all()
    assert features.Favor(8, 20).m == 20 and features.feature_dim("favor", 8, 20) == 20
    with pytest.raises(ValueError):
        f(torch.zeros(3, 63))


def test_favor_is_seeded_and_redraws_from_the_next_seed():
    a, b = features.Favor(16, 40, seed=3), features.Favor(16, 40, seed=3)
    assert torch.equal(a.weights, b.weights)
    old = a.weights.clone()
    a.redraw()
    assert a.seed == 4 and not torch.equal(a.weights, old)
    assert torch.equal(a.weights, features.Favor(16, 40, seed=4).weights)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    assert torch.equal(a(x), features.Favor(16, 40, seed=4)(x))  # the cast cache follows the redraw


def test_favor_both_signs_counts_two_features_per_projection():
    """Schlag et al.'s form: m / 2 projections, each giving exp(+w.x - |x|^2/2) and exp(-w.x - |x|^2/2)
    over sqrt(m); the features a state holds are m, the projections Schlag et al. count m / 2."""
    f = features.Favor(8, 16, seed=2, signs="both")
    assert f.m == 16 and f.projections == 8 and f.weights.shape == (8, 8)
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(0), dtype=F64)
    out = f(x)
    w, half = f.weights, 0.5 * x.pow(2).sum(-1, keepdim=True)
    expected = torch.cat([torch.exp(x @ w.T - half), torch.exp(-x @ w.T - half)], -1) / math.sqrt(16)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=0)
    assert torch.equal(f.weights, features.Favor(8, 8, seed=2).weights), "the same projections as 8 positive ones"
    assert features.Favor(8, signs="both").m % 2 == 0
    with pytest.raises(ValueError, match="m must be even"):
        features.Favor(8, 15, signs="both")
    with pytest.raises(ValueError, match="signs must be one of positive, both"):
        features.Favor(8, 16, signs="minus")


def test_favor_both_signs_is_unbiased_for_exp_qk():
    g = torch.Generator().manual_seed(5)
    d, draws = 8, 3000
    q, k = (torch.randn(d, generator=g, dtype=F64) * 0.35 for _ in range(2))
    w = features.draw_favor_weights(d, d, torch.Generator().manual_seed(1), draws=draws)  # (draws, m, d)
    est = (features.favor_features(q, w, signs="both") * features.favor_features(k, w, signs="both")).sum(-1)
    stderr = float(est.std()) / math.sqrt(draws)
    assert abs(float(est.mean()) - math.exp(float(q @ k))) < 4 * stderr  # the tolerance of the positive form's test


def test_orthogonal_blocks_with_chi_norms():
    d, blocks = 16, 400
    w = features.Favor(d, d * blocks, seed=1).weights
    for i in range(3):
        blk = w[i * d:(i + 1) * d]
        unit = blk / blk.norm(dim=1, keepdim=True)
        torch.testing.assert_close(unit @ unit.T, torch.eye(d, dtype=F64), rtol=0, atol=1e-10)
    sq = w.pow(2).sum(dim=1)  # chi^2(d): mean d, variance 2d
    n = sq.numel()
    assert abs(float(sq.mean()) - d) < 5 * math.sqrt(2 * d / n)
    assert abs(float(sq.var()) - 2 * d) < 0.25 * 2 * d


def kernel_draws(q, k, *, orthogonal, draws, m, seed=0):
    """phi(q).phi(k) for `draws` independent FAVOR+ draws (no stabiliser: offset 0)."""
    gen = torch.Generator().manual_seed(seed)
    w = features.draw_favor_weights(q.shape[-1], m, gen, orthogonal=orthogonal, draws=draws)  # (draws, m, d)
    return (features.favor_features(q, w) * features.favor_features(k, w)).sum(-1)


def test_batched_draws_apply_each_draw_on_its_own():
    w = features.draw_favor_weights(6, 10, torch.Generator().manual_seed(4), draws=3)
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(1), dtype=F64)
    batched = features.favor_features(x, w)
    assert batched.shape == (3, 5, 10)
    for i in range(3):
        torch.testing.assert_close(batched[i], features.favor_features(x, w[i]), rtol=1e-12, atol=0)
    f = features.Favor(6, 10, seed=4)
    torch.testing.assert_close(f(x), features.favor_features(x, f.weights), rtol=0, atol=0)


@pytest.mark.parametrize("orthogonal", (True, False))
def test_favor_is_unbiased_for_exp_qk(orthogonal):
    g = torch.Generator().manual_seed(5)
    d, draws = 8, 3000
    q, k = (torch.randn(d, generator=g, dtype=F64) * 0.35 for _ in range(2))
    est = kernel_draws(q, k, orthogonal=orthogonal, draws=draws, m=d, seed=1)
    target = math.exp(float(q @ k))
    stderr = float(est.std()) / math.sqrt(draws)
    # Stated tolerance: within 4 standard errors of the mean (and the error itself is small).
    assert abs(float(est.mean()) - target) < 4 * stderr
    assert stderr < 0.02 * target


def test_orthogonal_draws_have_lower_variance_than_iid():
    # One block of m = d rows. For these norms the orthogonal variance is about 0.8x the iid
    # one (0.73-0.87 over 20 other seeds at this number of draws, so 0.95 leaves > 3 sd);
    # heavier-tailed settings (larger |q + k|) make sample variances too noisy to compare.
    g = torch.Generator().manual_seed(6)
    d, draws = 16, 10_000
    q, k = (torch.randn(d, generator=g, dtype=F64) * 0.15 for _ in range(2))
    var_orth = float(kernel_draws(q, k, orthogonal=True, draws=draws, m=d, seed=2).var())
    var_iid = float(kernel_draws(q, k, orthogonal=False, draws=draws, m=d, seed=3).var())
    assert var_orth < 0.95 * var_iid


def test_favor_stabilisers_cancel_in_normalised_attention():
    g = torch.Generator().manual_seed(7)
    q, k = (torch.randn(1, 2, 30, 8, generator=g, dtype=F64) * 0.5 for _ in range(2))
    v = torch.randn(1, 2, 30, 3, generator=g, dtype=F64)
    plain = features.Favor(8, 24, seed=2)
    bounded = features.Favor(8, 24, seed=2, offset="bound")
    ref = ops.linear_attention(plain(q), plain(k), v, eps=1e-300)
    for phi in (plain, bounded):
        o = ops.linear_attention(phi(q, is_query=True), phi(k), v, eps=1e-300)
        torch.testing.assert_close(o, ref, rtol=1e-10, atol=1e-12)
    # With c = max_r |w_r|^2 / 2 no key feature exceeds exp(0) / sqrt(m), however large the key.
    big = torch.randn(1000, 8, generator=g, dtype=F64) * 5
    assert (bounded(big) <= 1 / math.sqrt(24) + 1e-15).all()
    assert bounded.offset == pytest.approx(float(bounded.weights.pow(2).sum(1).max()) / 2)
    # A query's largest feature is exactly 1/sqrt(m) after its own maximum is taken out.
    torch.testing.assert_close(plain(q, is_query=True).amax(-1), torch.full((1, 2, 30), 24 ** -0.5, dtype=F64))


def test_feature_map_registry():
    assert features.feature_map("identity", 4) is features.identity
    assert features.feature_map("elu1", 4) is features.elu1
    assert features.feature_map("taylor", 4) is features.taylor2
    f = features.feature_map("favor", 4, m=9, seed=3)
    assert isinstance(f, features.Favor) and f.m == 9 and f.seed == 3
    assert features.feature_dim("identity", 4) == features.feature_dim("elu1", 4) == 4
    assert features.feature_map("dpfp", 4, nu=2)(torch.ones(4)).shape == (16,)
    for bad in (lambda: features.feature_map("relu", 4), lambda: features.feature_dim("relu", 4)):
        with pytest.raises(ValueError, match="unknown feature map"):
            bad()
    with pytest.raises(ValueError, match="offset"):
        features.Favor(4, offset="max")


def naive_dpfp(x: torch.Tensor, nu: int) -> torch.Tensor:
    """Schlag, Irie & Schmidhuber (2021), entry by entry: r = [relu(x), relu(-x)], and for shift
    j = 1 .. nu and position i of 2d the product r_i r_{(i - j) mod 2d}, blocks in order of j."""
    rows = []
    for vec in x.reshape(-1, x.shape[-1]).tolist():
        r = [max(c, 0.0) for c in vec] + [max(-c, 0.0) for c in vec]
        rows.append([r[i] * r[(i - j) % len(r)] for j in range(1, nu + 1) for i in range(len(r))])
    return torch.tensor(rows, dtype=x.dtype).reshape(*x.shape[:-1], -1)


@pytest.mark.parametrize("nu", [1, 2, 3])
def test_dpfp_matches_the_paper_entry_by_entry(nu):
    g = torch.Generator().manual_seed(nu)
    x, y = torch.randn(3, 4, 7, generator=g, dtype=F64), torch.randn(3, 4, 7, generator=g, dtype=F64)
    phi = features.feature_map("dpfp", 7, nu=nu)
    assert phi(x).shape == (3, 4, 2 * 7 * nu) and features.feature_dim("dpfp", 7, nu=nu) == 2 * 7 * nu
    torch.testing.assert_close(phi(x), naive_dpfp(x, nu), rtol=0, atol=0)
    assert torch.equal(phi(x, is_query=True), phi(x))  # queries and keys share the map
    assert (phi(x) >= 0).all()
    # the paper's own indexing, r_i r_{i+j}, orders each block differently but gives the same kernel
    rx, ry = (torch.cat([t.clamp(min=0), (-t).clamp(min=0)], -1) for t in (x, y))
    paper = sum((rx * rx.roll(-j, -1) * ry * ry.roll(-j, -1)).sum(-1) for j in range(1, nu + 1))
    torch.testing.assert_close((phi(x) * phi(y)).sum(-1), paper, rtol=0, atol=1e-12)
    # a feature is non-zero only where both of its inputs have the matching signs
    r = torch.cat([x.clamp(min=0), (-x).clamp(min=0)], -1)
    assert torch.equal(phi(x)[..., : 14] > 0, (r > 0) & (r.roll(1, -1) > 0))


def naive_dpfp_kernel_dim(d: int, nu: int) -> float:
    """E|phi(k)|^4 / E (phi(k).phi(k'))^2 for N(0, 1) coordinates, over every pair of features:
    each expectation the product over coordinates of E prod relu(+-x_c)^power (the half moments
    of |x|: E relu(x)^p = E|x|^p / 2), no symmetry used."""
    half = {1: 1 / math.sqrt(2 * math.pi), 2: 0.5, 3: math.sqrt(2 / math.pi), 4: 1.5}
    inputs = [(i % d, 1 if i < d else -1) for i in range(2 * d)]  # (coordinate, sign) of r_i
    feats = [(inputs[i], inputs[(i - j) % (2 * d)]) for j in range(1, nu + 1) for i in range(2 * d)]

    def moment(factors, power):
        total = 1.0
        for c in range(d):
            signs = [s for (cc, s) in factors if cc == c]
            if len(set(signs)) > 1:
                return 0.0  # relu(x) relu(-x) = 0
            if signs:
                total *= half[power * len(signs)]
        return total

    m4 = sum(moment(f + g, 2) for f in feats for g in feats)
    m2 = sum(moment(f + g, 1) ** 2 for f in feats for g in feats)
    return m4 / m2


def test_dpfp_kernel_dimension():
    """theory.dpfp_effective_dim against the pair-by-pair expectation and against sampled keys."""
    from harness.measure import theory

    for d, nu in [(2, 1), (5, 2), (6, 3)]:
        assert theory.kernel_effective_dim(f"dpfp{nu}", d) == pytest.approx(naive_dpfp_kernel_dim(d, nu), rel=1e-12)
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(100_000, 6, generator=g, dtype=F64) for _ in range(2))
    px, py = features.dpfp(x, 2), features.dpfp(y, 2)
    sampled = float(((px * px).sum(-1) ** 2).mean() / ((px * py).sum(-1) ** 2).mean())
    assert theory.dpfp_effective_dim(6, 2) == pytest.approx(sampled, rel=0.06)  # heavy tails: 100k draws
    # sparse but positive: far above elu+1's ~2, and saturating with d (the features' shared mean)
    assert theory.dpfp_effective_dim(512, 1) < (2 * math.pi) ** 4 / 16 < theory.dpfp_effective_dim(512, 1) * 1.1
    assert theory.dpfp_effective_dim(64, 1) < theory.dpfp_effective_dim(64, 2) < theory.dpfp_effective_dim(64, 3)
    with pytest.raises(ValueError, match="1 <= nu < d"):
        theory.dpfp_effective_dim(4, 4)


DRAW_DIGEST = """
import hashlib, torch
from harness import features
# the sizes the capacity sweeps draw: d_key 8 with 8-64 features (quick), 4-16 with their projections (findings)
sizes = [(4, 4), (4, 8), (8, 8), (8, 16), (8, 64), (16, 16), (16, 32)]
blob = b"".join(features.Favor(d, m, seed=s).weights.float().numpy().tobytes() for d, m in sizes for s in range(40))
print(hashlib.sha1(blob).hexdigest())
"""


def test_the_draw_a_model_uses_is_the_same_whatever_the_threads_and_kernels():
    """FAVOR+'s projections, as the model casts them to float32, bit for bit under one or two threads,
    torch's default kernels instead of AVX2, and MKL's compatible code path (which stands in for
    another CPU's): the draw is not what moved FAVOR+ between machines. (The float64 draw itself
    differs at 1e-16 with MKL's threads at d = 64 and with its code path; the cast removes that at
    these sizes.)"""
    import os
    import subprocess
    import sys

    settings = [{"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}, {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"},
                {"ATEN_CPU_CAPABILITY": "default"}, {"MKL_CBWR": "COMPATIBLE"}]
    digests = {subprocess.run([sys.executable, "-c", DRAW_DIGEST], env={**os.environ, **env}, capture_output=True,
                              text=True, check=True).stdout.strip() for env in settings}
    assert len(digests) == 1, digests


def test_a_new_feature_map_and_its_kernel_register_without_editing_the_harness():
    """One register call beside the map's function (harness.features) and one kernel_dim beside
    its theory (harness.measure.theory): feature_map, feature_dim, draw_bytes and
    kernel_effective_dim know it, and nothing else changes."""
    import torch

    from harness import features
    from harness.measure import theory

    before = dict(features.MAPS)
    try:
        features.register("square", lambda d, **_: (lambda x, *, is_query=False: x * x), lambda d, **_: d)
        theory.kernel_dim("square")(lambda d: float(d) / 3)
        phi = features.feature_map("square", 4)
        assert torch.equal(phi(torch.tensor([1.0, -2.0, 3.0, 0.5])), torch.tensor([1.0, 4.0, 9.0, 0.25]))
        assert features.feature_dim("square", 4) == 4 and features.draw_bytes("square", 4) == 0
        assert theory.kernel_effective_dim("square", 12) == 4.0
        with pytest.raises(ValueError, match="registered already"):
            features.register("square", lambda d, **_: None, lambda d, **_: d)
    finally:
        features.MAPS.clear()
        features.MAPS.update(before)
        theory.KERNEL_DIMS.pop("square", None)
        theory.kernel_effective_dim.cache_clear()
    with pytest.raises(ValueError, match="unknown feature map 'square'"):
        features.feature_map("square", 4)
