"""The crosstalk law and the recall accuracy it implies.

Setting. N key/value pairs are written into one mixer's memory and stored key k_i is read
back. Every mixer's read-out decomposes as

    o_i = sum_j a_ij v_j = a_ii v_i  +  sum_{j != i} a_ij v_j
          \\_ signal _/      \\_____ crosstalk (noise) _____/

with effective weights a_ij (q_i . k_j for the plain linear memory, phi(q_i).phi(k_j) / den_i
for a normalised feature map, lambda_j q_i . k_j for a decayed state whose write j has been
scaled by lambda_j by the time of the read).

1. SNR of the read vector (`predicted_snr`). Keys uniform on a sphere in R^d: the crosstalk
   weight of pair j relative to the target, a_ij / a_ii = k_i.k_j / |k|^2, has mean 0 and
   variance 1/d, and the crosstalk terms are uncorrelated. With unit values,
   E|noise|^2 / |signal|^2 = N_eff / d_eff, so

       SNR = sqrt(d_eff / N_eff)

   d_eff is the key dimension of the state (d_head for linear / elu, m for FAVOR+, 1 + d + d^2
   for the Taylor map). N_eff counts the *other* pairs, weighted by how much of their write
   survives relative to the target's:

       N_eff(i) = sum_{j != i} (lambda_j / lambda_i)^2            (`crosstalk_pairs`)

   which is N - 1 without decay (the law's "N" counts the target too; the two agree for
   N >> 1). Over many reads SNR is aggregated as a ratio of means,
   sqrt(sum_i |signal_i|^2 / sum_i |noise_i|^2), whose predicted N_eff is
   sum_i sum_{j != i} lambda_j^2 / sum_i lambda_i^2 (`aggregate_pairs`). When all pairs are read
   from the same state this is N - 1 for *any* decay: decay removes crosstalk and signal in
   equal measure on average and only moves the signal onto the recent pairs; the accuracy,
   a per-read non-linear function of SNR, is what shows it. `state_pairs` gives the
   decay-weighted number of pairs the state holds at full weight (1 / (1 - gamma^2) at most
   for RetNet), the count seen by the newest pair.

2. Top-1 recall accuracy (`predicted_accuracy`). SNR is the error of the *read vector*, not
   the token accuracy: the read-out is scored against a codebook of C unit value vectors
   (pair values drawn uniformly from it) and recall succeeds when the target's value scores
   highest. Only the projection of the crosstalk onto a candidate competes with the signal,
   and that is a small share of |noise|^2: about 1/d_v of it (plus 1/C, see below). The
   per-candidate margin is therefore SNR sqrt(d_v) ~ sqrt(d_eff d_v / N), and recall holds
   while N < ~ d_eff d_v / (2 ln C) (`recall_capacity`): a d x d memory keeps recalling
   random keys long after SNR < 1, i.e. well past N = d. SNR < 1 says the read vector is
   mostly noise, not that recall has failed.

   Noise model (signal scaled to 1, read-out o = v + n, all of it stated):
   (a) Gaussian crosstalk: n = sum_j w_j v_j over P crosstalk pairs with independent
       zero-mean weights; the read's noise power is |n|^2 = nu / SNR^2 with
       nu ~ chi2(k)/k, k = P d_v / (P + d_v) (n spans min(P, d_v) directions;
       `noise_dof`). An SNR measured read by read has nu = 1.
   (b) Along the target's value: correct score 1 + X, X ~ N(0, kappa0 |n|^2),
       kappa0 = 1/d_v + 1/C (`projection_fraction`: 1/d_v from a random direction, 1/C
       from the pairs that happen to share the target's value).
   (c) A wrong candidate is a random unit direction (codebook random and centred): against
       a read-out of norm |o|, |o|^2 = (1 + X)^2 + (1 - kappa0)|n|^2, it scores |o| t with
       t the cosine to a random direction in R^d_v, density ~ (1 - t^2)^((d_v - 3)/2)
       (exact tails, not Gaussian ones: with C ~ 1000 the top wrong score sits in them).
   (d) A wrong candidate carried by c crosstalk pairs, c ~ Poisson(P/C), also holds their
       share c/P of |n|^2, which widens its score: |o| -> sqrt(|o|^2 + d_v |n|^2 c / P).
   (e) Wrong candidates are independent given (nu, X). Then

       P(top-1) = E_{nu, X} [ ( sum_c Pois(c; P/C) F_dv((1 + X) / rho_c) )^(C-1) ],
       rho_c^2 = |o|^2 + d_v |n|^2 c / P,   F_dv the CDF of t,

   integrated numerically with scipy (equal-probability quantiles of chi2 for nu, Simpson
   over X, betainc for F_dv). It runs from ~1/C at SNR = 0 to 1 at SNR = inf, and matches
   simulated random memories (linear, RetNet, Mamba) to within ~0.02 across d = 32..128,
   N = d/2..64d, C = 1024. Where the crosstalk weights are not zero-mean (positive feature
   maps: elu + 1, FAVOR+) or are heavy-tailed (FAVOR+ at softmax temperature), assumption
   (a) fails and the model is only indicative; the probe reports both.

3. Kernels (`kernel_effective_dim`). For a kernel kappa(q, k) the same algebra gives
   SNR^2 = kappa(k, k)^2 / ((N - 1) E kappa(k, k')^2), i.e. the law with d_eff replaced by
   d_kernel = kappa(k,k)^2 / E kappa(k,k')^2; a normaliser den_i rescales signal and noise
   alike and cancels. The identity kernel gives d_kernel = d exactly. A positive feature map
   (elu + 1) gives every weight a shared positive mean: crosstalk no longer cancels in the
   weights and d_kernel ~ 2.1 whatever d, so SNR ~ sqrt(2/N) and stops improving with d.
   The softmax kernel exp(q.k / sqrt(d)) gives d_kernel ~ exp(2 sqrt(d) - 2), far above d,
   and the Taylor map (1 + s + s^2/2) about d^2 / 15. DPFP's features (products of two
   rectified coordinates) are sparse but positive too: d_kernel grows with d and nu at small d
   and saturates where the features' shared mean takes over the cross term,
   (2 pi)^4 / 16 ~ 97 for nu = 1 (`dpfp_effective_dim`).

4. The delta rule (`delta_read_energy`). DeltaNet writes the correction: with beta = 1 and
   unit keys, S_t = a_t P_t S_{t-1} + k_t v_t^T, P_t = I - k_t k_t^T, so S_t^T k_t = v_t exactly
   after each write. Unrolled, S_N = sum_j lam_j (P_N ... P_{j+1}) k_j v_j^T with lam_j the
   decay after write j (1 without decay), and reading stored key k_i gives
   a_ij = lam_j k_j^T P_{j+1} ... P_N k_i (the projections are symmetric).
   Orthonormal keys: every P leaves the other keys alone, a_ij = lam_j delta_ij, so recall is
   exact (no crosstalk at all) for any N <= d; a (d + 1)-th key cannot be orthogonal to the
   others and breaks it.
   Random unit keys (uniform on the sphere, independent): exact expectations, derived here.
   With gamma = 1 - 1/d (E|P x|^2 = gamma |x|^2 for a random P) and m = N - 1 - i the writes
   after i (0-based):
     signal   E a_ii^2 = lam_i^2 s(m),   s(m) = (1 - 1/d) alpha^m + gamma^m / d,
              alpha = 1 - 2 (d + 1) / (d (d + 2)); from the closed recursion of
              E (k_i.x)^2 and E|x|^2 under x -> P x (E (k.a)^2 (k.b)^2 = (|a|^2|b|^2 +
              2 (a.b)^2) / (d (d + 2)) for a uniform unit k). So E a_ii ~ gamma^m ~ e^{-m/d}:
              each later random write erases a share 1/d of an old pair.
     later    j > i: E a_ij^2 = lam_j^2 gamma^(N-1-j) / d (k_j is independent of what the later
              projections make of k_i);
     earlier  j < i: E a_ij^2 = lam_j^2 gamma^(i-1-j) (gamma^m - s(m)) / d: only the part of
              k_i that the later writes rotated away from k_i still meets the older pairs.
   Without decay the crosstalk sums to E sum_{j != i} a_ij^2 = 1 - s(m) - gamma^(i-1)(gamma^m - s(m))
   (from the exact identity sum_j a_ij^2 + |P_1 ... P_N k_i|^2 = 1). For N << d this is
   m / d to first order: a pair sees crosstalk only from the pairs written after it (the
   additive state: (N - 1) / d from all of them), so the aggregate SNR is about sqrt(2 d / N),
   sqrt(2) above the additive law. For N >> d the state is full (|S|_F^2 -> d) and acts as an
   exponential memory of horizon ~ d writes: the newest pairs are read almost exactly, old
   ones are overwritten, and top-1 recall (section 2, per-read SNR^2 = E a_ii^2 / E noise^2)
   covers about the last ~d pairs, against the additive state's ~d d_v / (2 ln C) pairs of
   partial recall. The probe (mode=probe model=deltanet) holds both against simulation.

Key convention (the probe's and the mixers'): keys uniform on the sphere of radius sqrt(d)
(unit-variance coordinates, as after a norm layer); softmax scores them with 1/sqrt(d); the
exp-approximating maps (favor, taylor) see k / d^(1/4), so their product carries the same
temperature.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import numpy as np
from scipy import integrate, interpolate, optimize, signal, special, stats

EXPLANATION = (
    "SNR = sqrt(d_eff / N_eff) predicts the error of the read vector: each of the N_eff other "
    "pairs adds crosstalk of variance 1/d_eff relative to the target's term, so the read vector "
    "is mostly noise once N > d_eff. It does not predict token accuracy. Top-1 recall scores "
    "the read-out against C candidate values, and only the projection of the crosstalk onto a "
    "candidate competes with the signal: about 1/d_v of its power, so the per-candidate noise "
    "is ~ sqrt(N/d_eff)/sqrt(d_v). The accuracy model (Gaussian crosstalk; the correct value "
    "must beat C - 1 random candidates whose scores follow the exact cosine law of R^d_v; "
    "numerical integration with scipy) therefore keeps recall near 1 until "
    "N ~ d_eff d_v / (2 ln C): a d x d memory recalls random keys far past N = d, at SNR well "
    "below 1."
)

def explain() -> str:
    """One paragraph: what `predicted_snr` and `predicted_accuracy` predict, and why they differ."""
    return EXPLANATION


# --------------------------------------------------------------------------------------------
# SNR of the read vector.


def predicted_snr(d_eff, n_eff):
    """Crosstalk law sqrt(d_eff / n_eff); n_eff counts the pairs other than the target.

    Works on scalars and arrays; n_eff = 0 (nothing to interfere) gives inf.
    """
    d_eff = np.asarray(d_eff, dtype=np.float64)
    n_eff = np.asarray(n_eff, dtype=np.float64)
    with np.errstate(divide="ignore"):
        out = np.sqrt(d_eff / n_eff)
    return float(out) if out.ndim == 0 else out


def crosstalk_pairs(weights, target: int | None = None):
    """N_eff of one read: sum_{j != t} (w_j / w_t)^2 over the pairs' survival weights w.

    weights: (..., N) how much of each pair's write the state still holds at the read
    (1 without decay, gamma^distance for RetNet, dt_j prod a_s for Mamba). target: the index
    of the pair being read, or None for every pair in turn, which returns (..., N).
    A target whose weight underflowed to 0 gets inf.
    """
    w2 = np.asarray(weights, dtype=np.float64) ** 2
    total = w2.sum(axis=-1, keepdims=True)
    if target is None:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return np.where(w2 > 0, (total - w2) / np.where(w2 > 0, w2, 1.0), np.inf)
    wt = w2[..., target]
    with np.errstate(divide="ignore", over="ignore"):
        return (total[..., 0] - wt) / wt


def aggregate_pairs(weights):
    """N_eff of the ratio-of-means SNR when every pair is read from the same state.

    sum_i sum_{j != i} w_j^2 / sum_i w_i^2 over the last axis, = N - 1 for any weights: the
    aggregate is blind to decay (see the module docstring); per-read SNRs are not.
    """
    w2 = np.asarray(weights, dtype=np.float64) ** 2
    n = w2.shape[-1]
    return (n * w2.sum(axis=-1) - w2.sum(axis=-1)) / w2.sum(axis=-1)


def state_pairs(weights):
    """Decay-weighted count of pairs held at full weight: sum_j (w_j / max w)^2 (N without decay)."""
    w = np.abs(np.asarray(weights, dtype=np.float64))
    return (w**2).sum(axis=-1) / (w.max(axis=-1) ** 2)


def decay_pair_weights(log_decay, write_scale=None):
    """Survival weight of each write in the state after the last write.

    log_decay: (..., N) log a_t, applied as S_t = a_t S_{t-1} + scale_t k_t v_t^T; the weight
    of write j at the end is scale_j * exp(sum_{s > j} log a_s). write_scale: (..., N) or None
    (1). Computed in log space, so long sequences underflow to exactly 0 rather than NaN.
    """
    log_a = np.asarray(log_decay, dtype=np.float64)
    after = np.cumsum(log_a[..., ::-1], axis=-1)[..., ::-1] - log_a  # sum_{s > j} log a_s
    w = np.exp(after)
    if write_scale is not None:
        w = w * np.asarray(write_scale, dtype=np.float64)
    return w


def constant_decay_state_pairs(gamma: float, n: int) -> float:
    """`state_pairs` of a constant decay: sum_{t < n} gamma^(2t) = (1 - gamma^(2n)) / (1 - gamma^2)."""
    return (1.0 - gamma ** (2 * n)) / (1.0 - gamma**2)


# --------------------------------------------------------------------------------------------
# Kernels: the effective dimension that replaces d_eff.


def _sphere_cosine_logpdf(t, d: int):
    """log density of the cosine between two independent uniform directions in R^d."""
    return (d - 3) / 2 * np.log1p(-np.square(t)) - special.betaln(0.5, (d - 1) / 2)


def sphere_expectation(g, d: int) -> float:
    """E[g(t)] for t the cosine between two random directions in R^d (scipy quad)."""
    value, _ = integrate.quad(lambda t: g(t) * math.exp(_sphere_cosine_logpdf(t, d)), -1.0, 1.0, limit=200)
    return value


def _log_sphere_mgf(c: float, d: int) -> float:
    """log E[exp(c t)], t a random cosine in R^d: Gamma(nu+1) (2/c)^nu I_nu(c), nu = d/2 - 1."""
    if c == 0:
        return 0.0
    nu = d / 2 - 1
    return special.gammaln(nu + 1) + nu * math.log(2 / c) + math.log(special.ive(nu, c)) + c


def _gaussian_moment(f, p: int) -> float:
    """E[f(x)^p], x ~ N(0, 1)."""
    value, _ = integrate.quad(lambda x: f(x) ** p * math.exp(-x * x / 2) / math.sqrt(2 * math.pi), -12, 12, limit=200)
    return value


def _elu1(x: float) -> float:
    return x + 1.0 if x > 0 else math.exp(x)


@functools.lru_cache(maxsize=None)
def dpfp_effective_dim(d: int, nu: int) -> float:
    """d_kernel of DPFP (harness.features.dpfp) on keys with N(0, 1) coordinates (d >> 1), exactly.

    A feature phi_f = r_p r_p' is the product of two of the 2d rectified inputs r_p (input p:
    coordinate p mod d, relu of +x below d, of -x from d on) on two different coordinates. For
    features f, g the expectation of a product of their factors is the product over coordinates
    of the moments mu_k = E relu(x)^k of the factors on that coordinate (mu_1 = 1/sqrt(2 pi),
    mu_2 = 1/2, mu_4 = 3/2), and 0 when one coordinate carries relu(x) and relu(-x):
      E phi_f phi_g     = mu_1^(4 - 2 s) mu_2^s,   E phi_f^2 phi_g^2 = mu_2^(4 - 2 s) mu_4^s
    with s the inputs f and g share. d_kernel = E|phi(k)|^4 / E (phi(k).phi(k'))^2 = sum_fg
    E phi_f^2 phi_g^2 / sum_fg (E phi_f phi_g)^2. Rolling every input by one position maps the
    features onto themselves and keeps the law of the inputs, so the sums over g are the same
    for every f of one shift: nu rows of 2 d nu entries are summed, times 2d.
    """
    if not 1 <= nu < d:
        raise ValueError(f"DPFP needs 1 <= nu < d (shift d pairs relu(x) with relu(-x)), got nu={nu}, d={d}")
    mu1, mu2, mu4 = 1.0 / math.sqrt(2.0 * math.pi), 0.5, 1.5
    two_d = 2 * d
    p = np.arange(two_d)
    inputs = np.concatenate([np.stack([p, (p - j) % two_d], -1) for j in range(1, nu + 1)])  # (F, 2)
    rows = inputs[::two_d]  # (nu, 2): the first feature of every shift
    same = (rows[:, None, :, None] == inputs[None, :, None, :]).sum((-1, -2))  # (nu, F) shared inputs
    coords = (rows[:, None, :, None] % d == inputs[None, :, None, :] % d).sum((-1, -2))  # shared coordinates
    ok = same == coords  # no coordinate meets relu(x) and relu(-x)
    m2 = np.where(ok, mu1 ** (4 - 2 * same) * mu2**same, 0.0)
    m4 = np.where(ok, mu2 ** (4 - 2 * same) * mu4**same, 0.0)
    return float(m4.sum() / np.square(m2).sum())


@functools.lru_cache(maxsize=None)
def kernel_effective_dim(kernel: str, d: int) -> float:
    """d_kernel = E kappa(k,k)^2 / E kappa(k,k')^2 for keys uniform on the sphere of radius sqrt(d).

    With it, SNR = sqrt(d_kernel / N_eff) for that kernel (normalised or not).
      identity   kappa = q.k                       d exactly
      elu1       phi = elu(x) + 1, coordinates taken as N(0, 1) (d >> 1): O(1) for every d,
                 the shared positive mean of the features dominates both moments
      softmax    kappa = exp(q.k / sqrt(d))        exp(2 sqrt(d)) / E exp(2 sqrt(d) t), Bessel form
      taylor     1 + s + s^2/2, s = q.k / sqrt(d)  (1 + sqrt(d) + d/2)^2 / (15/4 - 3/(2d+4))
      dpfp<nu>   DPFP with nu shifts ("dpfp1", "dpfp2", ...): dpfp_effective_dim(d, nu)
      favor      NaN: FAVOR+ estimates the softmax kernel with a relative variance
                 ~ exp(|x + y|^2) / m; its moments are set by draws no finite sample reaches,
                 so no moment-based prediction is made (the probe measures it).
    The names are those a mixer declares as its `kernel` (harness.layers.protocol); a kernel
    registers its d_kernel with ``kernel_dim`` (a feature map's, beside harness.features'
    register), "dpfp<nu>" reads its nu from the name.
    """
    if kernel in KERNEL_DIMS:
        return KERNEL_DIMS[kernel](d)
    if kernel.startswith("dpfp") and kernel[4:].isdigit():
        return dpfp_effective_dim(d, int(kernel[4:]))
    raise ValueError(f"unknown kernel {kernel!r}; valid: {', '.join(KERNEL_DIMS)}, dpfp<nu>")


KERNEL_DIMS: dict[str, Callable[[int], float]] = {}


def kernel_dim(name: str):
    """Register ``fn(d) -> d_kernel`` as the effective dimension of the kernel ``name``."""
    def register(fn: Callable[[int], float]) -> Callable[[int], float]:
        KERNEL_DIMS[name] = fn
        return fn
    return register


@kernel_dim("identity")
def _identity_dim(d: int) -> float:  # kappa = q.k: d exactly
    return float(d)


@kernel_dim("elu1")
def _elu1_dim(d: int) -> float:
    m1, m2, m4 = (_gaussian_moment(_elu1, p) for p in (1, 2, 4))
    self_sq = d * m4 + d * (d - 1) * m2**2   # E (sum_c phi_c^2)^2
    cross_sq = d * m2**2 + d * (d - 1) * m1**4  # E (sum_c phi_c phi'_c)^2
    return self_sq / cross_sq


@kernel_dim("softmax")
def _softmax_dim(d: int) -> float:
    c = 2 * math.sqrt(d)  # kappa(k,k)^2 = exp(2 sqrt d); kappa(k,k')^2 = exp(2 sqrt(d) t)
    return math.exp(c - _log_sphere_mgf(c, d))


@kernel_dim("taylor")
def _taylor_dim(d: int) -> float:
    # s = sqrt(d) t: E s^2 = 1, E s^3 = 0, E s^4 = 3 d / (d + 2)
    cross_sq = 1 + 2 * 1.0 + (3 * d / (d + 2)) / 4
    return (1 + math.sqrt(d) + d / 2) ** 2 / cross_sq


@kernel_dim("favor")
def _favor_dim(d: int) -> float:  # no moment-based prediction (docstring of kernel_effective_dim)
    return math.nan


# --------------------------------------------------------------------------------------------
# Top-1 accuracy from SNR.


def participation(weights, axis: int = -1):
    """(sum w^2)^2 / sum w^4: how many equal pairs the crosstalk weights w amount to."""
    w2 = np.asarray(weights, dtype=np.float64) ** 2
    return w2.sum(axis=axis) ** 2 / (w2**2).sum(axis=axis)


def read_participation(weights):
    """P of every read i from one state: `participation` of the weights of the pairs j != i.

    weights: (..., N) survival weights; returns (..., N) in O(N) (N - 1 without decay).
    """
    w2 = np.asarray(weights, dtype=np.float64) ** 2
    s2 = w2.sum(-1, keepdims=True) - w2
    s4 = (w2**2).sum(-1, keepdims=True) - w2**2
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(s4 > 0, s2**2 / np.where(s4 > 0, s4, 1.0), 0.0)


def projection_fraction(candidates: int, value_dim: int) -> float:
    """kappa0: the share of |noise|^2 along the target's value, 1/d_v + 1/C."""
    return 1.0 / value_dim + 1.0 / candidates


def noise_dof(pairs: float, value_dim: int) -> float:
    """Degrees of freedom of |noise|^2: P d_v / (P + d_v), the crosstalk spans min(P, d_v) directions."""
    return float(value_dim) if math.isinf(pairs) else pairs * value_dim / (pairs + value_dim)


@functools.lru_cache(maxsize=32)
def _cosine_log_tail(d: int) -> tuple[np.ndarray, np.ndarray]:
    """log P(t > y) on a grid of y in [0, 1), t a random cosine in R^d (scipy betainc).

    Tabulated once per d and interpolated: log P is smooth in y, so 4097 points keep the
    relative error of the tail below 1e-4 where it matters (tails > 1e-300).
    """
    y = np.linspace(0.0, 1.0, 4097)[:-1]
    tail = 0.5 * special.betainc((d - 1) / 2, 0.5, 1.0 - y * y)
    return y, np.log(np.maximum(tail, 1e-300))


def _cosine_cdf(x, d: int):
    """P(t <= x), t the cosine between a fixed and a uniformly random direction in R^d."""
    y, log_tail = _cosine_log_tail(d)
    tail = np.exp(np.interp(np.abs(x), y, log_tail, right=math.log(1e-300)))  # P(t > |x|)
    return np.where(x >= 0, 1.0 - tail, tail)


def _carried_counts(pairs: float, candidates: int, points: int = 12):
    """(n, weight): how many crosstalk pairs carry one wrong candidate's value, n ~ Poisson(P/C).

    Exact probabilities for a small mean, equal-probability quantiles for a large one,
    a single point n/P = 1/C for P = inf. Returned as the share n/P of the crosstalk.
    """
    if math.isinf(pairs):
        return np.array([1.0 / candidates]), np.array([1.0])
    lam = pairs / candidates
    if lam <= 10:
        n = np.arange(int(lam + 8 * math.sqrt(lam) + 10))
        w = stats.poisson.pmf(n, lam)
        keep = w > 1e-7
        return n[keep] / pairs, w[keep] / w[keep].sum()
    n = stats.poisson.ppf((np.arange(points) + 0.5) / points, lam)
    return n / pairs, np.full(points, 1.0 / points)


def _accuracy_grid(snr: np.ndarray, candidates: int, value_dim: int, pairs: float, dof: float,
                   z_points: int = 161, nu_points: int = 8) -> np.ndarray:
    """The noise model of section 2 integrated numerically for an array of finite SNR > 0."""
    C, dv = candidates, value_dim
    kappa0 = projection_fraction(C, dv)  # share of the crosstalk along the target's value
    share, share_w = _carried_counts(pairs, C)
    if math.isinf(dof):
        nu = np.array([1.0])
    else:  # |noise|^2 / E|noise|^2 ~ chi2(dof) / dof, equal-probability quantiles
        nu = stats.chi2.ppf((np.arange(nu_points) + 0.5) / nu_points, dof) / dof
    z = np.linspace(-8.0, 8.0, z_points)
    sig2 = nu[None, :, None] / np.square(snr)[:, None, None]  # (S, V, 1) noise power per read
    x = 1.0 + np.sqrt(kappa0 * sig2) * z  # (S, V, Z) correct score (signal scaled to 1)
    o2 = x * x + (1.0 - kappa0) * sig2  # |read-out|^2
    below = np.zeros_like(x)  # P(one wrong candidate scores below the correct one)
    for f, w in zip(share, share_w):
        below += w * _cosine_cdf(x / np.sqrt(o2 + dv * f * sig2), dv)
    log_all = (C - 1) * np.log(np.clip(below, 1e-300, 1.0))
    integrand = np.exp(-z * z / 2 + log_all) / math.sqrt(2 * math.pi)
    acc = integrate.simpson(integrand, x=z, axis=-1).mean(axis=-1)  # over z, then over nu
    return np.clip(acc, 1.0 / C, 1.0)


def predicted_accuracy(snr, candidates: int, value_dim: int, pairs: float = math.inf, *,
                       dof: float | None = None):
    """Top-1 recall over C candidates predicted from SNR (module docstring, section 2).

    snr: scalar or array, per read. pairs: P, the crosstalk pairs behind each read (N - 1
    without decay; `participation` of the decay weights otherwise; inf: P >> C). dof: the
    degrees of freedom of the read's noise power: None = `noise_dof(P, d_v)`, the spread of
    |noise| around the SNR the law gives every read; inf = none, for an SNR already measured
    read by read. An array with more than 8 distinct values is integrated on log-spaced SNRs
    across its range (12 a decade) and interpolated (PCHIP in log SNR). SNR 0 gives 1/C and
    SNR inf gives 1.
    """
    if candidates < 2 or value_dim < 2:
        raise ValueError(f"need candidates >= 2 and value_dim >= 2, got {candidates}, {value_dim}")
    dof = noise_dof(pairs, value_dim) if dof is None else dof
    s = np.asarray(snr, dtype=np.float64)
    out = np.full(s.shape, math.nan)
    out[s <= 0] = 1.0 / candidates
    out[np.isposinf(s)] = 1.0
    finite = np.isfinite(s) & (s > 0)
    if finite.any():
        vals, inverse = np.unique(np.clip(s[finite], 1e-4, 1e4), return_inverse=True)
        if vals.size <= 8:
            out[finite] = _accuracy_grid(vals, candidates, value_dim, pairs, dof)[inverse]
        else:  # 12 points a decade: PCHIP error < 3e-3 against direct integration
            decades = math.log10(vals[-1] / vals[0])
            grid = np.geomspace(vals[0], vals[-1], int(np.clip(12 * decades, 17, 120)) + 1)
            table = _accuracy_grid(grid, candidates, value_dim, pairs, dof)
            out[finite] = interpolate.PchipInterpolator(np.log(grid), table)(np.log(vals))[inverse]
    return float(out) if out.ndim == 0 else out


def recall_capacity(d_eff: float, value_dim: int, candidates: int, accuracy: float = 0.5) -> float:
    """N at which N random pairs (SNR = sqrt(d_eff / (N - 1)), P = N - 1) reach the stated accuracy.

    About d_eff * d_v / (2 ln C) for C >> d_v: a d x d memory recalls up to ~d^2 / (2 ln C)
    random keys, far beyond N = d where SNR = 1.
    """
    def gap(log_n: float) -> float:
        n = math.exp(log_n)
        return predicted_accuracy(math.sqrt(d_eff / (n - 1)), candidates, value_dim, n - 1) - accuracy

    if not 1.0 / candidates < accuracy < 1.0:
        raise ValueError(f"accuracy must lie in (1/C, 1), got {accuracy}")
    lo, hi = math.log(2.0), math.log(1e9 * d_eff)
    if gap(lo) < 0:
        return 2.0
    return math.exp(optimize.brentq(gap, lo, hi, xtol=1e-4))


# --------------------------------------------------------------------------------------------
# The delta rule with beta = 1 and random unit keys (module docstring, section 4).


def delta_signal_sq(d: int, m):
    """s(m) = E (k^T P_1 ... P_m k)^2 for a unit key k and m projections P = I - k' k'^T off
    independent random unit keys k' in R^d: (1 - 1/d) alpha^m + gamma^m / d."""
    m = np.asarray(m, dtype=np.float64)
    gamma = 1.0 - 1.0 / d
    alpha = 1.0 - 2.0 * (d + 1) / (d * (d + 2))
    return (1.0 - 1.0 / d) * alpha**m + gamma**m / d


def delta_read_energy(d: int, weights):
    """Expected (signal^2, crosstalk^2) of reading every stored key of a delta-rule state.

    N unit keys uniform on the sphere in R^d written with beta = 1, unit values, state read
    after the last write. weights: (..., N) survival weights lam_j (ones: no decay; for a decay
    a_t, lam_j = prod_{s>j} a_s, theory.decay_pair_weights). Returns two (..., N) arrays:
    E a_ii^2 and E sum_{j != i} a_ij^2 (the module docstring's section 4), in O(N).
    """
    lam2 = np.asarray(weights, dtype=np.float64) ** 2
    n = lam2.shape[-1]
    gamma = 1.0 - 1.0 / d
    later_count = np.arange(n - 1, -1, -1, dtype=np.float64)  # m_i = N - 1 - i
    s_m = delta_signal_sq(d, later_count)
    # later_i = (1/d) sum_{j > i} lam_j^2 gamma^(N-1-j): suffix sums, every term <= 1
    fresh = lam2 * gamma**later_count
    later = (np.cumsum(fresh[..., ::-1], axis=-1)[..., ::-1] - fresh) / d
    # older_i = sum_{j < i} lam_j^2 gamma^(i-1-j): the recursion E_{i+1} = gamma E_i + lam_i^2
    run = signal.lfilter([1.0], [1.0, -gamma], lam2, axis=-1)  # sum_{j <= i} lam_j^2 gamma^(i-j)
    older = np.concatenate([np.zeros_like(run[..., :1]), run[..., :-1]], axis=-1)
    earlier = older * (gamma**later_count - s_m) / d
    return lam2 * s_m, later + earlier


def delta_read_energy_at(d: float, earlier, later, log_decay: float = 0.0):
    """`delta_read_energy` of one read, in closed form, for a constant decay per write.

    The target has `earlier` writes before it and `later` after it (arrays broadcast; the read
    is after the last write), every write decayed by exp(log_decay) per later write. Returns
    (E a_ii^2, E sum_{j != i} a_ij^2): section 4's sums are geometric in r = exp(2 log_decay)
    gamma. d and the counts may be non-integers (d is then an effective key dimension).
    """
    d = float(d)
    t = np.asarray(earlier, dtype=np.float64)
    m = np.asarray(later, dtype=np.float64)
    gamma = 1.0 - 1.0 / d
    s_m = delta_signal_sq(d, m)
    lam2 = math.exp(2.0 * log_decay)
    r = lam2 * gamma

    def geometric(n):  # sum_{u < n} r^u
        return n if r == 1.0 else -np.expm1(n * math.log(r)) / (1.0 - r)

    later_x = geometric(m) / d  # sum_{j > i} lam_j^2 gamma^(N-1-j) / d
    older = lam2 ** (m + 1) * geometric(t)  # sum_{j < i} lam_j^2 gamma^(i-1-j)
    return lam2**m * s_m, later_x + older * (gamma**m - s_m) / d


# --------------------------------------------------------------------------------------------
# Recall against context length: N fixed, T growing.


def _gap_bins(space: int, power_a: float, bins: int = 48) -> tuple[np.ndarray, np.ndarray]:
    """(offset s, probability) of a query's gap after the pairs, p(s) ∝ (s + 1)^(power_a - 1)
    over s in [0, space) (the recall task's law), in at most `bins` log-spaced bins, each
    represented by its probability-weighted mean offset."""
    edges = np.unique(np.round(np.geomspace(1, space + 1, bins + 1)).astype(np.int64)) - 1  # 0 .. space
    edges[-1] = space
    s = np.arange(space, dtype=np.float64)
    p = (s + 1.0) ** (power_a - 1.0)
    p /= p.sum()
    cum, first = np.concatenate([[0.0], np.cumsum(p)]), np.concatenate([[0.0], np.cumsum(p * s)])
    lo, hi = edges[:-1], edges[1:]
    keep = hi > lo
    lo, hi = lo[keep], hi[keep]
    mass = cum[hi] - cum[lo]
    return (first[hi] - first[lo]) / mass, mass


def length_reads(seq_len: int, num_pairs: int, *, log_decay: float = 0.0, distractor_rate: float = 0.0,
                 num_queries: int | None = None, power_a: float = 0.01) -> tuple[np.ndarray, np.ndarray]:
    """N_eff of the reads of the recall task at one length, and each read's probability.

    The layout is the recall task's (harness.tasks.recall): N pairs at positions 0 .. 2N - 1
    (pair j's write at 2j + 1), then Q queries at gaps s ~ (s + 1)^(power_a - 1) after them. A
    read at i = 2N + s of pair t competes with every other write before i, each weighted by
    its survival relative to the target's, exp(log_decay (t - w)) for a constant per-step
    decay (older writes fade, newer ones are louder than the target):

        N_eff(i, t) = sum_{w != t, w < i} rate_w exp(2 log_decay (t - w))

    over the writes w: the other N - 1 pairs (rate 1), the distractors (rate = distractor_rate
    at every position after the pairs: task.filler=random draws a random token there, a write
    of a random key) and the other queries (each a write too; Q p(w - 2N) at position w). The
    zero filler is not counted: it writes one and the same pair every time, which a trained
    state can keep out of every key's way. log_decay = 0 is the additive state (linear, elu,
    favor, taylor): N_eff then grows with T only through the distractors and the queries.

    Returns (n_eff, probability), flat arrays over (gap bin, target pair); probabilities sum to 1.
    """
    n = int(num_pairs)
    q = n if num_queries is None else int(num_queries)
    space = int(seq_len) - 2 * n
    if space < 1:
        raise ValueError(f"seq_len={seq_len} leaves no room for queries after {n} pairs")
    gaps, prob = _gap_bins(space, power_a)
    s_all = np.arange(space, dtype=np.float64)
    density = (s_all + 1.0) ** (power_a - 1.0)
    density *= min(q, space) / density.sum()  # expected queries at each offset
    lam = float(log_decay)
    targets = 2.0 * np.arange(n) + 1.0  # (N,) write positions of the pairs
    out = np.empty((gaps.size, n))
    for g, s in enumerate(gaps):
        before = s_all < s  # positions after the pairs that come before the read
        w_after = 2 * n + s_all[before]  # (P,)
        rate = distractor_rate + density[before]
        # log of each write's squared weight relative to the target t: 2 lam (t - w)
        pair_log = 2 * lam * (targets[:, None] - targets[None, :])  # (N, N)
        np.fill_diagonal(pair_log, -np.inf)
        after_log = 2 * lam * (targets[:, None] - w_after[None, :]) + np.log(np.maximum(rate, 1e-300))[None, :]
        both = np.concatenate([pair_log, after_log], axis=1) if w_after.size else pair_log
        with np.errstate(over="ignore"):
            out[g] = np.exp(special.logsumexp(both, axis=1))  # (N,); 0 for one pair and nothing after it
    return out.ravel(), np.repeat(prob / n, n)


def predicted_length_accuracy(seq_lens, num_pairs: int, d_key: float, value_dim: int, candidates: int, *,
                              log_decay: float = 0.0, distractor_rate: float = 0.0,
                              num_queries: int | None = None, power_a: float = 0.01) -> np.ndarray:
    """Predicted recall accuracy of the recall task at each length in `seq_lens` (N fixed):
    the mean over the task's reads (`length_reads`) of the top-1 accuracy at
    SNR = sqrt(d_key / N_eff) (`predicted_accuracy`, P = N_eff crosstalk pairs per read).

    A read whose target has faded away (N_eff overflowing) scores chance, 1/C. Reads are
    grouped by N_eff on a log grid (20 a decade), so a curve costs a few integrations."""
    out = []
    for t in np.atleast_1d(seq_lens):
        n_eff, prob = length_reads(int(t), num_pairs, log_decay=log_decay, distractor_rate=distractor_rate,
                                   num_queries=num_queries, power_a=power_a)
        finite = np.isfinite(n_eff) & (n_eff < 1e12)
        acc = np.full(n_eff.shape, 1.0 / candidates)
        acc[finite & (n_eff <= 0)] = 1.0
        live = finite & (n_eff > 0)
        if live.any():
            grid = np.round(np.log10(n_eff[live]) * 20) / 20
            for level in np.unique(grid):
                sel = np.zeros_like(live)
                sel[np.flatnonzero(live)[grid == level]] = True
                pairs = 10.0 ** level
                acc[sel] = predicted_accuracy(math.sqrt(d_key / pairs), candidates, value_dim, max(pairs, 1.0))
        out.append(float((acc * prob).sum()))
    return np.asarray(out)
