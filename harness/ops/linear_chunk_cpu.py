"""The fused CPU kernel of the linear chunk form (csrc/linear_chunk_cpu.cpp), built on first use.

The batched form in harness.ops.linear_chunk streams every tensor through main memory once
per product; on a CPU that traffic, not the arithmetic, sets its speed. The fused kernel walks
each sequence chunk by chunk in one thread (the sequences in parallel), so a chunk's q, k, v
stay in cache through all of its products: the same mathematics, computed in the same order
per chunk, with the batched form as the oracle of its tests.

It is compiled with torch.utils.cpp_extension (about half a minute, cached in
~/.cache/torch_extensions) by scripts/setup.sh, or else on first use, and runs for float32 and
float64 CPU inputs.
Where it cannot be built or loaded (no compiler, a torch without its bundled MKL) the batched
form runs instead, after one warning. ``set_fused_cpu(False)`` or HARNESS_FUSED_CPU=0 turns
it off.
"""
from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import torch
from torch.autograd.function import once_differentiable

from .guards import check_finite_denominator

SOURCE = Path(__file__).parent / "csrc" / "linear_chunk_cpu.cpp"
DTYPES = (torch.float32, torch.float64)

_enabled = os.environ.get("HARNESS_FUSED_CPU", "1") != "0"
_module = None
_failed = False
_lock = threading.Lock()


def set_fused_cpu(enabled: bool) -> None:
    """Use the fused CPU kernel where it applies (True, the default) or always the batched form."""
    global _enabled
    _enabled = bool(enabled)


def fused_cpu_enabled() -> bool:
    return _enabled


def _load():
    """The compiled extension, or None (after one warning) when it cannot be built or loaded."""
    global _module, _failed
    with _lock:
        if _module is None and not _failed:
            try:
                from torch.utils.cpp_extension import load

                _module = load(name="harness_linear_chunk_cpu", sources=[str(SOURCE)],
                               extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"],
                               verbose=False)
            except Exception as exc:  # a missing compiler or BLAS symbol: the batched form works
                _failed = True
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
                print(f"[harness] warning: the fused CPU linear-attention kernel is unavailable "
                      f"({first[:200]}); using the batched chunk form", file=sys.stderr)
        return _module


def build() -> bool:
    """Compile (or load the cached build of) the kernel now; True when it is usable."""
    return _load() is not None


def applies(q: torch.Tensor) -> bool:
    """Whether (M, N, C, Dk) chunked inputs go to the fused kernel: CPU, float32/64, not
    while torch.compile traces. It beats the batched form from one chunk up (forward + backward
    0.5-0.7 of its time at training sizes, 0.78 at T = 4,096)."""
    return (_enabled and q.device.type == "cpu" and q.dtype in DTYPES
            and not torch.compiler.is_compiling() and _load() is not None)


class LinearChunkCPU(torch.autograd.Function):
    """Same signature and results as harness.ops.linear_chunk.LinearChunk."""

    @staticmethod
    def forward(ctx, q, k, v, s0, z0, exclusive: bool, eps: float | None, length: int):
        m, n, c, _ = q.shape
        normalize = eps is not None
        empty = q.new_empty(0)
        o, starts, z_starts, den, s_final, z_final = _module.forward(
            q, k, v, empty if s0 is None else s0, empty if z0 is None else z0, normalize,
            eps if normalize else 0.0, exclusive)
        if normalize:
            check_finite_denominator(den.view(m, n * c)[:, :length], "linear_attention")  # no padding
        ctx.save_for_backward(q, k, v, o, starts, z_starts, den)
        ctx.exclusive, ctx.eps = exclusive, eps
        return o, s_final, z_final

    @staticmethod
    @once_differentiable
    def backward(ctx, do, ds_final, dz_final):
        q, k, v, o, starts, z_starts, den = ctx.saved_tensors
        normalize = ctx.eps is not None
        dq, dk, dv, ds0, dz0 = _module.backward(
            q, k, v, o, starts, z_starts, den, do, ds_final, dz_final, normalize,
            ctx.eps if normalize else 0.0, ctx.exclusive)
        need = ctx.needs_input_grad
        return dq, dk, dv, ds0 if need[3] else None, dz0 if need[4] else None, None, None, None
