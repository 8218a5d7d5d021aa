"""harness.measure.theory: the crosstalk law, decay-weighted pair counts, kernel dimensions and the
accuracy model, each against an independent computation (closed forms, scipy quadrature,
a plain recurrence, or a Monte Carlo of the stated noise model)."""

import math

import numpy as np
import pytest
import torch
from scipy import integrate, special

from harness.layers.retnet import retnet_log_gammas
from harness.measure import theory


# --------------------------------------------------------------------------------------------
# SNR law and pair counts.


def test_predicted_snr_is_the_law():
    assert theory.predicted_snr(128, 128) == pytest.approx(1.0)
    assert theory.predicted_snr(128, 4096) == pytest.approx(0.1768, abs=1e-4)  # 0.18 at N = 4096, d = 128
    np.testing.assert_allclose(theory.predicted_snr(64, np.array([16, 64, 256])), [2.0, 1.0, 0.5])
    assert math.isinf(theory.predicted_snr(64, 0))


def test_crosstalk_pairs_without_decay_is_n_minus_1():
    w = np.ones(10)
    assert theory.crosstalk_pairs(w, target=3) == pytest.approx(9.0)
    np.testing.assert_allclose(theory.crosstalk_pairs(w), np.full(10, 9.0))
    assert theory.aggregate_pairs(w) == pytest.approx(9.0)
    assert theory.state_pairs(w) == pytest.approx(10.0)
    np.testing.assert_allclose(theory.read_participation(w), np.full(10, 9.0))


def test_crosstalk_pairs_with_constant_decay():
    gamma, n = math.exp(float(retnet_log_gammas(1)[0])), 200
    assert gamma == 1 - 2**-5
    w = theory.decay_pair_weights(np.full(n, math.log(gamma)))
    # the newest write (distance 0) sees sum_{t=1}^{n-1} gamma^(2t) of crosstalk
    newest = sum(gamma ** (2 * t) for t in range(1, n))
    assert theory.crosstalk_pairs(w, target=n - 1) == pytest.approx(newest, rel=1e-12)
    # a write at distance t sees the same crosstalk scaled up by gamma^(-2t)
    assert theory.crosstalk_pairs(w, target=n - 11) == pytest.approx(
        (newest + 1 - gamma**20) / gamma**20, rel=1e-12)
    assert theory.state_pairs(w) == pytest.approx(theory.constant_decay_state_pairs(gamma, n), rel=1e-12)
    assert theory.constant_decay_state_pairs(gamma, 10**6) == pytest.approx(1 / (1 - gamma**2))


def test_aggregate_pairs_is_blind_to_decay():
    """Read from one state, the ratio-of-means count is N - 1 whatever the weights."""
    rng = np.random.default_rng(0)
    for w in (rng.uniform(0, 1, 50), np.exp(-rng.uniform(0, 5, 50).cumsum())):
        assert theory.aggregate_pairs(w) == pytest.approx(49.0)


def test_decay_pair_weights_match_the_recurrence():
    """Survival weights equal the coefficients a scalar recurrence leaves on each write."""
    rng = np.random.default_rng(1)
    n = 40
    log_a = -rng.uniform(0.0, 0.5, n)
    scale = rng.uniform(0.5, 2.0, n)
    coeff = np.zeros(n)  # S_t = a_t S_{t-1} + scale_t e_t, tracked per write
    for t in range(n):
        coeff *= math.exp(log_a[t])
        coeff[t] += scale[t]
    np.testing.assert_allclose(theory.decay_pair_weights(log_a, scale), coeff, rtol=1e-12)


def test_decay_pair_weights_underflow_to_zero_not_nan():
    w = theory.decay_pair_weights(np.full(100_000, -0.05))
    assert np.isfinite(w).all() and w[0] == 0.0 and w[-1] == 1.0
    pairs = theory.crosstalk_pairs(w)
    assert np.isinf(pairs[0]) and np.isfinite(pairs[-1])


# --------------------------------------------------------------------------------------------
# Kernel effective dimension.


@pytest.mark.parametrize("d", [16, 64])
def test_kernel_dims_against_quadrature(d):
    assert theory.kernel_effective_dim("identity", d) == d
    # softmax: the Bessel form against direct quadrature over the cosine density
    e2 = theory.sphere_expectation(lambda t: math.exp(2 * math.sqrt(d) * (t - 1)), d)
    assert theory.kernel_effective_dim("softmax", d) == pytest.approx(1 / e2, rel=1e-6)
    # taylor: kappa = 1 + s + s^2/2 with s = sqrt(d) t
    cross = theory.sphere_expectation(lambda t: (1 + math.sqrt(d) * t + d * t * t / 2) ** 2, d)
    assert theory.kernel_effective_dim("taylor", d) == pytest.approx((1 + math.sqrt(d) + d / 2) ** 2 / cross, rel=1e-6)
    assert math.isnan(theory.kernel_effective_dim("favor", d))


def test_elu_kernel_dim_is_small_and_flat_in_d():
    """Positive features: d_kernel ~ 2 for every d, and Monte Carlo of real keys agrees."""
    dims = [theory.kernel_effective_dim("elu1", d) for d in (16, 32, 64, 128, 256)]
    assert all(1.8 < x < 2.5 for x in dims) and max(dims) / min(dims) < 1.1
    rng = np.random.default_rng(2)
    d = 64
    k = rng.standard_normal((2000, d))
    k *= math.sqrt(d) / np.linalg.norm(k, axis=1, keepdims=True)
    phi = np.where(k > 0, k + 1, np.exp(k))
    self_sq = np.mean(np.sum(phi * phi, 1) ** 2)
    cross_sq = np.mean(np.sum(phi[:1000] * phi[1000:], 1) ** 2)
    assert theory.kernel_effective_dim("elu1", d) == pytest.approx(self_sq / cross_sq, rel=0.03)


# --------------------------------------------------------------------------------------------
# Accuracy model.


def test_accuracy_limits_and_monotone():
    C, dv = 1024, 64
    assert theory.predicted_accuracy(0.0, C, dv) == pytest.approx(1 / C)
    assert theory.predicted_accuracy(math.inf, C, dv) == 1.0
    assert theory.predicted_accuracy(1e-3, C, dv, 1000) == pytest.approx(1 / C, rel=0.05)
    assert theory.predicted_accuracy(20.0, C, dv, 1000) > 0.9999
    s = np.geomspace(1e-2, 1e1, 60)
    acc = theory.predicted_accuracy(s, C, dv, 1000)
    assert np.all(np.diff(acc) >= -1e-9)


def test_accuracy_table_matches_direct_integration():
    s = np.geomspace(0.02, 5.0, 200)
    table = theory.predicted_accuracy(s, 1024, 32, 500)
    direct = np.array([theory.predicted_accuracy(float(x), 1024, 32, 500) for x in s[::20]])
    np.testing.assert_allclose(table[::20], direct, atol=3e-3)


def _monte_carlo_of_model(snr, C, dv, P, samples, rng):
    """Sample the stated noise model (assumptions a-e) directly."""
    k = theory.noise_dof(P, dv)
    nu = rng.chisquare(k, samples) / k
    sig2 = nu / snr**2
    x = 1 + np.sqrt(theory.projection_fraction(C, dv) * sig2) * rng.standard_normal(samples)
    o2 = x * x + (1 - theory.projection_fraction(C, dv)) * sig2
    counts = rng.poisson(P / C, (samples, C - 1))
    rho = np.sqrt(o2[:, None] + dv * sig2[:, None] * counts / P)
    g = rng.standard_normal((samples, C - 1, dv))
    t = g[..., 0] / np.linalg.norm(g, axis=-1)  # cosine to a random direction in R^dv
    return np.mean(np.all(rho * t < x[:, None], axis=1))


@pytest.mark.parametrize("snr,P", [(0.6, 40), (0.35, 400)])
def test_accuracy_integral_matches_monte_carlo_of_its_model(snr, P):
    rng = np.random.default_rng(3)
    C, dv, samples = 128, 24, 6000
    mc = _monte_carlo_of_model(snr, C, dv, P, samples, rng)
    se = math.sqrt(mc * (1 - mc) / samples)
    assert theory.predicted_accuracy(snr, C, dv, P) == pytest.approx(mc, abs=4 * se + 2e-3)


def test_cosine_cdf_matches_betainc():
    for d in (3, 32, 128):
        x = np.linspace(-0.99, 0.99, 397)
        tail = 0.5 * special.betainc((d - 1) / 2, 0.5, 1 - x * x)
        exact = np.where(x >= 0, 1 - tail, tail)
        np.testing.assert_allclose(theory._cosine_cdf(x, d), exact, atol=1e-6)
        # and the density it integrates is the cosine law
        assert integrate.quad(lambda t: math.exp(theory._sphere_cosine_logpdf(t, d)), -1, 1)[0] == pytest.approx(1.0)


def test_recall_survives_past_n_equals_d():
    """The subtlety: SNR = 1 at N = d, yet top-1 recall of random keys is still near 1 there,
    and the capacity is of order d^2 / (2 ln C), not d."""
    C = 1024
    for d in (32, 64, 128):
        assert theory.predicted_accuracy(theory.predicted_snr(d, d - 1), C, d, d - 1) > 0.9
        cap = theory.recall_capacity(d, d, C, accuracy=0.5)
        assert 2 * d < cap
        assert 0.7 < cap / (d * d / (2 * math.log(C))) < 1.5
    assert "read vector" in theory.explain() and "accuracy" in theory.explain()


def test_accuracy_rejects_bad_sizes():
    with pytest.raises(ValueError):
        theory.predicted_accuracy(1.0, 1, 32)
    with pytest.raises(ValueError):
        theory.kernel_effective_dim("relu", 32)


# --------------------------------------------------------------------------------------------
# The delta rule (section 4).


def _delta_weights_by_simulation(d, n, states, log_a=None, seed=0):
    """a_ij of reading stored key i from the state after n beta = 1 writes of random unit keys,
    by the delta rule with one-hot values (the state's column j is then lam_j P_N ... P_{j+1} k_j)."""
    from harness import ops

    g = torch.Generator().manual_seed(seed)
    k = torch.nn.functional.normalize(torch.randn(states, 1, n, d, generator=g, dtype=torch.float64), dim=-1)
    eye = torch.eye(n, dtype=torch.float64).expand(states, 1, n, n)
    ld = None if log_a is None else torch.full((states, 1, n), log_a, dtype=torch.float64)
    _, S = ops.delta_attention(k, k, eye, torch.ones(states, 1, n, dtype=torch.float64), ld, return_state=True)
    return (k[:, 0] @ S[:, 0]).numpy()  # (states, N, N): a_ij


@pytest.mark.parametrize("d,n,log_a", [(16, 40, None), (32, 24, None), (16, 40, math.log(0.9))])
def test_delta_read_energy_matches_simulation(d, n, log_a):
    """E a_ii^2 and E sum_{j != i} a_ij^2 per read, exact expectations, against 4000 states
    (standard errors below 2% of each mean; tolerance 6%)."""
    a = _delta_weights_by_simulation(d, n, 4000, log_a)
    diag = np.diagonal(a, axis1=1, axis2=2) ** 2
    sig, cross = diag.mean(0), ((a**2).sum(-1) - diag).mean(0)
    lam = np.ones(n) if log_a is None else theory.decay_pair_weights(np.full(n, log_a))
    exp_sig, exp_cross = theory.delta_read_energy(d, lam)
    np.testing.assert_allclose(sig, exp_sig, rtol=0.06)
    np.testing.assert_allclose(cross[:-1], exp_cross[:-1], rtol=0.06)
    assert exp_cross[-1] == 0 and cross[-1] < 1e-20  # the newest pair is read exactly
    assert exp_sig[-1] == pytest.approx(1.0)


def test_delta_crosstalk_without_decay_is_the_closed_form():
    """sum_j a_ij^2 + |P_1 ... P_N k_i|^2 = 1: the crosstalk is 1 - s(m) - gamma^i (gamma^m - s(m))."""
    d, n = 32, 100
    sig, cross = theory.delta_read_energy(d, np.ones(n))
    i = np.arange(n)
    m = n - 1 - i
    s, gamma = theory.delta_signal_sq(d, m), 1 - 1 / d
    np.testing.assert_allclose(sig, s)
    np.testing.assert_allclose(cross, 1 - s - gamma**i * (gamma**m - s), atol=1e-12)


def test_delta_rule_laws_against_the_additive_state():
    """N << d: crosstalk only from the later pairs, SNR ~ sqrt(2 d / N), sqrt(2) above the
    additive law; N = d: the two meet; N >> d: an exponential memory of ~d writes, far below."""
    def snr(d, n):
        sig, cross = theory.delta_read_energy(d, np.ones(n))
        return math.sqrt(sig.sum() / cross.sum())

    assert snr(4096, 32) == pytest.approx(math.sqrt(2 * 4096 / 31), rel=0.02)
    assert snr(128, 128) == pytest.approx(math.sqrt(128 / 127), rel=0.02)
    assert snr(128, 8192) < 0.75 * math.sqrt(128 / 8191)
    sig, _ = theory.delta_read_energy(128, np.ones(8192))
    assert sig.sum() == pytest.approx(128 / 2, rel=0.02)  # the signal energy a full state holds
    assert theory.delta_signal_sq(128, 128) == pytest.approx(math.exp(-2), rel=0.02)  # e^{-2m/d}


def test_delta_rule_recalls_orthonormal_keys_exactly_up_to_d():
    """N <= d orthonormal keys written with beta = 1 read back exactly; a (d+1)-th key cannot be."""
    from harness import ops

    d = 8
    g = torch.Generator().manual_seed(1)
    basis = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))[0].T  # rows orthonormal
    extra = (basis[0] + basis[1]) / math.sqrt(2)  # unit, but not orthogonal to the others
    for n in (1, 5, d, d + 1):
        keys = torch.cat([basis, extra[None]])[:n]
        v = torch.randn(n, 5, generator=g, dtype=torch.float64)
        beta = torch.ones(1, 1, n, dtype=torch.float64)
        _, S = ops.delta_attention(keys[None, None], keys[None, None], v[None, None], beta, return_state=True)
        err = (keys @ S[0, 0] - v).abs().max()
        assert (err < 1e-12) if n <= d else (err > 0.1), (n, float(err))
# Recall against length (N fixed, T growing).


def _brute_n_eff(seq_len, n, s, t_pair, log_decay, rate, q):
    """N_eff of one read, summed write by write over the layout that length_reads describes."""
    space = seq_len - 2 * n
    density = (np.arange(space) + 1.0) ** (0.01 - 1.0)
    density *= q / density.sum()
    t = 2 * t_pair + 1
    total = sum(math.exp(2 * log_decay * (t - (2 * j + 1))) for j in range(n) if j != t_pair)
    for off in range(int(s)):  # every position after the pairs that precedes the read
        w = 2 * n + off
        total += (rate + density[off]) * math.exp(2 * log_decay * (t - w))
    return total


@pytest.mark.parametrize("log_decay, rate", [(0.0, 0.0), (0.0, 1.0), (math.log(1 - 2**-5), 0.0), (-0.1, 0.5)])
def test_length_reads_count_every_earlier_write_weighted_by_its_survival(log_decay, rate, monkeypatch):
    exact_gaps = (np.array([0.0, 3.0, 17.0, 40.0]), np.full(4, 0.25))
    monkeypatch.setattr(theory, "_gap_bins", lambda space, power_a: exact_gaps)
    n_eff, prob = theory.length_reads(64, 4, log_decay=log_decay, distractor_rate=rate)
    assert prob.sum() == pytest.approx(1.0) and n_eff.shape == (16,)
    for g, s in enumerate(exact_gaps[0]):
        for t in range(4):
            assert n_eff[4 * g + t] == pytest.approx(_brute_n_eff(64, 4, s, t, log_decay, rate, 4), rel=1e-9)


def test_gap_bins_carry_the_power_law():
    s, p = theory._gap_bins(1000, 0.01)
    assert p.sum() == pytest.approx(1.0) and np.all(np.diff(s) > 0)
    law = (np.arange(1000) + 1.0) ** -0.99
    assert (p * s).sum() == pytest.approx((law * np.arange(1000)).sum() / law.sum(), rel=1e-9)  # the mean gap


def test_length_curves_fall_only_where_writes_accumulate_or_fade():
    lengths = [64, 512, 4096]
    flat = theory.predicted_length_accuracy(lengths, 4, 64, 64, 128)
    assert np.all(np.abs(np.diff(flat)) < 0.01)   # additive state, zero filler: T costs nothing
    noisy = theory.predicted_length_accuracy(lengths, 4, 64, 64, 128, distractor_rate=1.0)
    decayed = theory.predicted_length_accuracy(lengths, 4, 64, 64, 128, log_decay=math.log(1 - 2**-5))
    for curve in (noisy, decayed):
        assert np.all(np.diff(curve) < 0) and curve[-1] > 1 / 128
    assert theory.predicted_length_accuracy([64], 4, 64, 64, 128, log_decay=-50.0)[0] < 0.3  # all forgotten


def test_length_curve_matches_a_simulated_additive_state_with_distractors():
    """Random keys on the sphere, a codebook of C random values, S = sum_w k_w v_w^T over the pairs,
    a random-key distractor at every position after them and the earlier queries; top-1 read-out."""
    d, c, n, seq_len, trials = 32, 64, 4, 160, 300
    rng = np.random.default_rng(0)
    codebook = rng.standard_normal((c, d))
    codebook /= np.linalg.norm(codebook, axis=1, keepdims=True)
    hits = []
    for _ in range(trials):
        keys = rng.standard_normal((n, d))
        values = rng.choice(c, n, replace=False)
        # one query at a power-law gap (as the task draws it), the other queries' writes before it
        s = rng.choice(seq_len - 2 * n, p=(np.arange(seq_len - 2 * n) + 1.0) ** -0.99
                       / ((np.arange(seq_len - 2 * n) + 1.0) ** -0.99).sum())
        others = rng.choice(seq_len - 2 * n, n - 1, replace=False, p=None)
        writes = [(keys[j], codebook[values[j]]) for j in range(n)]
        writes += [(rng.standard_normal(d), codebook[rng.integers(c)]) for _ in range(int(s))]  # distractors
        writes += [(keys[rng.integers(n)], codebook[rng.integers(c)]) for o in others if o < s]  # query writes
        state = sum(np.outer(k, v) for k, v in writes)
        t = rng.integers(n)
        hits.append(np.argmax(codebook @ (keys[t] @ state)) == values[t])
    measured = float(np.mean(hits))
    predicted = theory.predicted_length_accuracy([seq_len], n, d, d, c, distractor_rate=1.0)[0]
    assert predicted == pytest.approx(measured, abs=0.08), (predicted, measured)
