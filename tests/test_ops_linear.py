"""Linear attention: every form against the naive loop, states, gradients, floors, steps."""

import itertools

import pytest
import torch

from harness import ops

FORMS = ("parallel", "recurrent", "chunk")
F64 = torch.float64
CHUNK = 16
B, H, DK, DV = 2, 2, 5, 3


def inputs(t, *, positive=True, dtype=F64, seed=0, init=False):
    g = torch.Generator().manual_seed(seed)
    draw = (lambda *s: torch.rand(*s, generator=g, dtype=dtype) + 0.05) if positive else (
        lambda *s: torch.randn(*s, generator=g, dtype=dtype))
    q, k = draw(B, H, t, DK), draw(B, H, t, DK)
    v = torch.randn(B, H, t, DV, generator=g, dtype=dtype)
    state = None
    if init:
        state = (torch.randn(B, H, DK, DV, generator=g, dtype=dtype), draw(B, H, DK) * 3)
    return q, k, v, state


def loss_and_grads(outs, leaves, seed=1):
    """A fixed random projection of every output, and its gradients with respect to leaves."""
    g = torch.Generator().manual_seed(seed)
    flat = []
    for o in outs:
        flat.extend(o if isinstance(o, tuple) else (o,))
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in flat)
    return torch.autograd.grad(loss, leaves)


def run(fn, q, k, v, state, **kw):
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    st = None
    if state is not None:
        st = tuple(x.detach().clone().requires_grad_() for x in state)
        leaves += list(st)
    o, s = fn(*leaves[:3], initial_state=st, return_state=True, **kw)
    return o, s, loss_and_grads((o, s), leaves)


CASES = list(itertools.product((1, 9, 16, 37, 64), (False, True), (False, True), (True, False)))


@pytest.mark.parametrize("fused", (True, False), ids=("fused-cpu", "batched"))
@pytest.mark.parametrize("t,init,exclusive,normalize", CASES)
def test_forms_match_naive_float64(t, init, exclusive, normalize, fused, monkeypatch):
    import harness.ops.fused_cpu as fused_cpu

    monkeypatch.setattr(fused_cpu, "_enabled", fused)  # the chunk form's two CPU paths
    q, k, v, state = inputs(t, positive=normalize, init=init, seed=t)
    kw = dict(exclusive=exclusive, normalize=normalize)
    o_ref, s_ref, g_ref = run(ops.naive_linear_attention, q, k, v, state, **kw)
    for form in FORMS:
        o, s, g = run(ops.linear_attention, q, k, v, state, form=form, chunk_size=CHUNK, **kw)
        torch.testing.assert_close(o, o_ref, rtol=0, atol=1e-10, msg=f"{form} output")
        torch.testing.assert_close(s[0], s_ref[0], rtol=0, atol=1e-10, msg=f"{form} S")
        torch.testing.assert_close(s[1], s_ref[1], rtol=0, atol=1e-10, msg=f"{form} z")
        for name, a, b in zip("qkvSz", g, g_ref):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-9, msg=f"{form} grad {name}")


@pytest.mark.parametrize("init", (False, True))
def test_global_form_matches_naive(init):
    q, k, v, state = inputs(37, init=init, seed=5)
    o_ref, s_ref, g_ref = run(ops.naive_linear_attention, q, k, v, state, causal=False)
    for form in FORMS:
        o, s, g = run(ops.linear_attention, q, k, v, state, form=form, causal=False, chunk_size=CHUNK)
        torch.testing.assert_close(o, o_ref, rtol=0, atol=1e-10)
        torch.testing.assert_close(s[0], s_ref[0], rtol=0, atol=1e-10)
        for a, b in zip(g, g_ref):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-9)


@pytest.mark.parametrize("exclusive", (False, True))
def test_float32_matches_float64_reference(exclusive):
    q, k, v, state = inputs(150, init=True, seed=3, dtype=torch.float32)
    ref, (s_ref, _) = ops.naive_linear_attention(
        q.double(), k.double(), v.double(), exclusive=exclusive,
        initial_state=tuple(x.double() for x in state), return_state=True)
    for form in FORMS:
        o, (s, _) = ops.linear_attention(q, k, v, form=form, exclusive=exclusive, chunk_size=64,
                                         initial_state=state, return_state=True)
        assert o.dtype == torch.float32
        assert (o.double() - ref).abs().max() <= 1e-5 * ref.abs().max(), form
        assert (s.double() - s_ref).abs().max() <= 1e-5 * s_ref.abs().max(), form


def test_chunk_size_does_not_change_the_result():
    q, k, v, _ = inputs(100, seed=4)
    ref = ops.linear_attention(q, k, v, form="parallel")
    for c in (1, 7, 33, 128):
        torch.testing.assert_close(ops.linear_attention(q, k, v, chunk_size=c), ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("exclusive,normalize", list(itertools.product((False, True), (True, False))))
def test_step_decoding_matches_the_sequence_forms(exclusive, normalize):
    q, k, v, state = inputs(21, init=True, seed=6, positive=True)
    o_seq, (s_seq, z_seq) = ops.linear_attention(q, k, v, exclusive=exclusive, normalize=normalize,
                                                 initial_state=state, return_state=True, chunk_size=8)
    st = state
    outs = []
    for i in range(q.shape[2]):
        o, st = ops.linear_attention_step(q[:, :, i], k[:, :, i], v[:, :, i], st,
                                          exclusive=exclusive, normalize=normalize)
        assert st[0].shape == (B, H, DK, DV) and st[1].shape == (B, H, DK)  # constant size
        outs.append(o)
    torch.testing.assert_close(torch.stack(outs, dim=2), o_seq, rtol=0, atol=1e-12)
    torch.testing.assert_close(st[0], s_seq, rtol=0, atol=1e-12)
    torch.testing.assert_close(st[1], z_seq, rtol=0, atol=1e-12)


def test_a_split_sequence_continues_from_its_state():
    q, k, v, _ = inputs(50, seed=7)
    full = ops.linear_attention(q, k, v)
    o1, st = ops.linear_attention(q[:, :, :20], k[:, :, :20], v[:, :, :20], return_state=True)
    o2 = ops.linear_attention(q[:, :, 20:], k[:, :, 20:], v[:, :, 20:], initial_state=st)
    torch.testing.assert_close(torch.cat([o1, o2], dim=2), full, rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal,exclusive", [(True, False), (True, True), (False, False)])
def test_weights_reproduce_the_output(causal, exclusive):
    q, k, v, _ = inputs(30, seed=8)
    a = ops.linear_weights(q, k, causal=causal, exclusive=exclusive)
    o = ops.linear_attention(q, k, v, causal=causal, exclusive=exclusive)
    torch.testing.assert_close(a @ v, o, rtol=0, atol=1e-12)
    rows = a.sum(-1)[:, :, 1:] if exclusive else a.sum(-1)
    torch.testing.assert_close(rows, torch.ones_like(rows), rtol=0, atol=1e-12)
    if causal:
        assert torch.all(torch.triu(a, diagonal=0 if exclusive else 1) == 0)
    raw = ops.linear_weights(q, k, causal=causal, exclusive=exclusive, normalize=False)
    torch.testing.assert_close(raw @ v, ops.linear_attention(q, k, v, causal=causal, exclusive=exclusive,
                                                              normalize=False), rtol=0, atol=1e-12)


# ---- denominators -----------------------------------------------------------------------------

def test_floor_keeps_the_sign_and_maps_zero_to_plus_eps():
    den = torch.tensor([0.0, 1e-9, -1e-9, -0.0, 2.0, -3.0], dtype=F64)
    out = ops.floor_denominator(den, 1e-6)
    assert out.tolist() == [1e-6, 1e-6, -1e-6, 1e-6, 2.0, -3.0]


@pytest.mark.parametrize("form", FORMS)
def test_zero_denominator_reads_zero_not_nan(form):
    q, k, v, _ = inputs(20, seed=9)
    q = torch.zeros_like(q)
    o = ops.linear_attention(q, k, v, form=form, chunk_size=8)
    assert torch.all(o == 0)
    # The first token of the exclusive form sees nothing: 0 / eps = 0.
    q2, k2, v2, _ = inputs(20, seed=9)
    o = ops.linear_attention(q2, k2, v2, form=form, exclusive=True, chunk_size=8)
    assert torch.isfinite(o).all() and torch.all(o[:, :, 0] == 0)


@pytest.mark.parametrize("form", FORMS)
def test_tiny_negative_denominator_is_floored_at_minus_eps(form):
    # Identity features of mixed sign: q.k = -1e-9 for the one key.
    q = torch.tensor([1.0, 0.0], dtype=F64).reshape(1, 1, 1, 2)
    k = torch.tensor([-1e-9, 5.0], dtype=F64).reshape(1, 1, 1, 2)
    v = torch.tensor([[2.0]], dtype=F64).reshape(1, 1, 1, 1)
    o = ops.linear_attention(q, k, v, form=form, eps=1e-6)
    # num = -2e-9, den floored to -1e-6 -> +2e-3 (the sign survives).
    assert float(o) == pytest.approx(2e-3, rel=1e-12)
    assert float(ops.naive_linear_attention(q, k, v, eps=1e-6)) == pytest.approx(2e-3, rel=1e-12)


def test_eps_is_the_named_floor():
    q, k, v, _ = inputs(10, seed=10)
    q = torch.zeros_like(q)
    q[..., 0] = 1e-12  # den ~ 1e-12: below either floor
    o_small = ops.linear_attention(q, k, v, eps=1e-6)
    o_tiny = ops.linear_attention(q, k, v, eps=1e-9)
    torch.testing.assert_close(o_tiny, o_small * 1e3, rtol=1e-12, atol=0)


NONFINITE_CALLS = {
    "parallel": lambda q, k, v: ops.linear_attention(q, k, v, form="parallel"),
    "recurrent": lambda q, k, v: ops.linear_attention(q, k, v, form="recurrent"),
    "chunk": lambda q, k, v: ops.linear_attention(q, k, v, form="chunk"),
    "global": lambda q, k, v: ops.linear_attention(q, k, v, causal=False),
    "naive": lambda q, k, v: ops.naive_linear_attention(q, k, v),
    "step": lambda q, k, v: ops.linear_attention_step(q[:, :, 0], k[:, :, 0], v[:, :, 0]),
    "weights": lambda q, k, v: ops.linear_weights(q, k),
}


@pytest.mark.parametrize("bad", (float("inf"), float("nan")))
@pytest.mark.parametrize("call", sorted(NONFINITE_CALLS))
def test_nonfinite_denominator_raises(call, bad):
    q, k, v, _ = inputs(12, seed=11)
    k[:, :, 0, 1] = bad
    with pytest.raises(FloatingPointError, match="non-finite normalisation denominator"):
        NONFINITE_CALLS[call](q, k, v)


def test_finite_check_can_be_switched_off():
    q, k, v, _ = inputs(12, seed=11)
    k[:, :, 0, 1] = float("inf")
    assert ops.finite_checks_enabled()
    ops.set_finite_checks(False)
    try:
        o = ops.linear_attention(q, k, v)
        assert not torch.isfinite(o).all()
    finally:
        ops.set_finite_checks(True)
    with pytest.raises(FloatingPointError):
        ops.linear_attention(q, k, v)


def test_unnormalised_form_does_not_check_denominators():
    q, k, v, _ = inputs(12, seed=11, positive=False)
    o = ops.linear_attention(q, k, v, normalize=False)
    assert torch.isfinite(o).all()


# ---- argument checks --------------------------------------------------------------------------

def test_bad_arguments_raise_clear_errors():
    q, k, v, state = inputs(8, init=True)
    with pytest.raises(ValueError, match="form must be one of"):
        ops.linear_attention(q, k, v, form="fused")
    with pytest.raises(ValueError, match="exclusive=True requires causal=True"):
        ops.linear_attention(q, k, v, causal=False, exclusive=True)
    with pytest.raises(ValueError, match="eps must be > 0"):
        ops.linear_attention(q, k, v, eps=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        ops.linear_attention(q, k, v, chunk_size=0)
    with pytest.raises(ValueError, match="batch, heads, time, dim"):
        ops.linear_attention(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="initial state S"):
        ops.linear_attention(q, k, v, initial_state=(state[0][..., :1], state[1]))


@pytest.mark.parametrize("causal,exclusive,normalize", [(True, False, True), (True, True, True),
                                                       (False, False, True), (True, False, False)])
def test_weights_of_selected_rows_are_those_rows_of_the_matrix(causal, exclusive, normalize):
    g = torch.Generator().manual_seed(5)
    q, k = (torch.rand(2, 3, 40, 8, generator=g, dtype=torch.float64) for _ in range(2))
    rows = torch.tensor([0, 1, 20, 39])
    kw = dict(causal=causal, exclusive=exclusive, normalize=normalize)
    full = ops.linear_weights(q, k, **kw)
    torch.testing.assert_close(ops.linear_weights(q, k, rows=rows, **kw), full[:, :, rows], rtol=0, atol=1e-15)
