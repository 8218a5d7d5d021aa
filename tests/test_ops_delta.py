"""The (gated) delta rule: every form against the naive loop, states, gradients, steps, weights."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from harness import ops

FORMS = ("parallel", "recurrent", "chunk")
F64 = torch.float64
CHUNK = 32
B, H, DK, DV = 2, 2, 5, 3

# log_decay ranges: none (DeltaNet), mild (a in [0.6, 1)) and strong (log a around -5).
STRENGTH = {"none": None, "mild": (0.0, 0.5), "strong": (4.0, 6.0)}


def inputs(t, strength, *, dtype=F64, seed=0, init=False):
    """Keys of norm in [0.5, 1] (as the op is fed: L2-normalised, here also shrunk, since the op
    itself never normalises), beta in [0, 1]."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, t, DK, generator=g, dtype=dtype)
    k = F.normalize(torch.randn(B, H, t, DK, generator=g, dtype=dtype), dim=-1)
    k = k * (0.5 + 0.5 * torch.rand(B, H, t, 1, generator=g, dtype=dtype))
    v = torch.randn(B, H, t, DV, generator=g, dtype=dtype)
    beta = torch.rand(B, H, t, generator=g, dtype=dtype)
    log_decay = None
    if STRENGTH[strength] is not None:
        lo, hi = STRENGTH[strength]
        log_decay = -(lo + (hi - lo) * torch.rand(B, H, t, generator=g, dtype=dtype))
    s0 = torch.randn(B, H, DK, DV, generator=g, dtype=dtype) if init else None
    return q, k, v, beta, log_decay, s0


def run(fn, q, k, v, beta, log_decay, s0, **kw):
    """Outputs, final state and the gradients of a random projection of both w.r.t. every input."""
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, beta)]
    ld = None if log_decay is None else log_decay.detach().clone().requires_grad_()
    st = None if s0 is None else s0.detach().clone().requires_grad_()
    o, s = fn(*leaves, ld, initial_state=st, return_state=True, **kw)
    g = torch.Generator().manual_seed(1)
    loss = (o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() + (
        s * torch.randn(s.shape, generator=g, dtype=s.dtype)).sum()
    wrt = leaves + [x for x in (ld, st) if x is not None]
    return o, s, torch.autograd.grad(loss, wrt)


GRAD_NAMES = ("q", "k", "v", "beta", "log_decay or S0", "S0")
CASES = list(itertools.product((1, 20, 32, 45, 96), (False, True), ("none", "mild", "strong")))


@pytest.mark.parametrize("t,init,strength", CASES)
def test_forms_match_naive_float64(t, init, strength):
    """T = 1, below, equal to and not a multiple of the chunk (32), and three chunks."""
    q, k, v, beta, ld, s0 = inputs(t, strength, init=init, seed=t)
    o_ref, s_ref, g_ref = run(ops.naive_delta_attention, q, k, v, beta, ld, s0)
    for form in FORMS:
        o, s, g = run(ops.delta_attention, q, k, v, beta, ld, s0, form=form, chunk_size=CHUNK)
        assert torch.isfinite(o).all() and all(torch.isfinite(x).all() for x in g), form
        torch.testing.assert_close(o, o_ref, rtol=0, atol=1e-10, msg=f"{form} output")
        torch.testing.assert_close(s, s_ref, rtol=0, atol=1e-10, msg=f"{form} state")
        assert len(g) == len(g_ref) == 4 + (ld is not None) + init
        for name, a, b in zip(GRAD_NAMES, g, g_ref):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-9, msg=f"{form} grad {name}")


@pytest.mark.parametrize("chunk_size", (1, 7, 12, 64))
def test_chunk_with_other_chunk_lengths(chunk_size):
    q, k, v, beta, ld, s0 = inputs(150, "mild", init=True, seed=2)
    ld[..., 1::3] = -5.0  # mix strong and weak decays
    o_ref, s_ref, g_ref = run(ops.naive_delta_attention, q, k, v, beta, ld, s0)
    o, s, g = run(ops.delta_attention, q, k, v, beta, ld, s0, form="chunk", chunk_size=chunk_size)
    torch.testing.assert_close(o, o_ref, rtol=0, atol=1e-10)
    torch.testing.assert_close(s, s_ref, rtol=0, atol=1e-10)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-9)


@pytest.mark.parametrize("strength", ("none", "mild", "strong"))
def test_float32_matches_float64_reference(strength):
    """float32 within 1e-5 of the output's scale (unit keys, beta up to 1, 300 steps)."""
    q, k, v, beta, ld, s0 = inputs(300, strength, init=True, seed=3, dtype=torch.float32)
    k = F.normalize(k, dim=-1)
    beta = 0.5 + 0.5 * beta  # strong writes: the triangular systems are least damped
    ref, s_ref = ops.naive_delta_attention(q.double(), k.double(), v.double(), beta.double(),
                                           None if ld is None else ld.double(), initial_state=s0.double(),
                                           return_state=True)
    for form in FORMS:
        o, s = ops.delta_attention(q, k, v, beta, ld, form=form, chunk_size=64, initial_state=s0, return_state=True)
        assert o.dtype == torch.float32 and s.dtype == torch.float32
        assert (o.double() - ref).abs().max() <= 1e-5 * ref.abs().max(), form
        assert (s.double() - s_ref).abs().max() <= 1e-5 * s_ref.abs().max(), form


def test_zero_log_decay_is_the_ungated_rule():
    q, k, v, beta, _, s0 = inputs(45, "none", init=True, seed=4)
    zero = torch.zeros(B, H, 45, dtype=F64)
    for form in FORMS:
        o1, s1 = ops.delta_attention(q, k, v, beta, None, form=form, chunk_size=16, initial_state=s0, return_state=True)
        o2, s2 = ops.delta_attention(q, k, v, beta, zero, form=form, chunk_size=16, initial_state=s0,
                                     return_state=True)
        torch.testing.assert_close(o1, o2, rtol=0, atol=1e-12)
        torch.testing.assert_close(s1, s2, rtol=0, atol=1e-12)
    torch.testing.assert_close(ops.delta_weights(q, k, beta, zero), ops.delta_weights(q, k, beta), rtol=0, atol=1e-12)


def test_beta_zero_only_decays_the_state():
    """beta = 0 writes nothing: S_t = (prod_{s<=t} a_s) S0 and o_t = S_t^T q_t, whatever k and v."""
    q, k, v, _, ld, s0 = inputs(45, "mild", init=True, seed=5)
    beta = torch.zeros(B, H, 45, dtype=F64)
    decay = torch.exp(torch.cumsum(ld, dim=-1))  # (B, H, T)
    expected = decay[..., None] * torch.einsum("bhtk,bhkv->bhtv", q, s0)
    for form in FORMS:
        o, s = ops.delta_attention(q, k, v, beta, ld, form=form, chunk_size=16, initial_state=s0, return_state=True)
        torch.testing.assert_close(o, expected, rtol=0, atol=1e-12)
        torch.testing.assert_close(s, decay[..., -1, None, None] * s0, rtol=0, atol=1e-12)
    assert ops.delta_weights(q, k, beta, ld).abs().max() == 0


@pytest.mark.parametrize("strength", ("none", "strong"))
def test_step_continues_a_chunk_state(strength):
    q, k, v, beta, ld, s0 = inputs(50, strength, init=True, seed=6)
    o_ref, s_ref = ops.naive_delta_attention(q, k, v, beta, ld, initial_state=s0, return_state=True)
    cut = 37  # two chunks of 16 and a partial one
    _, state = ops.delta_attention(q[:, :, :cut], k[:, :, :cut], v[:, :, :cut], beta[:, :, :cut],
                                   None if ld is None else ld[:, :, :cut], chunk_size=16, initial_state=s0,
                                   return_state=True)
    for t in range(cut, 50):
        o, state = ops.delta_attention_step(q[:, :, t], k[:, :, t], v[:, :, t], beta[:, :, t],
                                            None if ld is None else ld[:, :, t], state)
        torch.testing.assert_close(o, o_ref[:, :, t], rtol=0, atol=1e-12)
    torch.testing.assert_close(state, s_ref, rtol=0, atol=1e-12)


def test_step_from_an_empty_state_is_the_first_token():
    q, k, v, beta, ld, _ = inputs(1, "mild", seed=7)
    o, s = ops.delta_attention_step(q[:, :, 0], k[:, :, 0], v[:, :, 0], beta[:, :, 0], ld[:, :, 0])
    o_ref, s_ref = ops.naive_delta_attention(q, k, v, beta, ld, return_state=True)
    torch.testing.assert_close(o, o_ref[:, :, 0], rtol=0, atol=1e-14)
    torch.testing.assert_close(s, s_ref, rtol=0, atol=1e-14)


@pytest.mark.parametrize("strength", ("none", "mild", "strong"))
def test_weights_unroll_the_recurrence(strength):
    """o_i = sum_j a_ij v_j (zero initial state), a lower triangular; rows= gives the same rows."""
    q, k, v, beta, ld, _ = inputs(70, strength, seed=8)
    a = ops.delta_weights(q, k, beta, ld)
    assert a.shape == (B, H, 70, 70)
    assert a.triu(1).abs().max() == 0
    torch.testing.assert_close(a @ v, ops.naive_delta_attention(q, k, v, beta, ld), rtol=0, atol=1e-12)
    rows = torch.tensor([0, 5, 31, 69])
    torch.testing.assert_close(ops.delta_weights(q, k, beta, ld, rows=rows), a[:, :, rows], rtol=0, atol=1e-13)


def test_weights_of_the_additive_limit():
    """Orthogonal keys never correct each other: with beta = 1 the weights are the decayed q_i.k_j."""
    t = DK
    g = torch.Generator().manual_seed(9)
    basis = torch.linalg.qr(torch.randn(DK, DK, generator=g, dtype=F64))[0]  # orthonormal columns
    k = basis.T.expand(B, H, t, DK)
    q = torch.randn(B, H, t, DK, generator=g, dtype=F64)
    ld = -torch.rand(B, H, t, generator=g, dtype=F64)
    beta = torch.ones(B, H, t, dtype=F64)
    torch.testing.assert_close(ops.delta_weights(q, k, beta, ld), ops.decay_weights(q, k, ld), rtol=0, atol=1e-13)


def test_bf16_autocast_computes_in_float32():
    q, k, v, beta, ld, _ = inputs(40, "mild", dtype=torch.float32, seed=10)
    ref = ops.delta_attention(q, k, v, beta, ld, chunk_size=16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        o = ops.delta_attention(q, k, v, beta, ld, chunk_size=16)
    assert o.dtype == torch.bfloat16
    assert (o.float() - ref).abs().max() <= 1e-2 * ref.abs().max()


def test_bad_shapes_are_refused():
    q, k, v, beta, ld, s0 = inputs(10, "mild", init=True)
    with pytest.raises(ValueError, match=r"beta must be \(B, H, T\)"):
        ops.delta_attention(q, k, v, beta[..., :5], ld)
    with pytest.raises(ValueError, match=r"log_decay must be \(B, H, T\)"):
        ops.delta_attention(q, k, v, beta, ld[..., None].expand(B, H, 10, DK))
    with pytest.raises(ValueError, match="the state must be"):
        ops.delta_attention(q, k, v, beta, ld, initial_state=s0[..., :2])
    with pytest.raises(ValueError, match="form must be one of"):
        ops.delta_attention(q, k, v, beta, ld, form="fused")
    with pytest.raises(ValueError, match="beta and log_decay must be"):
        ops.delta_attention_step(q[:, :, 0], k[:, :, 0], v[:, :, 0], beta, None)
