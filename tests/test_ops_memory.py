"""Memory of the chunk and recurrent forms is linear in T and holds no per-position state.

A dispatch mode follows every tensor the ops allocate (forward and backward) and reports the
peak of what is alive at once. Doubling T must (about) double that peak, and the growth per
token must stay well below one (Dk, Dv) state: a (T, T) matrix would quadruple it, and
keeping a state per position would add Dk * Dv elements per token. The parallel form and a
recurrent loop without checkpointing serve as controls that the measurement sees both.
"""

import pytest
import torch

import harness.ops.decay.forms as decay_module
import harness.ops.common.scan as scan_module
from harness import ops
from harness.peak_memory import LiveMemory

DK = DV = 32
T1, T2 = 256, 512
ITEM = 4  # float32


def measure(family, form, t, *, grad=True):
    g = torch.Generator().manual_seed(0)
    q, k = torch.rand(1, 1, t, DK, generator=g), torch.rand(1, 1, t, DK, generator=g)
    v = torch.randn(1, 1, t, DV, generator=g)
    leaves = [q, k, v]
    if family != "linear":
        shape = (1, 1, t) if family == "scalar" else (1, 1, t, DK)
        leaves.append(-torch.rand(shape, generator=g))
    for x in leaves:
        x.requires_grad_(grad)
    gout = torch.randn(1, 1, t, DV, generator=g)
    with LiveMemory(leaves + [gout], exact=True) as mem:
        if family == "linear":
            o = ops.linear_attention(*leaves, form=form)
        else:
            o = ops.decay_attention(*leaves, form=form)
        if grad:
            o.backward(gout)
    return mem


def growth(family, form, *, grad=True):
    m1, m2 = measure(family, form, T1, grad=grad), measure(family, form, T2, grad=grad)
    return m2.peak / m1.peak, (m2.peak - m1.peak) / (T2 - T1), m2.largest


@pytest.fixture(autouse=True)
def small_groups(monkeypatch):
    # The per-dimension gate builds its exact decay tensor for a bounded group of chunks;
    # shrink the bound so that the grouping is exercised at these small sizes too.
    monkeypatch.setattr(decay_module, "GATED_GROUP_ELEMENTS", 1 << 14)


@pytest.mark.parametrize("grad", (False, True))
@pytest.mark.parametrize("form", ("chunk", "recurrent"))
@pytest.mark.parametrize("family", ("linear", "scalar", "per_dim"))
def test_memory_is_linear_in_t_without_per_position_states(family, form, grad):
    ratio, per_token, largest = growth(family, form, grad=grad)
    assert ratio < 2.2, f"peak grew {ratio:.2f}x when T doubled"
    assert per_token < 0.75 * DK * DV * ITEM, f"{per_token:.0f} bytes per token against a {DK * DV * ITEM} byte state"
    assert largest < T2 * T2 * ITEM // 4  # nothing near a (T, T) matrix


def test_the_measurement_sees_a_quadratic_form():
    ratio, _, largest = growth("scalar", "parallel")
    assert ratio > 3.0 and largest >= T2 * T2 * ITEM


def test_the_measurement_sees_per_position_states(monkeypatch):
    # One segment as long as the sequence: the backward pass keeps every step's state.
    monkeypatch.setattr(scan_module, "SEGMENT", 1 << 20)
    _, per_token, _ = growth("linear", "recurrent")
    assert per_token >= DK * DV * ITEM


def row_weights(family, t, rows):
    """Peak bytes of the effective weights of `rows` at length t (float32, no gradients)."""
    g = torch.Generator().manual_seed(1)
    q, k = torch.rand(1, 2, t, DK, generator=g), torch.rand(1, 2, t, DK, generator=g)
    ld = -torch.rand((1, 2, t) if family != "per_dim" else (1, 2, t, DK), generator=g) * 0.1
    make = {"softmax": lambda: ops.softmax_weights(q, k, rows=rows),
            "linear": lambda: ops.linear_weights(q, k, rows=rows),
            "scalar": lambda: ops.decay_weights(q, k, ld[..., 0] if ld.dim() == 4 else ld, rows=rows),
            "per_dim": lambda: ops.decay_weights(q, k, ld, rows=rows)}[family]
    with LiveMemory([q, k, ld], exact=True) as mem:
        w = make()
    assert w.shape == (1, 2, rows.numel(), t)
    return mem.peak


@pytest.mark.parametrize("family", ("softmax", "linear", "scalar", "per_dim"))
def test_weights_of_selected_rows_take_memory_linear_in_t(family):
    rows = torch.tensor([5, 100, 200, 255])
    small = row_weights(family, 1024, rows)
    big = row_weights(family, 4096, rows)
    assert big / small < 4.5, f"peak grew {big / small:.2f}x when T quadrupled"  # (T, T) would be 16x
    assert big < 40 * rows.numel() * 4096 * ITEM * 2 * max(1, DK if family == "per_dim" else 1)
