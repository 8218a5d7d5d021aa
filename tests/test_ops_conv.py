"""The short causal convolution: fused CPU kernel and shifted multiply-adds against F.conv1d."""
import pytest
import torch

import harness.ops.fused_cpu as fused
from harness.ops.conv import causal_conv, causal_conv_reference


def outputs_and_grads(fn, x, w, b):
    leaves = [t.detach().clone().requires_grad_() for t in (x, w, b)]
    y = fn(*leaves)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64).to(y.dtype)
    return y, [y.detach(), *torch.autograd.grad(y, leaves, g)]


@pytest.mark.parametrize("use_fused", (True, False))
@pytest.mark.parametrize("shape", [(3, 9, 6, 4), (2, 2, 5, 4), (4, 17, 33, 1), (1, 8, 7, 2), (5, 6, 3, 5),
                                   (2, 11, 37, 4), (3, 5, 40, 3), (2, 3, 16, 2), (1, 2, 48, 3)])
def test_matches_conv1d_float64(shape, use_fused, monkeypatch):
    if use_fused and fused._load() is None:
        pytest.skip("the fused kernel could not be built here")
    monkeypatch.setattr(fused, "_enabled", use_fused)
    # T = 2 < K in the second and last: the padding covers the whole sequence; C = 37, 40 and 48
    # span several vector widths of channels, with and without a remainder
    b, t, c, size = shape
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(b, t, c, generator=g, dtype=torch.float64)
    w, bias = torch.randn(c, size, generator=g, dtype=torch.float64), torch.randn(c, generator=g, dtype=torch.float64)
    y, got = outputs_and_grads(causal_conv, x, w, bias)
    assert (type(y.grad_fn).__name__ == "CausalConvCPUBackward") == use_fused  # the path under test ran
    _, want = outputs_and_grads(causal_conv_reference, x, w, bias)
    for a, r in zip(got, want):
        torch.testing.assert_close(a, r, rtol=0, atol=1e-12)


@pytest.mark.skipif(fused._load() is None, reason="the fused kernel could not be built here")
def test_fused_float32_and_causal(monkeypatch):
    monkeypatch.setattr(fused, "_enabled", True)
    g = torch.Generator().manual_seed(0)
    x, w, bias = torch.randn(64, 64, 192, generator=g), torch.randn(192, 4, generator=g), torch.randn(192, generator=g)
    _, got = outputs_and_grads(causal_conv, x, w, bias)
    _, want = outputs_and_grads(causal_conv_reference, x.double(), w.double(), bias.double())
    for a, r in zip(got, want):
        torch.testing.assert_close(a.double(), r, rtol=1e-4, atol=1e-4)  # dw, dbias: sums of 4,096 terms
    x2 = x.clone()
    x2[:, 30] += 1.0  # a change at t = 30 moves nothing before it
    assert torch.equal(causal_conv(x2, w, bias)[:, :30], causal_conv(x, w, bias)[:, :30])


@pytest.mark.skipif(fused._load() is None, reason="the fused kernel could not be built here")
@pytest.mark.parametrize("dtype", (torch.float32, torch.float64))
@pytest.mark.parametrize("threads", (1, 2))
@pytest.mark.parametrize("shape", [(3, 4, 9, 24, 4), (2, 1, 2, 5, 4), (4, 3, 7, 37, 3)])
def test_members_each_get_their_solo_call_to_the_bit(shape, threads, dtype):
    """A group's call (members' sequences in blocks, taps (G, K, C), bias (G, C)) gives each
    member what the call with its block and taps alone gives: the same output and gradients."""
    from harness.ops.conv.forms import CausalConvCPU

    members, b, t, c, size = shape
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(members * b, t, c, generator=gen, dtype=dtype)
    w = torch.randn(members, c, size, generator=gen, dtype=dtype)
    bias = torch.randn(members, c, generator=gen, dtype=dtype)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y, got = outputs_and_grads(CausalConvCPU.apply, x, w, bias)
        dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64).to(dtype)
        for g in range(members):
            rows = slice(g * b, (g + 1) * b)
            leaves = [t_.detach().clone().requires_grad_() for t_ in (x[rows], w[g], bias[g])]
            alone = CausalConvCPU.apply(*leaves)
            want = [alone.detach(), *torch.autograd.grad(alone, leaves, dy[rows])]
            assert torch.equal(got[0][rows], want[0]) and torch.equal(got[1][rows], want[1])
            assert torch.equal(got[2][g], want[2]) and torch.equal(got[3][g], want[3])
    finally:
        torch.set_num_threads(before)
    with pytest.raises(RuntimeError, match="do not divide"):
        fused.kernels().conv_forward(x[:-1].contiguous(), w.transpose(1, 2).contiguous(), bias)
