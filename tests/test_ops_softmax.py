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
