"""Softmax attention: the fused path, the materialised weights and the KV-cache step."""

import pytest
import torch

from harness import ops

F64 = torch.float64


def inputs(t, *, dtype=F64, seed=0, d=6, dv=4):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, 3, t, d, generator=g, dtype=dtype), torch.randn(2, 3, t, d, generator=g, dtype=dtype),
            torch.randn(2, 3, t, dv, generator=g, dtype=dtype))


@pytest.mark.parametrize("causal", (True, False))
@pytest.mark.parametrize("scale", (None, 0.7))
@pytest.mark.parametrize("t", (1, 17, 64))
def test_matches_naive_with_gradients(t, scale, causal):
    q, k, v = inputs(t, seed=t)
    outs, grads = [], []
    for fn in (ops.softmax_attention, ops.naive_softmax_attention):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        o = fn(*leaves, causal=causal, scale=scale)
        w = torch.randn(o.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
        outs.append(o)
        grads.append(torch.autograd.grad((o * w).sum(), leaves))
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=1e-10)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-9)


def test_default_scale_is_inverse_sqrt_d():
    q, k, v = inputs(20)
    torch.testing.assert_close(ops.softmax_attention(q, k, v), ops.softmax_attention(q, k, v, scale=6 ** -0.5))


def test_float32_matches_float64_reference():
    q, k, v = inputs(150, dtype=torch.float32, seed=3)
    ref = ops.naive_softmax_attention(q.double(), k.double(), v.double())
    o = ops.softmax_attention(q, k, v)
    assert (o.double() - ref).abs().max() <= 1e-5 * ref.abs().max()


@pytest.mark.parametrize("causal", (True, False))
def test_weights_are_the_attention_matrix(causal):
    q, k, v = inputs(25, seed=4)
    w = ops.softmax_weights(q, k, causal=causal)
    assert w.shape == (2, 3, 25, 25)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 25, dtype=F64))
    if causal:
        assert torch.all(torch.triu(w, diagonal=1) == 0)
    torch.testing.assert_close(w @ v, ops.softmax_attention(q, k, v, causal=causal), rtol=0, atol=1e-12)


def test_step_decoding_with_a_kv_cache():
    q, k, v = inputs(19, seed=5)
    full = ops.softmax_attention(q, k, v, scale=0.5)
    cache = None
    for i in range(19):
        o, cache = ops.softmax_step(q[:, :, i], k[:, :, i], v[:, :, i], cache, scale=0.5)
        assert cache[0].shape == (2, 3, i + 1, 6) and cache[1].shape == (2, 3, i + 1, 4)  # grows with t
        torch.testing.assert_close(o, full[:, :, i], rtol=0, atol=1e-12)


def test_bad_shapes_raise():
    q, k, v = inputs(5)
    with pytest.raises(ValueError, match="batch, heads, time, dim"):
        ops.softmax_attention(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="one token"):
        ops.softmax_step(q, k, v)


# ---- sliding window ---------------------------------------------------------------------------

@pytest.mark.parametrize("window,t", [(1, 17), (2, 17), (5, 17), (8, 64), (8, 61), (16, 17), (17, 17), (40, 17)])
def test_window_matches_naive_with_gradients(window, t):
    """Blocks of W (T a multiple of W or not), W = 1, and W >= T (plain causal softmax)."""
    q, k, v = inputs(t, seed=window + t)
    outs, grads = [], []
    for fn in (lambda *x: ops.window_attention(*x, window, scale=0.7),
               lambda *x: ops.naive_softmax_attention(*x, scale=0.7, window=window)):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        o = fn(*leaves)
        w = torch.randn(o.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
        outs.append(o)
        grads.append(torch.autograd.grad((o * w).sum(), leaves))
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=1e-10)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_window_covering_the_sequence_is_softmax():
    q, k, v = inputs(30, seed=5)
    torch.testing.assert_close(ops.window_attention(q, k, v, 30), ops.softmax_attention(q, k, v), rtol=0, atol=1e-12)
    torch.testing.assert_close(ops.window_weights(q, k, 1000), ops.softmax_weights(q, k), rtol=0, atol=1e-12)


def test_window_float32_matches_float64_reference():
    q, k, v = inputs(100, dtype=torch.float32, seed=6)
    ref = ops.naive_softmax_attention(q.double(), k.double(), v.double(), window=12)
    assert (ops.window_attention(q, k, v, 12).double() - ref).abs().max() < 1e-5


def test_window_weights_are_banded_and_reproduce_the_output():
    q, k, v = inputs(40, seed=7)
    w = ops.window_weights(q, k, 6)
    i, j = torch.meshgrid(torch.arange(40), torch.arange(40), indexing="ij")
    assert (w[..., (j > i) | (j <= i - 6)] == 0).all() and (w[..., (j <= i) & (j > i - 6)] > 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 40, dtype=F64))
    torch.testing.assert_close(w @ v, ops.window_attention(q, k, v, 6), rtol=0, atol=1e-12)
    rows = torch.tensor([0, 5, 39])
    torch.testing.assert_close(ops.window_weights(q, k, 6, rows=rows), w[:, :, rows], rtol=0, atol=1e-14)


@pytest.mark.parametrize("window", (1, 4))
def test_window_step_keeps_only_the_window(window):
    q, k, v = inputs(12, seed=8)
    ref = ops.naive_softmax_attention(q, k, v, window=window)
    cache = None
    for t in range(12):
        o, cache = ops.window_step(q[:, :, t], k[:, :, t], v[:, :, t], cache, window=window)
        torch.testing.assert_close(o, ref[:, :, t], rtol=0, atol=1e-12)
        assert cache[0].shape[2] == min(t + 1, window)  # the state is the window's KV cache


def test_bad_window_raises():
    q, k, v = inputs(8)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="window must be a positive int"):
            ops.window_attention(q, k, v, bad)
@pytest.mark.parametrize("causal", (True, False))
def test_weights_of_selected_rows_are_those_rows_of_the_matrix(causal):
    g = torch.Generator().manual_seed(4)
    q, k = (torch.randn(2, 3, 40, 8, generator=g, dtype=torch.float64) for _ in range(2))
    rows = torch.tensor([0, 7, 39, 7])
    full = ops.softmax_weights(q, k, causal=causal)
    part = ops.softmax_weights(q, k, causal=causal, rows=rows)
    torch.testing.assert_close(part, full[:, :, rows], rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match=r"rows must be positions in \[0, 40\)"):
        ops.softmax_weights(q, k, rows=torch.tensor([40]))
