"""The untrained probe: random pairs written into each mixer's memory, read back, laid against theory.

For each (model, d, N): N random keys and values are written into the mixer's state, stored
keys are read back, and the read-out is split into signal and crosstalk exactly as
`harness.measure.theory` describes; no N x N matrix is ever built.

What is written.
  keys     uniform on the sphere of radius sqrt(d) (unit-variance coordinates);
  values   drawn uniformly from a codebook of C unit vectors in R^d_v (d_v = d by default),
           centred (mean exactly 0) so that crosstalk comes from the weights, not from a
           shared value mean;
  queries  the stored keys themselves: all N of them through the state; for softmax, whose
           read-out costs O(N) per query, at most `max_queries` of them per state, chosen at
           random without replacement. Small N pools independent states (fresh keys and
           values, same codebook) until a row has at least `min_queries` reads.

How each mixer reads (a_ij are the effective weights, o_i = sum_j a_ij v_j).
  linear   identity feature map, read out *unnormalised*: o_i = S^T q_i, S = sum_j k_j v_j^T,
           a_ij = q_i.k_j. This is the plain linear associative memory that the law
           sqrt(d/N) describes. The normalised form divides every a_ij of row i by
           den_i = q_i.z: the per-read SNR is unchanged (signal and noise scale alike), but for
           random keys den_i ~ d + N(0, N d) crosses zero once N > d, and a ratio of means
           over reads would be dominated by the reads with den_i ~ 0.
  elu      phi = elu(x) + 1 on the raw keys; normalised: a_ij = phi(q_i).phi(k_j) / phi(q_i).z.
  favor    FAVOR+ (harness.features, m features, seeded) on k / d^(1/4), so that
           phi(q).phi(k) estimates softmax's exp(q.k / sqrt(d)); normalised; queries use the
           query form of the map (a per-row stabiliser that cancels in a_ij).
  taylor   [1, x, x(x)x/sqrt2] on k / d^(1/4) (m = 1 + d + d^2), normalised; only on request
           (its class declares probe_on_request): its features are large, so reads go in
           smaller chunks.
  softmax  a_ij = softmax_j(q_i.k_j / sqrt(d)), streamed over chunks of keys with a running
           log-sum-exp (flash-attention style).
  dpfp     DPFP (rolled relu(+-x) products, m = 2 d nu, nu = model.options.dpfp_nu) on the raw keys;
           normalised; its kernel dimension is theory.dpfp_effective_dim.
  retnet   identity keys, constant decay gamma_h = 1 - 2^(-5-h) of one of the layer's decay
           heads (model.n_heads x model.options.retnet_heads of them; the pooled states take turns, from
           a head drawn per row), no denominator: S = sum_j gamma^(N-1-j) k_j v_j^T, read after
           the last write.
  mamba    Mamba-2's SSD core with a scalar decay per head: S_t = exp(dt_t A) S_{t-1} +
           k_t (dt_t v_t)^T, A = -uniform(1, 16) drawn once per seed, dt_t log-uniform in
           [1e-3, 1e-1] per token (Mamba-2's initial distributions, the input dependence of dt
           stood in for by an independent draw per token); no denominator.
  deltanet the delta rule with beta = 1 on unit keys (k / |k|): S_t = (I - k_t k_t^T) S_{t-1} +
           k_t v_t^T, written in order through ops.delta_attention (chunk form) and read after
           the last write; a_ii from the same op run backwards over the keys (_read_delta).
  gated_deltanet  the same with Mamba-2's scalar decay in front of S_{t-1} (the draws of mamba,
           writes not scaled by dt). With model.options.rule=additive both are read as additive
           states of unit keys (the linear memory, decayed for gated_deltanet): the control.
  swa      softmax over the last W = 32 stored keys only (the default window): a pair written
           earlier has left the KV cache, its read has signal 0.

What is measured (per read i, target i).
  signal_i = a_ii v_i, noise_i = o_i - signal_i.
  snr_measured = sqrt(sum_i |signal_i|^2 / sum_i |noise_i|^2) over every read of the row (a
    ratio of means, the same aggregate as harness.measure.trained uses on trained models).
  acc_measured = fraction of reads whose read-out scores highest (dot product) on the target's
    codebook entry among all C.

What is predicted (harness.measure.theory).
  snr_predicted = sqrt(d_eff / n_eff): d_eff = the state's key dimension (d for linear, elu,
    retnet, mamba; m for favor; 1 + d + d^2 for taylor; d for softmax, which has no finite
    state: the linear-memory reference it is compared against); n_eff = the aggregate
    crosstalk count, N - 1 for every mixer here (see theory.aggregate_pairs: decay moves signal
    between reads but leaves the ratio of means unchanged).
  acc_predicted = mean over reads of theory.predicted_accuracy(SNR_i), SNR_i = the law for read
    i: sqrt(d_eff / N_eff(i)) with N_eff(i) = sum_{j != i} (lambda_j / lambda_i)^2 for decayed
    states (lambda = survival weights), N - 1 otherwise.
  d_kernel, snr_kernel, acc_kernel = the same with d_eff replaced by the kernel's effective
    dimension (theory.kernel_effective_dim): what positive features and softmax actually give.
    NaN for favor. For the delta rule these columns are the additive state's law at the same d
    (and decay): what the correction is compared against.
  For the delta rule (deltanet, gated_deltanet) snr_predicted and acc_predicted come from its own
    law, theory.delta_read_energy: per read, SNR_i^2 = E a_ii^2 / E sum_{j != i} a_ij^2 (exact
    expectations for random unit keys), aggregated as a ratio of sums; n_eff is the additive
    count with the same SNR (d / SNR^2) and n_state the signal energy the state holds,
    sum_i E a_ii^2 (about d / 2 once N >> d).
  acc_from_snr = mean of predicted_accuracy(measured SNR_i): the accuracy model applied to each
    read's measured signal and noise, which checks the noise model on any mixer.
  n_state = theory.state_pairs: decay-weighted pairs held at full weight (N without decay).
  pairs = P, the median over reads of theory.read_participation: how many equal pairs the
    crosstalk behind a read amounts to (N - 1 without decay), an input of the accuracy model.
  Also: value_dim, candidates, queries (reads), states (pooled), log_decay_mean (mean log a_t;
    NaN without decay), seed, time_s.

What it shows (default grid, seed 0).
  linear   SNR = sqrt(d/N) within ~1%, accuracy as predicted within ~0.02: near 1 until
           N ~ d^2 / (2 ln C), far past N = d.
  elu      every weight shares a positive mean: the crosstalk does not cancel in the weights,
           d_kernel ~ 2.1, so SNR ~ sqrt(2.1/N) for every d (4-8x below the identity map at
           d = 32-128, and no better at larger d); recall near chance from N ~ 64 on.
  favor    at softmax temperature the estimated kernel is sharp, so the aggregate SNR stays
           near sqrt(m/N), but the per-read crosstalk is heavy-tailed (a few keys whose random
           features happen to align dominate): accuracy is far below what that SNR predicts,
           and below the identity map's at the same N.
  softmax  SNR ~ exp(sqrt(d) - 1) / sqrt(N), as the kernel predicts; recall 1.0 throughout.
  retnet / mamba  the aggregate SNR keeps the undecayed law (decay moves signal between reads);
           accuracy falls to about the recently written pairs / N, as the per-read law predicts.
  deltanet SNR as theory.delta_read_energy predicts within ~1% at every N; above the additive
           law for N < d (d = 128, N = 64: 1.65 against 1.42), equal at N = d, below it past it, where
           old pairs are overwritten (signal ~ e^{-m/d} after m later writes) and top-1 recall
           keeps only about the last d pairs (d = 128, N = 512: 0.31 against the additive
           state's 0.97). The accuracy model runs 0.01-0.03 high at N <= d (it takes the
           crosstalk as Gaussian over N - 1 pairs; here it comes mostly from the later ones).
"""

from __future__ import annotations

import functools
import inspect
import math
import time
import zlib
from typing import Iterable, Optional

import numpy as np
import torch

from harness import features
from harness.layers import registry
from harness.measure import theory

DEFAULT_DS = (32, 64, 128)
MAX_DEFAULT_N = 16384
DTYPE = torch.float64                  # old writes of a decayed state sit far below float32's eps
FEATURE_BUDGET = 2**22                 # entries of a feature or score block (32 MiB in float64)
STATE_BUDGET = 2**26                   # entries of the states written at once (512 MiB in float64)


def default_models() -> list[str]:
    """The mixers probed when none are named: every built-in with a probe_memory, less those
    whose class asks to be probed on request only (taylor)."""
    classes = {name: registry.resolve(name) for name in registry.builtin_names()}
    return [name for name, cls in classes.items() if hasattr(cls, "probe_memory") and not cls.probe_on_request]


def default_ns(d: int) -> list[int]:
    """Powers of two from d/2 to 64 d, capped at 16384."""
    return [n for n in (2**p for p in range(1, 31)) if d // 2 <= n <= min(64 * d, MAX_DEFAULT_N)]


def default_grid(ds: Iterable[int] = DEFAULT_DS) -> list[tuple[int, int]]:
    """The default (d, N) pairs: every d with its `default_ns`."""
    return [(d, n) for d in ds for n in default_ns(d)]


# --------------------------------------------------------------------------------------------
# Random pairs.


def _generator(seed: int, *parts) -> torch.Generator:
    """A CPU generator per row, stable across runs and devices."""
    key = zlib.crc32(repr((seed,) + parts).encode())
    return torch.Generator().manual_seed(key)


def random_keys(shape: tuple[int, ...], d: int, gen: torch.Generator) -> torch.Tensor:
    """Uniform on the sphere of radius sqrt(d): (..., d)."""
    k = torch.randn(*shape, d, generator=gen, dtype=DTYPE)
    return k * (math.sqrt(d) / k.norm(dim=-1, keepdim=True))


@functools.lru_cache(maxsize=16)
def codebook(candidates: int, value_dim: int, seed: int = 0) -> torch.Tensor:
    """C unit vectors in R^d_v with mean 0, shared by every model of a (seed, C, d_v): (C, d_v).

    Centring and normalising alternate until the mean is below 1e-9: a shared value mean
    would add crosstalk that positive weights never cancel, (sum_j a_ij)^2 |mean|^2, an
    artefact of the codebook rather than of the mixer.
    """
    u = torch.randn(candidates, value_dim, generator=_generator(seed, "codebook", candidates, value_dim), dtype=DTYPE)
    for _ in range(100):
        u = u - u.mean(0, keepdim=True)
        u = u / u.norm(dim=-1, keepdim=True)
        if u.mean(0).norm() < 1e-9:
            break
    return u


# --------------------------------------------------------------------------------------------
# Read-outs. Each returns per-read |signal|^2, |noise|^2 and whether the top-1 is correct.


def _score(readout: torch.Tensor, book: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Top-1 against the codebook: (B, R, d_v), (C, d_v), (B, R) -> (B, R) bool, R in slices."""
    B, R, _ = readout.shape
    step = max(1, FEATURE_BUDGET // (B * book.shape[0]))  # bounds the (B, step, C) scores
    return torch.cat([(readout[:, s : s + step] @ book.T).argmax(-1) == target[:, s : s + step]
                      for s in range(0, R, step)], dim=1)


def _read_through_state(phi_k, phi_q, lam, keys, V, book, idx, *, normalize: bool, chunk: int):
    """Kernel / decay mixers: write S = sum_j lam_j phi(k_j) v_j^T, read every stored key.

    phi_k, phi_q: callables (B, c, d) -> (B, c, m) applied chunk by chunk (the Taylor map's
    m = 1 + d + d^2 makes whole-sequence features large); lam: (B, N) survival weights.
    Nothing larger than (B, chunk, max(m, C)) is ever formed.
    """
    B, N, _ = keys.shape
    chunks = [slice(s, s + chunk) for s in range(0, N, chunk)]  # chunk = reads (and writes) per step
    S, z = 0.0, 0.0
    for sl in chunks:  # write
        fk = phi_k(keys[:, sl]) * lam[:, sl, None]  # (B, c, m)
        S = S + fk.transpose(1, 2) @ V[:, sl]  # (B, m, d_v)
        if normalize:
            z = z + fk.sum(1)  # (B, m)
    sig2, noise2, correct = [], [], []
    for sl in chunks:  # read: the stored keys themselves are the queries
        fq = phi_q(keys[:, sl])  # (B, c, m)
        o = fq @ S  # (B, c, d_v)
        self_w = torch.einsum("bcm,bcm->bc", fq, phi_k(keys[:, sl])) * lam[:, sl]  # a_ii before normalising
        if normalize:
            den = (fq @ z[..., None])[..., 0]  # (B, c), > 0 for positive features
            if not torch.isfinite(den).all() or (den <= 0).any():
                raise FloatingPointError("non-positive or non-finite denominator in a normalised read-out")
            o, self_w = o / den[..., None], self_w / den
        noise = o - self_w[..., None] * V[:, sl]  # (B, c, d_v)
        sig2.append(self_w.square())  # |a_ii v_i|^2, unit values
        noise2.append(noise.square().sum(-1))
        correct.append(_score(o, book, idx[:, sl]))
    return torch.cat(sig2, 1), torch.cat(noise2, 1), torch.cat(correct, 1)


def _read_delta(phi_k, log_a, keys, V, book, idx, *, chunk: int):
    """The delta rule with beta = 1: write every pair in order (ops.delta_attention, chunk form),
    read every stored key from the final state.

    The signal weight a_ii = lam_i k_i^T P_{i+1} ... P_N k_i (P_t = I - k_t k_t^T; theory,
    section 4) comes from the same op run backwards over the keys with S_0 = I and nothing
    written: after the keys k_N, ..., k_{i+1} its state is P_{i+1} ... P_N, and its read-out
    for the query k_i is P_N ... P_{i+1} k_i. Two O(N d (d + d_v)) passes; no N x N matrix.
    """
    from harness import ops

    B, N, d = keys.shape
    k = phi_k(keys)  # (B, N, d), unit rows
    beta = torch.ones(B, 1, N, dtype=DTYPE, device=keys.device)
    ld = None if log_a is None else log_a[:, None]  # (B, 1, N)
    _, S = ops.delta_attention(k[:, None], k[:, None], V[:, None], beta, ld, return_state=True)  # (B, 1, d, d_v)
    rev = k.flip(1)  # rev[t] = k_{N-1-t}
    ask = torch.cat([rev[:, 1:], torch.zeros_like(rev[:, :1])], dim=1)  # at t: k_{N-2-t}, the key written before
    eye = torch.eye(d, dtype=DTYPE, device=keys.device).expand(B, 1, d, d)
    back = ops.delta_attention(ask[:, None], rev[:, None], torch.zeros_like(rev[:, None]), beta, None,
                               initial_state=eye)[:, 0]  # (B, N, d): at t = N-2-i, P_N ... P_{i+1} k_i
    kept = (back * ask).sum(-1)[:, : N - 1].flip(1)  # (B, N-1): i = 0 .. N-2
    self_w = torch.cat([kept, k[:, -1:].square().sum(-1)], dim=1)  # the newest pair: |k_N|^2
    if log_a is not None:
        self_w = self_w * torch.from_numpy(theory.decay_pair_weights(log_a.cpu().numpy())).to(keys.device)
    sig2, noise2, correct = [], [], []
    S = S[:, 0]
    for s in range(0, N, chunk):
        o = k[:, s : s + chunk] @ S  # (B, c, d_v)
        noise = o - self_w[:, s : s + chunk, None] * V[:, s : s + chunk]
        sig2.append(self_w[:, s : s + chunk].square())
        noise2.append(noise.square().sum(-1))
        correct.append(_score(o, book, idx[:, s : s + chunk]))
    return torch.cat(sig2, 1), torch.cat(noise2, 1), torch.cat(correct, 1)


def _read_softmax(keys, V, q_idx, book, idx, *, chunk: int, window: Optional[int] = None):
    """Softmax over all N keys (the last `window` of them if set) for the reads q_idx (B, Q),
    keys streamed in chunks. A read whose key has left the window has signal 0."""
    B, N, d = keys.shape
    first = 0 if window is None else max(0, N - window)  # the oldest key still held
    scale = 1.0 / math.sqrt(d)
    take = lambda x: torch.gather(x, 1, q_idx[..., None].expand(-1, -1, x.shape[-1]))  # noqa: E731
    q = take(keys)  # (B, Q, d)
    m = torch.full(q.shape[:2], -math.inf, dtype=DTYPE, device=keys.device)  # running max
    l = torch.zeros_like(m)  # running sum of exp
    acc = torch.zeros(B, q.shape[1], V.shape[-1], dtype=DTYPE, device=keys.device)  # (B, Q, d_v)
    for s in range(first, N, chunk):
        logits = (q @ keys[:, s : s + chunk].transpose(1, 2)) * scale  # (B, Q, c)
        m_new = torch.maximum(m, logits.amax(-1))
        p = torch.exp(logits - m_new[..., None])
        corr = torch.exp(m - m_new)
        l = l * corr + p.sum(-1)
        acc = acc * corr[..., None] + p @ V[:, s : s + chunk]
        m = m_new
    o = acc / l[..., None]
    self_w = torch.exp((q * q).sum(-1) * scale - m) / l  # (B, Q)
    self_w = torch.where(q_idx >= first, self_w, torch.zeros_like(self_w))
    noise = o - self_w[..., None] * take(V)  # (B, Q, d_v)
    correct = _score(o, book, torch.gather(idx, 1, q_idx))
    return self_w.square(), noise.square().sum(-1), correct


# --------------------------------------------------------------------------------------------
# One row.


def probe_class(model: str) -> type:
    """The mixer class `model` names (a built-in name or a dotted path) if it declares
    `probe_memory`; ValueError (one line) otherwise."""
    cls = registry.resolve(model)
    if getattr(cls, "probe_memory", None) is None:
        raise ValueError(f"probe: model {model!r} declares no probe_memory(d, seed) "
                         "(harness.layers.protocol), so the probe cannot write random pairs into it")
    return cls


def _memory(model: str, d: int, seed: int, options: tuple = ()):
    """The mixer's ProbeMemory, drawn once per (model, d, seed, options) and shared by every N,
    as a layer's FAVOR+ features are fixed between redraws. options: (name, value) pairs of
    model.options, passed where probe_memory names them."""
    return _memory_cached(model, d, seed, tuple(sorted(options)))


@functools.lru_cache(maxsize=32)
def _memory_cached(model: str, d: int, seed: int, options: tuple):
    fn = probe_class(model).probe_memory
    named = inspect.signature(fn).parameters
    return fn(d, seed, **{k: v for k, v in options if k in named})


_memory.cache_clear = _memory_cached.cache_clear


def state_group(states: int, m: int, d_v: int) -> int:
    """How many of the probe's independent states are written and read at once: as many as fit
    STATE_BUDGET entries (S and z), at least one."""
    return max(1, min(states, STATE_BUDGET // (m * (d_v + 1))))


def probe_row_bytes(model: str, d: int, n: int, *, candidates: int = 1024, max_queries: int = 1024,
                    min_queries: int = 1024, value_dim: Optional[int] = None, chunk: int = 4096) -> int:
    """Peak bytes of `probe_row` with these arguments, from the sizes alone (nothing is drawn):
    what it holds for the whole row (keys twice while they are normalised, values, indices,
    survival weights and the decay draws, the codebook) plus the largest block a read-out forms
    (bounded by FEATURE_BUDGET and `chunk`), the state and the map's own draw."""
    cls = probe_class(model)
    d_v, item = value_dim or d, DTYPE.itemsize
    softmax = getattr(cls, "core", None) == "softmax"
    m = d if softmax else getattr(cls, "key_width", lambda w, c=None: w)(d)
    reads = min(n, max_queries) if softmax else n
    states = max(1, math.ceil(min_queries / reads))
    rows = states * n
    held = item * rows * (2 * d + d_v + 8) + 2 * item * candidates * d_v  # keys x2, V, idx/lam/decays; book
    if softmax:
        q = states * reads
        step = min(chunk, n)
        work = item * (q * (d + 2 * d_v) + 4 * q * step + q * candidates)
    else:
        group = state_group(states, m, d_v)
        step = max(1, min(chunk, n, FEATURE_BUDGET // (group * m)))
        block = group * step * max(m, d_v)
        work = item * (3 * group * m * (d_v + 1) + 4 * block) + 4 * FEATURE_BUDGET  # S, S + dS, dS
    draw = features.draw_bytes(getattr(cls, "feature", ""), d) if getattr(cls, "feature", None) else 0
    return int(held + work + draw)


def check_probe(models: list[str], ds: list[int], ns: Optional[list[int]], *, device: str = "cpu",
                **row_args) -> None:
    """ResourceError (one line) for the first (model, d, N) of the grid the device cannot hold,
    before anything is drawn: `probe: d=100000, N=70000 needs about 112 GiB; this machine has ...`."""
    from harness.devices import check_fits

    for model in models:
        for d in ds:
            for n in (ns or default_ns(d)):
                check_fits(f"probe: model={model}, d={d}, N={n}",
                           probe_row_bytes(model, d, n, **row_args), device)


def _survival(memory, states: int, n: int, gen: torch.Generator) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The survival weight of each write at the read (B, N), and the memory's log decays (None
    for a memory without decay)."""
    if memory.decay is None:
        return torch.ones(states, n, dtype=DTYPE), None
    log_a, scale = memory.decay((states, n), gen)
    return torch.from_numpy(theory.decay_pair_weights(log_a.numpy(), None if scale is None else scale.numpy())), log_a


def _read_additive(memory, lam, keys, V, book, idx, d_v: int, chunk: int):
    """(signal^2, crosstalk^2, correct) of every read through an additive state. States in groups:
    the Taylor map's m = 1 + d + d^2 makes 64 states of m x d_v too large at d = 256 (each read
    only needs its own state)."""
    states = keys.shape[0]
    group = state_group(states, memory.d_key, d_v)
    step = max(1, min(chunk, FEATURE_BUDGET // (group * memory.d_key)))  # bounds (B, step, m) for taylor
    parts = [_read_through_state(memory.phi_k, memory.phi_q, lam[g : g + group], keys[g : g + group],
                                 V[g : g + group], book, idx[g : g + group], normalize=memory.normalize, chunk=step)
             for g in range(0, states, group)]
    return tuple(torch.cat(t, 0) for t in zip(*parts))


def probe_row(model: str, d: int, n: int, *, seed: int = 0, candidates: int = 1024, max_queries: int = 1024,
              min_queries: int = 1024, value_dim: Optional[int] = None, chunk: int = 4096,
              device: str = "cpu", options: Optional[dict] = None) -> dict:
    """Measure and predict one (model, d, N); see the module docstring for every column."""
    cls = probe_class(model)
    if d < 2 or n < 2 or candidates < 2:
        raise ValueError(f"need d >= 2, n >= 2 and candidates >= 2, got d={d}, n={n}, candidates={candidates}")
    started = time.time()
    d_v = value_dim or d
    memory = _memory(model, d, seed, tuple((options or {}).items()))
    reads_per_state = min(n, max_queries) if memory.read == "softmax" else n
    states = max(1, math.ceil(min_queries / reads_per_state))
    gen = _generator(seed, model, d, n, candidates, d_v)
    book = codebook(candidates, d_v, seed)  # (C, d_v)
    keys = random_keys((states, n), d, gen)  # (B, N, d)
    idx = torch.randint(candidates, (states, n), generator=gen)  # (B, N)
    V = book[idx]  # (B, N, d_v)
    lam, log_a = _survival(memory, states, n, gen)
    log_decay_mean = float(log_a.mean()) if log_a is not None else math.nan

    dev = torch.device(device)
    keys, V, idx, book, lam = (t.to(dev) for t in (keys, V, idx, book, lam))
    law = None  # expected (signal^2, crosstalk^2) per read where the additive law does not hold
    if memory.read == "softmax":
        q_idx = torch.stack([torch.randperm(n, generator=gen)[:reads_per_state] for _ in range(states)]).to(dev)
        sig2, noise2, correct = _read_softmax(keys, V, q_idx, book, idx, chunk=chunk, window=memory.window)
        d_eff = d
        lam_read = torch.ones(states, n, dtype=DTYPE)  # the pairs the memory holds, at full weight
        if memory.window is not None:
            lam_read[:, : max(0, n - memory.window)] = 0.0  # a window holds only the last W pairs
        held = torch.gather(lam_read, 1, q_idx.cpu()).numpy() > 0  # (B, Q): the read's pair is still there
        read_pairs = np.where(held, lam_read.sum(-1, keepdim=True).numpy() - 1.0, np.inf)
    elif memory.read == "delta":
        d_eff = memory.d_key
        sig2, noise2, correct = _read_delta(memory.phi_k, None if log_a is None else log_a.to(dev), keys, V, book,
                                            idx, chunk=chunk)
        lam_read = lam.cpu()
        read_pairs = theory.crosstalk_pairs(lam_read.numpy())  # the additive state's, for the *_kernel columns
        law = theory.delta_read_energy(d_eff, lam_read.numpy())
    else:
        d_eff = memory.d_key
        sig2, noise2, correct = _read_additive(memory, lam, keys, V, book, idx, d_v, chunk)
        lam_read = lam.cpu()
        read_pairs = theory.crosstalk_pairs(lam_read.numpy())  # (B, N): N_eff of each read

    sig2, noise2, correct = (t.double().cpu().numpy() for t in (sig2, noise2, correct))
    queries = int(sig2.size)
    lam_np = lam_read.numpy()
    n_eff = float(np.mean(theory.aggregate_pairs(lam_np)))
    pairs = float(np.median(theory.read_participation(lam_np)))  # P: crosstalk pairs behind a read
    kernel = getattr(memory, "kernel", None) or cls.kernel
    d_kernel = theory.kernel_effective_dim(kernel, d) if kernel else math.nan
    snr_kernel = theory.predicted_snr(d_kernel, n_eff) if not math.isnan(d_kernel) else math.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        snr_read = np.sqrt(sig2 / noise2)
        law_read = np.sqrt(d_eff / read_pairs)
        kernel_read = np.sqrt(d_kernel / read_pairs)
        snr_predicted = theory.predicted_snr(d_eff, n_eff)
        n_state = float(np.mean(theory.state_pairs(lam_np)))
        if law is not None:  # the delta rule: its own law; the *_kernel columns keep the additive one
            law_read = np.sqrt(law[0] / law[1])
            snr_predicted = math.sqrt(law[0].sum() / law[1].sum())
            n_eff = d_eff / snr_predicted**2  # the additive count with the same SNR
            n_state = float(np.mean(law[0].sum(-1)))  # signal energy held: pairs at full weight

    def acc(snr: np.ndarray, dof=None) -> float:
        return float(np.mean(theory.predicted_accuracy(snr.ravel(), candidates, d_v, pairs, dof=dof)))

    return {
        "model": model, "d": d, "n": n, "value_dim": d_v, "candidates": candidates,
        "d_eff": int(d_eff), "n_eff": n_eff, "d_kernel": d_kernel,
        "snr_measured": math.sqrt(sig2.sum() / noise2.sum()), "snr_predicted": snr_predicted,
        "snr_kernel": snr_kernel, "acc_measured": float(correct.mean()),
        "acc_predicted": acc(law_read),
        "acc_kernel": acc(kernel_read) if not math.isnan(d_kernel) else math.nan,
        "acc_from_snr": acc(snr_read, dof=math.inf),
        "n_state": n_state, "pairs": pairs, "log_decay_mean": log_decay_mean,
        "queries": queries, "states": states, "seed": seed, "time_s": time.time() - started,
    }


def run_probe(models: Optional[list[str]] = None, ds: Optional[list[int]] = None, ns: Optional[list[int]] = None, *,
              seed: int = 0, candidates: int = 1024, max_queries: int = 1024, min_queries: int = 1024,
              value_dim: Optional[int] = None, chunk: int = 4096, device: str = "cpu",
              progress: bool = True, options: Optional[dict] = None) -> list[dict]:
    """The probe over models x ds x ns: one dict per (model, d, N), in that order.

    models: default default_models() (taylor on request); ds: default (32, 64, 128); ns: default
    `default_ns(d)` for each d (powers of two from d/2 to 64 d, capped at 16384). N up to 65,536
    is supported. candidates: C, the codebook size; max_queries: reads per state for softmax;
    min_queries: small N pools states up to this many reads; value_dim: d_v (default d);
    chunk: keys (softmax) or reads (state mixers) per step, the memory knob.
    """
    models = list(models or default_models())
    for m in models:
        probe_class(m)
    grid = [(d, n) for d in (ds or DEFAULT_DS) for n in (ns or default_ns(d))]
    jobs = [(m, d, n) for m in models for d, n in grid]
    from tqdm.auto import tqdm

    rows = []
    bar = tqdm(jobs, desc="probe", disable=not progress, unit="row")
    for model, d, n in bar:
        bar.set_postfix_str(f"{model} d={d} N={n}")
        rows.append(probe_row(model, d, n, seed=seed, candidates=candidates, max_queries=max_queries,
                              min_queries=min_queries, value_dim=value_dim, chunk=chunk, device=device,
                              options=options))
    return rows
