"""State-size accounting: what a mixer must keep per head to decode the next token.

Softmax keeps a KV cache that grows with the sequence (N keys and N values); linear and
decayed mixers keep a fixed-size state. Counts are elements per head (multiply by the
element size, heads and layers for bytes of a whole model).
"""

from __future__ import annotations

LINEAR_FAMILIES = ("linear", "identity", "elu", "elu1", "favor", "taylor", "kernel")
DECAY_FAMILIES = ("decay", "retnet", "mamba", "gla", "ssd")


def state_elements(family: str, d_k: int, d_v: int, *, normalize: bool = True) -> int:
    """Elements of the recurrent state per head for a linear-in-N family.

    Normalised linear attention (feature maps identity/elu/favor/taylor; d_k is the feature
    dimension m): S (d_k x d_v) plus z (d_k). Decayed mixers (retnet/mamba/gla) have no
    denominator: S only. Softmax has no fixed-size state: see :func:`kv_cache_elements`.
    """
    if family in LINEAR_FAMILIES:
        return d_k * d_v + (d_k if normalize else 0)
    if family in DECAY_FAMILIES:
        return d_k * d_v
    if family == "softmax":
        raise ValueError("softmax keeps a KV cache that grows with the sequence: use kv_cache_elements(n, d)")
    raise ValueError(f"unknown family {family!r}; expected one of {LINEAR_FAMILIES + DECAY_FAMILIES}")


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
    return state_elements("linear", d_k, d_v, normalize=normalize) // (d_k + d_v)
