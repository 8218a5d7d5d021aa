"""The fused CPU kernels of the chunk forms (csrc/): building, loading, the switch.

The batched forms in harness.ops.linear_chunk and harness.ops.decay_chunk stream every tensor
through main memory once per product; on a CPU that traffic, not the arithmetic, sets their
speed. The fused kernels walk each sequence chunk by chunk in one thread (the sequences in
parallel), so a chunk's q, k, v stay in cache through all of its products: the same
mathematics, with the batched forms as the oracles of their tests. Their autograd Functions
sit beside the batched ones (LinearChunkCPU; DecayChunkCPU for scalar and per-dimension gates).

The extension is compiled with torch.utils.cpp_extension (about half a minute, cached in
~/.cache/torch_extensions) by scripts/setup.sh, or else on first use, and runs for float32 and
float64 CPU inputs. Where it cannot be built or loaded (no
compiler, a torch without its bundled MKL) the batched forms run instead, after one warning.
``set_fused_cpu(False)`` or HARNESS_FUSED_CPU=0 turns it off.
"""
from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import torch

CSRC = Path(__file__).parent / "csrc"
SOURCES = tuple(sorted(CSRC.glob("*.cpp")))  # one extension module (csrc/chunk_cpu.h lists its files)
DTYPES = (torch.float32, torch.float64)

_enabled = os.environ.get("HARNESS_FUSED_CPU", "1") != "0"
_module = None
_failed = False
_lock = threading.Lock()


def set_fused_cpu(enabled: bool) -> None:
    """Use the fused CPU kernels where they apply (True, the default) or always the batched forms."""
    global _enabled
    _enabled = bool(enabled)


def fused_cpu_enabled() -> bool:
    return _enabled


def build_flags() -> tuple[str, list[str]]:
    """The extension's name and compiler flags. Where torch's own dispatch finds AVX2 (x86-64), the
    elementwise loops are built for it (8 floats at a time instead of SSE2's 4: the short
    convolution and the gates' loops take about half the time), under a name of their own, so a
    cache shared with a machine without AVX2 never hands it that build."""
    import platform

    flags = ["-O3", "-fopenmp"]
    if platform.machine().lower() in ("x86_64", "amd64") and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        return "harness_chunk_cpu_avx2", flags + ["-mavx2", "-mfma"]
    return "harness_chunk_cpu", flags


def _load():
    """The compiled extension, or None (after one warning) when it cannot be built or loaded."""
    global _module, _failed
    with _lock:
        if _module is None and not _failed:
            try:
                from torch.utils.cpp_extension import load

                name, flags = build_flags()
                _module = load(name=name, sources=[str(p) for p in SOURCES], extra_cflags=flags,
                               extra_ldflags=["-fopenmp"], verbose=False)
            except Exception as exc:  # a missing compiler or BLAS symbol: the batched form works
                _failed = True
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
                print(f"[harness] warning: the fused CPU chunk kernels are unavailable "
                      f"({first[:200]}); using the batched chunk forms", file=sys.stderr)
        return _module


def build() -> bool:
    """Compile (or load the cached build of) the kernels now; True when they are usable."""
    return _load() is not None


def applies(*tensors: torch.Tensor) -> bool:
    """Whether chunked inputs go to a fused kernel: CPU, one float32/64 dtype, not while
    torch.compile traces. The linear kernel beats the batched form from one chunk up (forward +
    backward 0.5-0.7 of its time at training sizes, 0.78 at T = 4,096)."""
    q = tensors[0]
    return (_enabled and q.device.type == "cpu" and q.dtype in DTYPES
            and all(t.dtype == q.dtype for t in tensors)
            and not torch.compiler.is_compiling() and _load() is not None)


def kernels():
    """The loaded extension (call after :func:`applies` said yes)."""
    return _module
