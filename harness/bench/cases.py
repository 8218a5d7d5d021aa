"""What is measured: one callable per (family, form, sequence length, pass), on random inputs.

Families are the mixer cores of harness.ops, on inputs laid out (batch, heads, time, dim):

  softmax        exact softmax attention: "parallel" is the fused kernel
                 (F.scaled_dot_product_attention), "recurrent" decodes token by token with a
                 KV cache (softmax_step; forward only)
  linear         normalised kernel attention on non-negative (feature-mapped) q, k
  decay_scalar   decayed attention, one log decay per head and step (RetNet, Mamba-2)
  decay_per_dim  decayed attention, one gate per key dimension (GLA)
  delta          the delta rule (DeltaNet): unit keys, beta in (0, 1)
  delta_gated    the delta rule with a scalar decay per head and step (Gated DeltaNet)

each linear family in its three forms "parallel", "chunk" and "recurrent". "fwd" runs the
forward pass without autograd; "fwdbwd" runs it with autograd and back-propagates a dense
random output gradient (o.backward(g), not o.sum().backward(): a zero-stride gradient takes
a slow path in CPU batched matmuls). Input gradients are reset before every call, so every
call allocates them afresh, as a training step does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from harness import ops
from harness.ops.cores import CORE_FORMS
from harness.layers.retnet import retnet_log_gammas

FAMILIES = tuple(CORE_FORMS)  # the cores of harness.ops (harness.ops.cores)
LINEAR_FAMILIES = tuple(f for f in FAMILIES if f != "softmax")  # a state of fixed size
DELTA_FAMILIES = ("delta", "delta_gated")
FORMS = CORE_FORMS
PASSES = ("fwd", "fwdbwd")
# Chunk lengths of the chunk forms when none is asked for: the fastest on the machines measured
# (docs/benchmarks.md); every length gives the same numbers.
DEFAULT_CHUNK = {f: 64 for f in LINEAR_FAMILIES}


@dataclass(frozen=True)
class Shape:
    batch: int
    heads: int
    seq_len: int
    d_key: int
    d_value: int

    @property
    def tokens(self) -> int:
        return self.batch * self.seq_len


def limit_flops(shape: Shape, pass_: str) -> float:
    """The essential arithmetic: write and read a (Dk, Dv) state, 4 Dk Dv flops per token and
    head forward; the backward pass doubles it (three times the forward in all)."""
    per = 4.0 * shape.d_key * shape.d_value * shape.heads * shape.tokens
    return per * (3.0 if pass_ == "fwdbwd" else 1.0)


def make_inputs(family: str, shape: Shape, device: torch.device, dtype: torch.dtype, *, seed: int = 0,
                retnet: bool = False) -> dict[str, torch.Tensor]:
    """Random inputs of a family's core: q, k, v (and log_decay), plus a dense output gradient.
    Drawn on the device itself: at GPU lengths a host-side draw would take longer than the calls."""
    g = torch.Generator(device=device).manual_seed(seed)
    b, h, t, dk, dv = shape.batch, shape.heads, shape.seq_len, shape.d_key, shape.d_value
    decay_dtype = torch.promote_types(dtype, torch.float32)

    def draw(*size, positive=False, dt=dtype):
        fn = torch.rand if positive else torch.randn
        return fn(*size, generator=g, device=device, dtype=dt)

    positive = family == "linear"  # feature-mapped keys and queries are non-negative
    inputs = {"q": draw(b, h, t, dk, positive=positive) * (1.0 / math.sqrt(dk)),
              "k": draw(b, h, t, dk, positive=positive), "v": draw(b, h, t, dv)}
    if family in DELTA_FAMILIES:  # as the mixers feed it: L2-normalised keys, beta = sigmoid(.)
        inputs["k"] = torch.nn.functional.normalize(inputs["k"], dim=-1)
        inputs["beta"] = torch.sigmoid(draw(b, h, t))
        if family == "delta_gated":  # Mamba-2's scalar decay, a in about (0.9, 1)
            inputs["log_decay"] = -0.1 * draw(b, h, t, positive=True, dt=decay_dtype)
    elif family == "decay_scalar":
        if retnet:  # RetNet: its constant decay gamma_h per head
            log_gamma = retnet_log_gammas(h).to(device=device, dtype=decay_dtype)
            ld = log_gamma.view(1, h, 1).expand(b, h, t).contiguous()
        else:  # Mamba-2 style: dt * A, a in about (0.9, 1)
            ld = -0.1 * draw(b, h, t, positive=True, dt=decay_dtype)
        inputs["log_decay"] = ld
    elif family == "decay_per_dim":  # GLA: logsigmoid(.)/16, a in about (0.98, 1)
        inputs["log_decay"] = torch.nn.functional.logsigmoid(draw(b, h, t, dk, dt=decay_dtype) + 3.0) / 16
    inputs["grad_out"] = draw(b, h, t, dv)
    return inputs


def forward_fn(family: str, form: str, chunk_size: int | None) -> Callable[..., torch.Tensor]:
    """The core's output o (B, H, T, Dv) from the inputs of :func:`make_inputs`."""
    if family == "softmax":
        if form == "parallel":
            return lambda q, k, v: ops.softmax_attention(q, k, v, causal=True)
        if form == "recurrent":
            return _softmax_decode
        raise ValueError(f"softmax has no {form!r} form")
    c = chunk_size or DEFAULT_CHUNK[family]
    if family == "linear":
        return lambda q, k, v: ops.linear_attention(q, k, v, form=form, chunk_size=c)
    if family in DELTA_FAMILIES:
        return lambda q, k, v, beta, log_decay=None: ops.delta_attention(q, k, v, beta, log_decay, form=form,
                                                                          chunk_size=c)
    return lambda q, k, v, log_decay: ops.decay_attention(q, k, v, log_decay, form=form, chunk_size=c)


def _softmax_decode(q, k, v):
    """Softmax attention token by token against a growing KV cache (what decoding costs)."""
    cache, outs = None, []
    for i in range(q.shape[2]):
        o, cache = ops.softmax_step(q[:, :, i], k[:, :, i], v[:, :, i], cache)
        outs.append(o)
    return torch.stack(outs, dim=2)


def supports(family: str, form: str, pass_: str) -> bool:
    if form not in FORMS[family]:
        return False
    return not (family == "softmax" and form == "recurrent" and pass_ == "fwdbwd")


def transient_bytes(family: str, form: str, shape: Shape, item: int) -> float:
    """A rough upper bound of what one call holds at once, to skip calls that cannot fit."""
    b, h, t, dk, dv = shape.batch, shape.heads, shape.seq_len, shape.d_key, shape.d_value
    io = 8.0 * b * h * t * max(dk, dv) * item
    if form == "parallel" and family != "softmax":
        per_dim = dk if family == "decay_per_dim" else 1
        return io + 4.0 * b * h * t * t * per_dim * item
    return io


@dataclass
class Case:
    """One measured call, with the tensors it needs; `run()` is what gets timed."""
    family: str
    form: str
    pass_: str
    shape: Shape
    chunk_size: int | None
    inputs: dict[str, torch.Tensor]
    fn: Callable[..., torch.Tensor]

    def leaves(self) -> list[torch.Tensor]:
        return [x for name, x in self.inputs.items() if name != "grad_out"]

    def run(self) -> None:
        args = self.leaves()
        if self.pass_ == "fwd":
            with torch.no_grad():
                self.fn(*args)
            return
        for x in args:
            x.grad = None
        o = self.fn(*args)
        g = self.inputs["grad_out"]
        o.backward(g if g.dtype == o.dtype else g.to(o.dtype))


def make_case(family: str, form: str, pass_: str, shape: Shape, device: torch.device, dtype: torch.dtype, *,
              chunk_size: int | None = None, retnet: bool = False, compile: bool = False,
              autocast: bool = False, inputs: dict[str, torch.Tensor] | None = None) -> Case:
    """A measured call. `inputs` (from make_inputs) may be shared by the cases of one family and
    length: leaves that require grad serve forward-only calls too, which run without autograd."""
    if inputs is None:
        inputs = make_inputs(family, shape, device, dtype, retnet=retnet)
    if pass_ == "fwdbwd":
        for name, x in inputs.items():
            if name != "grad_out":
                x.requires_grad_(True)
    fn = forward_fn(family, form, chunk_size)
    if compile:
        fn = torch.compile(fn, dynamic=False)
    if autocast:
        inner = fn

        def fn(*args):
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                return inner(*args)
    return Case(family, form, pass_, shape, chunk_size or (DEFAULT_CHUNK.get(family) if form == "chunk" else None),
                inputs, fn)
