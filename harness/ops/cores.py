"""The mixer cores of harness.ops by the name a mixer declares as its `core`, and the forms each
core has (softmax's "recurrent" is decoding against a KV cache; it has no chunk form)."""

CORE_FORMS = {
    "softmax": ("parallel", "recurrent"),
    "linear": ("parallel", "chunk", "recurrent"),
    "decay_scalar": ("parallel", "chunk", "recurrent"),
    "decay_per_dim": ("parallel", "chunk", "recurrent"),
    "delta": ("parallel", "chunk", "recurrent"),
    "delta_gated": ("parallel", "chunk", "recurrent"),
}
