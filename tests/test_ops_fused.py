"""The fused CPU kernels of the chunk forms against the batched forms, their oracles."""
import itertools

import pytest
import torch

import harness.ops.fused_cpu as fused
from harness import ops
from harness.ops.decay.chunk import DecayChunk, DecayChunkCPU, decay_chunk
from harness.ops.linear.chunk import LinearChunk, LinearChunkCPU, linear_chunk

pytestmark = pytest.mark.skipif(fused._load() is None, reason="the fused kernel could not be built here")


def draw(m, n, c, dk, dv, dtype, init, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.rand(m, n, c, dk, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(m, n, c, dv, generator=g, dtype=dtype)
    s0 = torch.randn(m, dk, dv, generator=g, dtype=dtype) if init else None
    z0 = torch.rand(m, dk, generator=g, dtype=dtype) if init else None
    return q, k, v, s0, z0


def outputs_and_grads(use_fused, q, k, v, s0, z0, exclusive, eps, monkeypatch):
    monkeypatch.setattr(fused, "_enabled", use_fused)
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, s0, z0) if x is not None]
    it = iter(leaves)
    args = [next(it) if x is not None else None for x in (q, k, v, s0, z0)]
    out = linear_chunk(*args, exclusive, eps)
    expected = LinearChunkCPU if use_fused else LinearChunk
    assert type(out[0].grad_fn).__name__ == f"{expected.__name__}Backward"  # the path under test ran
    g = torch.Generator().manual_seed(1)
    # weights drawn in float64 whatever the dtype under test, so both dtypes see the same loss
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype)).sum() for o in out)
    return [o.detach() for o in out] + list(torch.autograd.grad(loss, leaves))


SHAPES = [(6, 5, 4, 16, 8), (3, 9, 8, 8, 4), (2, 2, 16, 4, 6), (1, 70, 4, 8, 8), (5, 1, 8, 4, 4)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("init,exclusive,normalize", list(itertools.product((False, True), repeat=3)))
def test_fused_matches_batched_float64(shape, init, exclusive, normalize, monkeypatch):
    q, k, v, s0, z0 = draw(*shape, torch.float64, init, seed=sum(shape))
    eps = 1e-6 if normalize else None
    a = outputs_and_grads(True, q, k, v, s0, z0, exclusive, eps, monkeypatch)
    b = outputs_and_grads(False, q, k, v, s0, z0, exclusive, eps, monkeypatch)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-10)


def test_fused_float32_within_tolerance_of_float64(monkeypatch):
    """float32 through the fused kernel vs the float64 batched form: 64 chunks of 64."""
    q, k, v, _, _ = draw(2, 64, 64, 32, 32, torch.float64, False, seed=5)
    ref = outputs_and_grads(False, q, k, v, None, None, False, 1e-6, monkeypatch)
    got = outputs_and_grads(True, q.float(), k.float(), v.float(), None, None, False, 1e-6, monkeypatch)
    for x, y in zip(got, ref):
        torch.testing.assert_close(x.double(), y, rtol=1e-4, atol=1e-4)


def test_linear_attention_uses_it_and_matches_naive(monkeypatch):
    """Through the public API, with padding (T = 37 in chunks of 8)."""
    g = torch.Generator().manual_seed(0)
    q, k = (torch.rand(2, 3, 37, 8, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, 3, 37, 4, generator=g, dtype=torch.float64)
    monkeypatch.setattr(fused, "_enabled", True)
    o = ops.linear_attention(q, k, v, form="chunk", chunk_size=8)
    torch.testing.assert_close(o, ops.naive_linear_attention(q, k, v), rtol=0, atol=1e-10)


def test_low_precision_and_switched_off_take_the_batched_form(monkeypatch):
    assert fused.applies(torch.rand(4, 1, 8, 4)) and fused.applies(torch.rand(4, 3, 8, 4).double())
    assert not fused.applies(torch.rand(4, 3, 8, 4).bfloat16())
    monkeypatch.setattr(fused, "_enabled", False)
    assert not fused.applies(torch.rand(4, 3, 8, 4))


def test_a_failed_build_warns_once_and_falls_back(monkeypatch, capsys, tmp_path):
    import torch.utils.cpp_extension as cpp

    def broken(**kwargs):
        raise RuntimeError("Error building extension: no compiler")

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # no finished build to import
    monkeypatch.setattr(fused, "_module", None)
    monkeypatch.setattr(fused, "_failed", False)
    monkeypatch.setattr(cpp, "load", broken)
    assert not fused.applies(torch.rand(2, 3, 8, 4)) and not fused.applies(torch.rand(2, 3, 8, 4))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fused CPU chunk kernels are unavailable" in err[0]
    o = ops.linear_attention(torch.rand(1, 1, 20, 4), torch.rand(1, 1, 20, 4), torch.randn(1, 1, 20, 4),
                             form="chunk", chunk_size=8)
    assert torch.isfinite(o).all()


def decay_outputs_and_grads(use_fused, q, k, v, x, s0, monkeypatch, x_learned=True):
    """Outputs and gradients; x_learned False: the log decays are constants, as RetNet's are."""
    monkeypatch.setattr(fused, "_enabled", use_fused)
    learned = (q, k, v, x if x_learned else None, s0)
    leaves = [t.detach().clone().requires_grad_() for t in learned if t is not None]
    it = iter(leaves)
    args = [next(it) if t is not None else None for t in learned]
    if not x_learned:
        args[3] = x
    out = decay_chunk(*args)
    expected = DecayChunkCPU if use_fused else DecayChunk
    assert type(out[0].grad_fn).__name__ == f"{expected.__name__}Backward"
    g = torch.Generator().manual_seed(2)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype)).sum() for o in out)
    return [o.detach() for o in out] + list(torch.autograd.grad(loss, leaves))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("init", (False, True))
def test_fused_decay_matches_batched_float64(shape, init, monkeypatch):
    """Scalar gates, strong and weak (log decays in [-3, 0]), forward and every gradient (x too)."""
    m, n, c, dk, dv = shape
    q, k, v, s0, _ = draw(m, n, c, dk, dv, torch.float64, init, seed=sum(shape) + 1)
    x = -3 * torch.rand(m, n, c, 1, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    a = decay_outputs_and_grads(True, q - 0.5, k - 0.5, v, x, s0, monkeypatch)
    b = decay_outputs_and_grads(False, q - 0.5, k - 0.5, v, x, s0, monkeypatch)
    for got, want in zip(a, b):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def fixed_decays(m, n, c, heads, dtype, seed=9):
    """RetNet's log decays: one value per head (sequences cycle through the heads), the same at
    every position, so the kernel's decay masks repeat and it reuses them (MaskCache)."""
    per_head = -3 * torch.rand(heads, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    return per_head.repeat(m // heads + 1)[:m, None, None, None].expand(m, n, c, 1).contiguous()


@pytest.mark.parametrize("heads", (1, 3, 20))  # 20: more patterns than the cache keeps
def test_fused_decay_with_fixed_decays_matches_batched_float64(heads, monkeypatch):
    m, n, c, dk, dv = 40, 3, 8, 4, 6
    q, k, v, s0, _ = draw(m, n, c, dk, dv, torch.float64, True, seed=heads)
    x = fixed_decays(m, n, c, heads, torch.float64)
    a = decay_outputs_and_grads(True, q - 0.5, k - 0.5, v, x, s0, monkeypatch, x_learned=False)
    b = decay_outputs_and_grads(False, q - 0.5, k - 0.5, v, x, s0, monkeypatch, x_learned=False)
    assert len(a) == 2 + 4  # o, S_final; dq, dk, dv, ds0 (no gradient for the constant decays)
    for got, want in zip(a, b):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("keep_masks", (False, True))
@pytest.mark.parametrize("heads,shared_start", [(1, False), (3, False), (3, True), (20, False), (None, False)])
def test_decay_kernel_reusing_masks_equals_it_computing_each_afresh(heads, shared_start, keep_masks):
    """A reused or kept decay mask changes no bit: the kernel over a whole batch (masks reused across
    sequences and chunks) against the same kernel called on one chunk at a time, the state carried
    from call to call (forward: s0 is the last call's final state; backward: ds_final is the later
    chunk's ds0), where every mask is computed afresh. float32, where a changed rounding shows.
    heads None: data-dependent decays, never repeated; shared_start: the heads' decays agree over
    a chunk's first half, so only the whole chunk tells their masks apart. keep_masks: the
    forward keeps every chunk's mask and the backward reads them (learned decays)."""
    m, n, c, dk, dv = 24, 3, 16, 2, 8
    q, k, v, s0, _ = draw(m, n, c, dk, dv, torch.float32, True, seed=4)
    q, k = q - 0.5, k - 0.5
    x = (fixed_decays(m, n, c, heads, torch.float32) if heads else
         -3 * torch.rand(m, n, c, 1, generator=torch.Generator().manual_seed(3)))[..., 0].contiguous()
    if shared_start:
        x[..., :c // 2] = -0.5
    g = torch.Generator().manual_seed(5)
    do, ds_final = torch.randn(m, n, c, dv, generator=g), torch.randn(m, dk, dv, generator=g)
    kern = fused.kernels()
    o, starts, s_final, masks = kern.decay_forward(q, k, v, x, s0, keep_masks)
    assert masks.shape == ((m, n, c * (c + 1) // 2) if keep_masks else (0,))
    grads = kern.decay_backward(q, k, v, x, starts, do, ds_final, masks)  # dq, dk, dv, db, ds0
    one = lambda t, s, j: t[s:s + 1, j:j + 1].contiguous()
    for s in range(m):
        state = s0[s:s + 1]
        for j in range(n):
            o_j, starts_j, state, mask_j = kern.decay_forward(one(q, s, j), one(k, s, j), one(v, s, j), one(x, s, j),
                                                              state, keep_masks)
            assert torch.equal(o_j, one(o, s, j)) and torch.equal(starts_j, one(starts, s, j))
            if keep_masks:
                assert torch.equal(mask_j, one(masks, s, j))
        assert torch.equal(state, s_final[s:s + 1])
        g_state = ds_final[s:s + 1]
        for j in reversed(range(n)):
            *chunk_grads, g_state = kern.decay_backward(one(q, s, j), one(k, s, j), one(v, s, j), one(x, s, j),
                                                        one(starts, s, j), one(do, s, j), g_state,
                                                        torch.empty(0))  # masks computed afresh
            for got, whole in zip(chunk_grads, grads[:4]):
                assert torch.equal(got, one(whole, s, j))
        assert torch.equal(g_state, grads[4][s:s + 1])


GATED_SHAPES = SHAPES + [(2, 2, 64, 16, 8), (1, 2, 128, 8, 8)]


@pytest.mark.parametrize("shape", GATED_SHAPES)
@pytest.mark.parametrize("init", (False, True))
@pytest.mark.parametrize("strength", (3.0, 30.0, 200.0))
def test_fused_gated_matches_batched_float64(shape, init, strength, monkeypatch):
    """Per-dimension gates, log decays in [-strength, 0]: 3 keeps every chunk one product, 30
    halves chunks of 32 and more, 200 sums the pairs of 8-blocks directly; forward and every
    gradient, the log decays' (final state's term included) too."""
    m, n, c, dk, dv = shape
    q, k, v, s0, _ = draw(m, n, c, dk, dv, torch.float64, init, seed=sum(shape) + 2)
    x = -strength * torch.rand(m, n, c, dk, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    a = decay_outputs_and_grads(True, q - 0.5, k - 0.5, v, x, s0, monkeypatch)
    b = decay_outputs_and_grads(False, q - 0.5, k - 0.5, v, x, s0, monkeypatch)
    for got, want in zip(a, b):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("strength", (0.05, 3.0))
def test_fused_gated_float32_within_tolerance_of_float64(strength, monkeypatch):
    """float32 through the fused kernel vs the float64 batched form: 16 chunks of 64."""
    q, k, v, _, _ = draw(2, 16, 64, 32, 32, torch.float64, False, seed=6)
    q, k = q - 0.5, k - 0.5
    x = -strength * torch.rand(2, 16, 64, 32, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    ref = decay_outputs_and_grads(False, q, k, v, x, None, monkeypatch)
    got = decay_outputs_and_grads(True, q.float(), k.float(), v.float(), x.float(), None, monkeypatch)
    for y, want in zip(got, ref):
        torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-4)


def test_decay_attention_uses_it_and_matches_naive(monkeypatch):
    """Through the public API with padding (T = 37 in chunks of 8), scalar and per-dimension gates."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 37, 8, generator=g, dtype=torch.float64) for _ in range(3))
    monkeypatch.setattr(fused, "_enabled", True)
    for log_a in (-torch.rand(2, 3, 37, generator=g, dtype=torch.float64),
                  -torch.rand(2, 3, 37, 8, generator=g, dtype=torch.float64)):
        o = ops.decay_attention(q, k, v, log_a, form="chunk", chunk_size=8)
        torch.testing.assert_close(o, ops.naive_decay_attention(q, k, v, log_a), rtol=0, atol=1e-10)
    qc = torch.rand(2, 4, 8, 8, dtype=torch.float64, requires_grad=True)  # (M, N, C, Dk) chunks
    o, _ = decay_chunk(qc, qc.detach(), qc.detach(), -torch.rand(2, 4, 8, 8, dtype=torch.float64), None)
    assert type(o.grad_fn).__name__ == "DecayChunkCPUBackward"


def delta_outputs_and_grads(use_fused, q, k, v, beta, x, s0, monkeypatch):
    from harness.ops.delta.chunk import delta_chunk

    monkeypatch.setattr(fused, "_enabled", use_fused)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, beta, x, s0) if t is not None]
    it = iter(leaves)
    args = [next(it) if t is not None else None for t in (q, k, v, beta, x, s0)]
    out = delta_chunk(*args)
    ran = {type(f).__name__ for f, _ in out[0].grad_fn.next_functions if f is not None} | {type(out[0].grad_fn).__name__}
    assert ("DeltaChunkCPUBackward" in ran) == use_fused  # the path under test ran
    g = torch.Generator().manual_seed(4)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype)).sum() for o in out)
    return [o.detach() for o in out] + list(torch.autograd.grad(loss, leaves))


def delta_draw(b, h, n, c, dk, dv, dtype, init, gated, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n, c, dk, generator=g, dtype=dtype)
    k = torch.nn.functional.normalize(torch.randn(b, h, n, c, dk, generator=g, dtype=dtype), dim=-1)
    v = torch.randn(b, h, n, c, dv, generator=g, dtype=dtype)
    beta = torch.rand(b, h, n, c, generator=g, dtype=dtype)
    x = -torch.rand(b, h, n, c, generator=g, dtype=dtype) if gated else None
    s0 = torch.randn(b, h, dk, dv, generator=g, dtype=dtype) if init else None
    return q, k, v, beta, x, s0


@pytest.mark.parametrize("shape", [(2, 2, 3, 8, 4, 6), (1, 2, 2, 16, 8, 4), (1, 1, 4, 1, 4, 4), (2, 1, 2, 64, 16, 8),
                                   (1, 1, 1, 5, 3, 2)])
@pytest.mark.parametrize("init,gated", list(itertools.product((False, True), repeat=2)))
def test_fused_delta_matches_batched_float64(shape, init, gated, monkeypatch):
    """The (gated) delta rule's chunk form: outputs, final state and the gradients of q, k, v,
    beta, the log decays and the initial state, against the batched form (autograd through it)."""
    inputs = delta_draw(*shape, torch.float64, init, gated, seed=sum(shape))
    a = delta_outputs_and_grads(True, *inputs, monkeypatch)
    b = delta_outputs_and_grads(False, *inputs, monkeypatch)
    for got, want in zip(a, b):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_fused_delta_float32_within_tolerance_of_float64(monkeypatch):
    """float32 through the fused kernel vs the float64 batched form: 8 chunks of 64, gated."""
    inputs = delta_draw(2, 2, 8, 64, 32, 32, torch.float64, True, True, seed=11)
    ref = delta_outputs_and_grads(False, *inputs, monkeypatch)
    got = delta_outputs_and_grads(True, *(t.float() for t in inputs), monkeypatch)
    for y, want in zip(got, ref):
        torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("gated", (False, True))
def test_delta_kernel_keeping_masks_changes_no_bit(gated):
    """Learned decays' masks kept by the forward and read by the backward give, to the bit, what
    the backward computing them again gives (float32). Without a decay nothing is kept."""
    b, h, n, c, dk, dv = 2, 3, 3, 16, 4, 8
    q, k, v, beta, x, s0 = (t.reshape(b * h, *t.shape[2:]).contiguous() if t is not None else torch.empty(0)
                            for t in delta_draw(b, h, n, c, dk, dv, torch.float32, True, gated, seed=5))
    kern = fused.kernels()
    o, starts, s_final, masks = kern.delta_forward(q, k, v, beta, x, s0, True)
    assert masks.shape == ((b * h, n, c * (c + 1) // 2) if gated else (0,))
    again = kern.delta_forward(q, k, v, beta, x, s0, False)
    assert again[3].numel() == 0 and all(torch.equal(a, b) for a, b in zip((o, starts, s_final), again))
    g = torch.Generator().manual_seed(6)
    do, ds_final = torch.randn(o.shape, generator=g), torch.randn(s_final.shape, generator=g)
    kept = kern.delta_backward(q, k, v, beta, x, starts, s_final, do, ds_final, masks)
    fresh = kern.delta_backward(q, k, v, beta, x, starts, s_final, do, ds_final, torch.empty(0))
    assert all(torch.equal(a, b) for a, b in zip(kept, fresh))


def test_delta_attention_uses_it_and_matches_naive(monkeypatch):
    """Through the public API with padding (T = 37 in chunks of 8), with and without decay."""
    g = torch.Generator().manual_seed(0)
    q, v = (torch.randn(2, 3, 37, 8, generator=g, dtype=torch.float64) for _ in range(2))
    k = torch.nn.functional.normalize(torch.randn(2, 3, 37, 8, generator=g, dtype=torch.float64), dim=-1)
    beta = torch.rand(2, 3, 37, generator=g, dtype=torch.float64)
    monkeypatch.setattr(fused, "_enabled", True)
    for log_a in (None, -torch.rand(2, 3, 37, generator=g, dtype=torch.float64)):
        o = ops.delta_attention(q, k, v, beta, log_a, form="chunk", chunk_size=8)
        torch.testing.assert_close(o, ops.naive_delta_attention(q, k, v, beta, log_a), rtol=0, atol=1e-10)
