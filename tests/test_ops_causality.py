"""Causality: changing tokens after position t changes no output at or before t.

Checked for every family, every form and every feature map (FAVOR+ with its query
stabiliser included), at a cut inside a chunk and at a chunk boundary.
"""

import itertools

import pytest
import torch

from harness import features, ops

FORMS = ("parallel", "recurrent", "chunk")
F64 = torch.float64
T, D, DV, CHUNK = 50, 6, 3, 16
CUTS = (20, CHUNK * 2 - 1)  # inside a chunk; the last position of a chunk


def pair(seed, shape):
    """The same tensor twice, the second with every position after the cut redrawn."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(shape, generator=g, dtype=F64)
    return a, torch.randn(shape, generator=g, dtype=F64) * 3


def perturb(a, b, cut):
    out = a.clone()
    out[:, :, cut + 1:] = b[:, :, cut + 1:]
    return out


def assert_prefix_equal(x, y, cut):
    torch.testing.assert_close(x[:, :, : cut + 1], y[:, :, : cut + 1], rtol=0, atol=1e-12)
    assert not torch.allclose(x[:, :, cut + 1:], y[:, :, cut + 1:])  # the change did reach the future


@pytest.mark.parametrize("name,form,exclusive,cut",
                         list(itertools.product(features.NAMES, FORMS, (False, True), CUTS)))
def test_linear_attention_is_causal(name, form, exclusive, cut):
    phi = features.feature_map(name, D, seed=1)
    xq, xq2 = pair(1, (1, 2, T, D))
    xk, xk2 = pair(2, (1, 2, T, D))
    v, v2 = pair(3, (1, 2, T, DV))
    scale = 0.5 if name in ("favor", "taylor") else 1.0

    def run(a, b, c):
        q, k = phi(a * scale, is_query=True), phi(b * scale)
        if name == "identity":  # signed features: use the unnormalised read-out
            return ops.linear_attention(q, k, c, form=form, exclusive=exclusive, normalize=False, chunk_size=CHUNK)
        return ops.linear_attention(q, k, c, form=form, exclusive=exclusive, chunk_size=CHUNK)

    assert_prefix_equal(run(xq, xk, v), run(perturb(xq, xq2, cut), perturb(xk, xk2, cut), perturb(v, v2, cut)), cut)


@pytest.mark.parametrize("name", features.NAMES)
def test_feature_maps_act_per_position(name):
    phi = features.feature_map(name, D, seed=2)
    x, x2 = pair(4, (1, 2, T, D))
    for is_query in (False, True):
        assert_prefix_equal(phi(x, is_query=is_query), phi(perturb(x, x2, 20), is_query=is_query), 20)


@pytest.mark.parametrize("kind,form,cut", list(itertools.product(("scalar", "per_dim"), FORMS, CUTS)))
def test_decay_attention_is_causal(kind, form, cut):
    q, q2 = pair(5, (1, 2, T, D))
    k, k2 = pair(6, (1, 2, T, D))
    v, v2 = pair(7, (1, 2, T, DV))
    shape = (1, 2, T) if kind == "scalar" else (1, 2, T, D)
    ld, ld2 = (-torch.rand(shape, generator=torch.Generator().manual_seed(s), dtype=F64) for s in (8, 9))
    o = ops.decay_attention(q, k, v, ld, form=form, chunk_size=CHUNK)
    o2 = ops.decay_attention(perturb(q, q2, cut), perturb(k, k2, cut), perturb(v, v2, cut), perturb(ld, ld2, cut),
                             form=form, chunk_size=CHUNK)
    assert_prefix_equal(o, o2, cut)


@pytest.mark.parametrize("gated,form,cut", list(itertools.product((False, True), FORMS, CUTS)))
def test_delta_attention_is_causal(gated, form, cut):
    q, q2 = pair(17, (1, 2, T, D))
    k, k2 = (torch.nn.functional.normalize(x, dim=-1) for x in pair(18, (1, 2, T, D)))
    v, v2 = pair(19, (1, 2, T, DV))
    beta, beta2 = (torch.sigmoid(x) for x in pair(20, (1, 2, T)))
    ld, ld2 = (-torch.rand(1, 2, T, generator=torch.Generator().manual_seed(s), dtype=F64) for s in (21, 22))
    if not gated:
        ld = ld2 = None
    o = ops.delta_attention(q, k, v, beta, ld, form=form, chunk_size=CHUNK)
    o2 = ops.delta_attention(perturb(q, q2, cut), perturb(k, k2, cut), perturb(v, v2, cut), perturb(beta, beta2, cut),
                             None if ld is None else perturb(ld, ld2, cut), form=form, chunk_size=CHUNK)
    assert_prefix_equal(o, o2, cut)
    w = ops.delta_weights(q, k, beta, ld)
    w2 = ops.delta_weights(perturb(q, q2, cut), perturb(k, k2, cut), perturb(beta, beta2, cut),
                           None if ld is None else perturb(ld, ld2, cut))
    assert_prefix_equal(w, w2, cut)


@pytest.mark.parametrize("cut", CUTS)
def test_softmax_is_causal(cut):
    q, q2 = pair(10, (1, 2, T, D))
    k, k2 = pair(11, (1, 2, T, D))
    v, v2 = pair(12, (1, 2, T, DV))
    qp, kp, vp = perturb(q, q2, cut), perturb(k, k2, cut), perturb(v, v2, cut)
    assert_prefix_equal(ops.softmax_attention(q, k, v), ops.softmax_attention(qp, kp, vp), cut)
    assert_prefix_equal(ops.softmax_weights(q, k), ops.softmax_weights(qp, kp), cut)
    for window in (1, 7, CHUNK):
        assert_prefix_equal(ops.window_attention(q, k, v, window), ops.window_attention(qp, kp, vp, window), cut)
    for window in (7, CHUNK):  # (W = 1 weights are the identity: nothing to change in the future)
        assert_prefix_equal(ops.window_weights(q, k, window), ops.window_weights(qp, kp, window), cut)


def test_weight_rows_are_causal():
    q, q2 = pair(13, (1, 2, T, D))
    k, k2 = pair(14, (1, 2, T, D))
    ld, ld2 = (-torch.rand(1, 2, T, D, generator=torch.Generator().manual_seed(s), dtype=F64) for s in (15, 16))
    qp, kp, ldp = perturb(q, q2, 20), perturb(k, k2, 20), perturb(ld, ld2, 20)
    assert_prefix_equal(ops.decay_weights(q, k, ld), ops.decay_weights(qp, kp, ldp), 20)
    assert_prefix_equal(ops.decay_weights(q, k, ld[..., 0]), ops.decay_weights(qp, kp, ldp[..., 0]), 20)
    assert_prefix_equal(ops.linear_weights(q.exp(), k.exp()), ops.linear_weights(qp.exp(), kp.exp()), 20)
