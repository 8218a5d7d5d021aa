"""State-size accounting: what a mixer must keep per head to decode the next token.

Softmax keeps a KV cache that grows with the sequence (N keys and N values); linear and
decayed mixers keep a fixed-size state. Counts are elements per head (multiply by the
element size, heads and layers for bytes of a whole model); each mixer's `state_size`
(harness.layers.protocol) is built from these.
"""

from __future__ import annotations


def state_elements(d_k: int, d_v: int, *, normalize: bool = True) -> int:
    """Elements of a fixed-size recurrent state per head: S (d_k x d_v), plus the normaliser z
    (d_k) of normalised kernel attention (d_k is then the feature dimension m). Decayed and
    delta-rule states have no normaliser (normalize=False)."""
    return d_k * d_v + (d_k if normalize else 0)


def kv_cache_elements(n: int, d: int, d_v: int | None = None) -> int:
    """KV-cache elements per head after n tokens: n keys of d and n values of d_v (default d)."""
    return n * (d + (d if d_v is None else d_v))


def attention_matrix_elements(n: int) -> int:
    """Entries of one head's materialised n x n attention matrix."""
    return n * n


def kv_crossover(d_k: int, d_v: int, *, normalize: bool = True) -> int:
    """The longest sequence for which softmax's KV cache is no larger than a linear state.

    n * (d_k + d_v) <= d_k * d_v (+ d_k): for GPT-2 heads (d = 64) the cache 128 n against
    the state 4160 gives 32 (the cache overtakes the state from 33 tokens on).
    """
    return state_elements(d_k, d_v, normalize=normalize) // (d_k + d_v)
