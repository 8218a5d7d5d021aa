"""The worked examples of the mathematics (README, docs/reproductions.md), reproduced exactly, and the
state-size accounting."""

import math

import pytest
import torch

from harness import ops

FORMS = ("parallel", "recurrent", "chunk")
F64 = torch.float64


def t(x):
    """A list of per-position vectors -> (B=1, H=1, T, D) float64."""
    return torch.tensor(x, dtype=F64).reshape(1, 1, len(x), -1)


# Example 1: q=(1,0); keys (2,1),(-1,2),(1,-1),(0,3); values 3,-2,1,4 -> s=(9,10), z=(2,5), 4.5.
KEYS1 = [[2.0, 1.0], [-1.0, 2.0], [1.0, -1.0], [0.0, 3.0]]
VALS1 = [[3.0], [-2.0], [1.0], [4.0]]


def example1_queries():
    q = torch.zeros(4, 2, dtype=F64)
    q[-1] = torch.tensor([1.0, 0.0])  # only the last query (which sees all four keys) matters
    q[:-1] = 1.0
    return q.reshape(1, 1, 4, 2)


def test_example1_by_rescanning_the_keys():
    q, k, v = example1_queries(), t(KEYS1), t(VALS1)
    scores = torch.tensor([1.0, 0.0], dtype=F64) @ torch.tensor(KEYS1, dtype=F64).T
    assert scores.tolist() == [2.0, -1.0, 1.0, 0.0]
    assert float(scores @ torch.tensor(VALS1, dtype=F64)) == 9.0 and float(scores.sum()) == 2.0
    o = ops.naive_linear_attention(q, k, v)
    assert float(o[0, 0, -1, 0]) == pytest.approx(4.5, abs=1e-12)
    o = ops.linear_attention(q, k, v, form="parallel")
    assert float(o[0, 0, -1, 0]) == pytest.approx(4.5, abs=1e-12)
    a = ops.linear_weights(q, k)[0, 0, -1]
    assert float(a @ torch.tensor(VALS1, dtype=F64)) == pytest.approx(4.5, abs=1e-12)


@pytest.mark.parametrize("form", FORMS)
def test_example1_through_the_state(form):
    q, k, v = example1_queries(), t(KEYS1), t(VALS1)
    o, (s, z) = ops.linear_attention(q, k, v, form=form, chunk_size=3, return_state=True)
    assert s.flatten().tolist() == [9.0, 10.0]
    assert z.flatten().tolist() == [2.0, 5.0]
    assert float(o[0, 0, -1, 0]) == pytest.approx(4.5, abs=1e-12)
    # Global (encoder) form: every position reads the same total state.
    o_glob = ops.linear_attention(q, k, v, form=form, causal=False)
    assert float(o_glob[0, 0, -1, 0]) == pytest.approx(4.5, abs=1e-12)


def test_example1_step_by_step():
    q, k, v = example1_queries(), t(KEYS1), t(VALS1)
    state = None
    for i in range(4):
        o, state = ops.linear_attention_step(q[:, :, i], k[:, :, i], v[:, :, i], state)
    assert state[0].flatten().tolist() == [9.0, 10.0] and state[1].flatten().tolist() == [2.0, 5.0]
    assert float(o[0, 0, 0]) == pytest.approx(4.5, abs=1e-12)


# Example 2: q=(2,1); keys (1,0),(0,1); values 2,4 -> weights 2/3, 1/3, S=(2,4), z=(1,1), 8/3;
# softmax of the logits (2,1) at scale 1 gives 2.5379.

def example2():
    q = t([[1.0, 1.0], [2.0, 1.0]])
    return q, t([[1.0, 0.0], [0.0, 1.0]]), t([[2.0], [4.0]])


@pytest.mark.parametrize("form", FORMS)
def test_example2_linear(form):
    q, k, v = example2()
    o, (s, z) = ops.linear_attention(q, k, v, form=form, return_state=True)
    assert s.flatten().tolist() == [2.0, 4.0] and z.flatten().tolist() == [1.0, 1.0]
    assert float(o[0, 0, 1, 0]) == pytest.approx(8 / 3, abs=1e-12)
    w = ops.linear_weights(q, k)[0, 0, 1]
    torch.testing.assert_close(w, torch.tensor([2 / 3, 1 / 3], dtype=F64), rtol=0, atol=1e-12)


def test_example2_softmax():
    q, k, v = example2()
    expected = (2 * math.e**2 + 4 * math.e) / (math.e**2 + math.e)
    assert round(expected, 4) == 2.5379
    for o in (
        ops.softmax_attention(q, k, v, scale=1.0),
        ops.naive_softmax_attention(q, k, v, scale=1.0),
    ):
        assert float(o[0, 0, 1, 0]) == pytest.approx(expected, abs=1e-12)
    w = ops.softmax_weights(q, k, scale=1.0)[0, 0, 1]
    assert float(w @ torch.tensor([2.0, 4.0], dtype=F64)) == pytest.approx(2.5379, abs=5e-5)


# Example 3: phi(k1)=[1,0], v1=[1,0]; phi(k2)=[0,1], v2=[0,2]; phi(q)=[3,1]
# -> S=[[1,0],[0,2]], z=[1,1], o=[0.75, 0.5].

@pytest.mark.parametrize("form", FORMS)
def test_example3(form):
    k = t([[1.0, 0.0], [0.0, 1.0]])
    v = t([[1.0, 0.0], [0.0, 2.0]])
    q = t([[3.0, 1.0], [3.0, 1.0]])
    o, (s, z) = ops.linear_attention(q, k, v, form=form, return_state=True)
    assert s[0, 0].tolist() == [[1.0, 0.0], [0.0, 2.0]]
    assert z[0, 0].tolist() == [1.0, 1.0]
    torch.testing.assert_close(o[0, 0, 1], torch.tensor([0.75, 0.5], dtype=F64), rtol=0, atol=1e-12)
    o_naive = ops.naive_linear_attention(q, k, v)
    torch.testing.assert_close(o_naive[0, 0, 1], torch.tensor([0.75, 0.5], dtype=F64), rtol=0, atol=1e-12)


# Memory: GPT-2 heads (d=64): KV cache 2*N*d against a linear state d*d + d -> about 32 tokens.

def test_gpt2_crossover():
    d = 64
    assert ops.state_elements(d, d) == d * d + d == 4160
    assert ops.kv_cache_elements(1, d) == 2 * d
    n = ops.kv_crossover(d, d)
    assert n == 32
    assert ops.kv_cache_elements(n, d) <= ops.state_elements(d, d) < ops.kv_cache_elements(n + 1, d)
    # The crossover is per head: 12 heads x 12 layers scale both sides alike.
    assert 144 * ops.kv_cache_elements(33, d) > 144 * ops.state_elements(d, d)
    assert ops.kv_crossover(d, d, normalize=False) == 32


def test_long_context_sizes():
    assert ops.attention_matrix_elements(100_000) == 10**10
    s = ops.state_elements(128, 128)
    assert s == 16_512 and 16_000 <= s <= 17_000


def test_state_elements_with_and_without_normaliser():
    assert ops.state_elements(266, 64) == 266 * 64 + 266  # d_k is the feature dimension m (FAVOR+)
    assert ops.state_elements(64, 64, normalize=False) == 4096
    assert ops.state_elements(64, 32, normalize=False) == 64 * 32  # decayed states: S only
