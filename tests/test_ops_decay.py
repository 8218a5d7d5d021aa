"""Decayed / gated linear attention: every form against the naive loop, states, gradients, steps."""

import itertools

import pytest
import torch

from harness import ops

FORMS = ("parallel", "recurrent", "chunk")
F64 = torch.float64
CHUNK = 32
B, H, DK, DV = 2, 2, 5, 3

# log_decay ranges: mild (RetNet/Mamba-like a in [0.6, 1)) and strong (log a around -5).
STRENGTH = {"mild": (0.0, 0.5), "strong": (4.0, 6.0)}


def inputs(t, kind, strength, *, dtype=F64, seed=0, init=False):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, t, DK, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(B, H, t, DV, generator=g, dtype=dtype)
    lo, hi = STRENGTH[strength]
    shape = (B, H, t) if kind == "scalar" else (B, H, t, DK)
    log_decay = -(lo + (hi - lo) * torch.rand(shape, generator=g, dtype=dtype))
    s0 = torch.randn(B, H, DK, DV, generator=g, dtype=dtype) if init else None
    return q, k, v, log_decay, s0


def run(fn, q, k, v, log_decay, s0, **kw):
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, log_decay)]
    st = None
    if s0 is not None:
        st = s0.detach().clone().requires_grad_()
        leaves.append(st)
    o, s = fn(*leaves[:4], initial_state=st, return_state=True, **kw)
    g = torch.Generator().manual_seed(1)
    loss = (o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() + (
        s * torch.randn(s.shape, generator=g, dtype=s.dtype)).sum()
    return o, s, torch.autograd.grad(loss, leaves)


CASES = list(itertools.product((1, 20, 32, 45, 96), (False, True), ("scalar", "per_dim"), ("mild", "strong")))


@pytest.mark.parametrize("t,init,kind,strength", CASES)
def test_forms_match_naive_float64(t, init, kind, strength):
    q, k, v, ld, s0 = inputs(t, kind, strength, init=init, seed=t)
    o_ref, s_ref, g_ref = run(ops.naive_decay_attention, q, k, v, ld, s0)
    for form in FORMS:
        o, s, g = run(ops.decay_attention, q, k, v, ld, s0, form=form, chunk_size=CHUNK)
        assert torch.isfinite(o).all() and all(torch.isfinite(x).all() for x in g), form
        torch.testing.assert_close(o, o_ref, rtol=0, atol=1e-10, msg=f"{form} output")
        torch.testing.assert_close(s, s_ref, rtol=0, atol=1e-10, msg=f"{form} state")
        for name, a, b in zip(("q", "k", "v", "log_decay", "S0"), g, g_ref):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-9, msg=f"{form} grad {name}")


@pytest.mark.parametrize("chunk_size", (7, 12, 64))
def test_per_dim_chunk_with_other_chunk_lengths(chunk_size):
    # 64 is capped at 16; T=150 leaves a partial last chunk for each.
    q, k, v, ld, s0 = inputs(150, "per_dim", "strong", init=True, seed=2)
    ld[..., 1::3, :] = -0.01  # mix strong and weak gates
    o_ref, s_ref, g_ref = run(ops.naive_decay_attention, q, k, v, ld, s0)
    o, s, g = run(ops.decay_attention, q, k, v, ld, s0, form="chunk", chunk_size=chunk_size)
    torch.testing.assert_close(o, o_ref, rtol=0, atol=1e-10)
    torch.testing.assert_close(s, s_ref, rtol=0, atol=1e-10)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-9)


@pytest.mark.parametrize("kind,strength", list(itertools.product(("scalar", "per_dim"), ("mild", "strong"))))
def test_float32_matches_float64_reference(kind, strength):
    q, k, v, ld, s0 = inputs(150, kind, strength, init=True, seed=3, dtype=torch.float32)
    ref, s_ref = ops.naive_decay_attention(q.double(), k.double(), v.double(), ld.double(),
                                           initial_state=s0.double(), return_state=True)
    for form in FORMS:
        o, s = ops.decay_attention(q, k, v, ld, form=form, chunk_size=64, initial_state=s0, return_state=True)
        assert o.dtype == torch.float32
        assert (o.double() - ref).abs().max() <= 1e-5 * ref.abs().max(), form
        assert (s.double() - s_ref).abs().max() <= 1e-5 * s_ref.abs().max(), form


@pytest.mark.parametrize("dtype", (torch.float32, F64))
def test_very_strong_decay_stays_finite(dtype):
    # log a = -60 per step: a prefix product underflows long before the end; no inf/NaN anywhere.
    q, k, v, ld, s0 = inputs(100, "per_dim", "strong", init=True, seed=4, dtype=dtype)
    ld = ld * 12
    for scalar in (False, True):
        x = ld[..., 0] if scalar else ld
        for form in FORMS:
            leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, x)]
            o = ops.decay_attention(*leaves, form=form, initial_state=s0)
            grads = torch.autograd.grad(o.sum(), leaves)
            assert torch.isfinite(o).all() and all(torch.isfinite(g).all() for g in grads), form
            # With such decay each output is essentially its own token's q.k v.
            own = (q * k).sum(-1, keepdim=True) * v
            torch.testing.assert_close(o, own, rtol=1e-4, atol=1e-4)


def test_chunk_size_does_not_change_the_result():
    for kind in ("scalar", "per_dim"):
        q, k, v, ld, _ = inputs(100, kind, "mild", seed=5)
        ref = ops.decay_attention(q, k, v, ld, form="parallel")
        for c in (1, 7, 33, 128):
            torch.testing.assert_close(ops.decay_attention(q, k, v, ld, chunk_size=c), ref, rtol=0, atol=1e-12)


def test_constant_decay_is_retnet():
    # a = gamma for every step: o_i = sum_j gamma^(i-j) (q_i.k_j) v_j.
    q, k, v, _, _ = inputs(24, "scalar", "mild", seed=6)
    gamma = 1 - 2.0 ** -5
    ld = torch.full((B, H, 24), torch.log(torch.tensor(gamma, dtype=F64)).item(), dtype=F64)
    i = torch.arange(24)
    d = (i[:, None] - i[None, :]).to(F64)
    mask = gamma ** d.clamp(min=0) * (d >= 0)
    expected = ((q @ k.transpose(-1, -2)) * mask) @ v
    for form in FORMS:
        torch.testing.assert_close(ops.decay_attention(q, k, v, ld, form=form, chunk_size=8), expected,
                                   rtol=0, atol=1e-12)


def test_scalar_decay_equals_the_same_gate_on_every_dimension():
    q, k, v, ld, s0 = inputs(45, "scalar", "mild", seed=7, init=True)
    per_dim = ld.unsqueeze(-1).expand(B, H, 45, DK)
    for form in FORMS:
        torch.testing.assert_close(ops.decay_attention(q, k, v, ld, form=form, initial_state=s0),
                                   ops.decay_attention(q, k, v, per_dim, form=form, initial_state=s0),
                                   rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ("scalar", "per_dim"))
def test_step_decoding_matches_the_sequence_forms(kind):
    q, k, v, ld, s0 = inputs(21, kind, "mild", seed=8, init=True)
    o_seq, s_seq = ops.decay_attention(q, k, v, ld, chunk_size=8, initial_state=s0, return_state=True)
    s = s0
    outs = []
    for i in range(21):
        o, s = ops.decay_attention_step(q[:, :, i], k[:, :, i], v[:, :, i], ld[:, :, i], s)
        assert s.shape == (B, H, DK, DV)
        outs.append(o)
    torch.testing.assert_close(torch.stack(outs, dim=2), o_seq, rtol=0, atol=1e-12)
    torch.testing.assert_close(s, s_seq, rtol=0, atol=1e-12)
    o0, s1 = ops.decay_attention_step(q[:, :, 0], k[:, :, 0], v[:, :, 0], ld[:, :, 0])  # empty state
    torch.testing.assert_close(o0, ops.decay_attention(q, k, v, ld)[:, :, 0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ("scalar", "per_dim"))
def test_weights_reproduce_the_output(kind):
    q, k, v, ld, _ = inputs(30, kind, "mild", seed=9)
    a = ops.decay_weights(q, k, ld)
    assert a.shape == (B, H, 30, 30) and torch.all(torch.triu(a, diagonal=1) == 0)
    torch.testing.assert_close(a @ v, ops.decay_attention(q, k, v, ld), rtol=0, atol=1e-12)
    # The definition, one entry: a_ij = q_i . (prod_{j<s<=i} a_s) k_j.
    i, j = 17, 9
    x = ld[0, 0, j + 1:i + 1]
    gate = torch.exp(x.sum(0))
    if kind == "scalar":
        gate = gate.expand(DK)
    assert float(a[0, 0, i, j]) == pytest.approx(float((q[0, 0, i] * gate * k[0, 0, j]).sum()), abs=1e-12)


def test_bad_arguments_raise_clear_errors():
    q, k, v, ld, s0 = inputs(8, "scalar", "mild", init=True)
    with pytest.raises(ValueError, match="log_decay must be"):
        ops.decay_attention(q, k, v, ld[..., :4])
    with pytest.raises(ValueError, match="form must be one of"):
        ops.decay_attention(q, k, v, ld, form="fused")
    with pytest.raises(ValueError, match="initial state"):
        ops.decay_attention(q, k, v, ld, initial_state=s0[..., :1])
    with pytest.raises(ValueError, match="log_decay must be"):
        ops.decay_attention_step(q[:, :, 0], k[:, :, 0], v[:, :, 0], ld)


@pytest.mark.parametrize("kind", ("scalar", "per_dim"))
def test_weights_of_selected_rows_are_those_rows_of_the_matrix(kind):
    q, k, v, ld, _ = inputs(30, kind, "strong", seed=11)
    rows = torch.tensor([0, 3, 17, 29])
    full = ops.decay_weights(q, k, ld)
    torch.testing.assert_close(ops.decay_weights(q, k, ld, rows=rows), full[:, :, rows], rtol=0, atol=1e-12)
