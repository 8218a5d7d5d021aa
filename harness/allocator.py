"""The process's memory allocator: glibc told to keep freed memory, once, when harness is imported.

By default glibc's malloc serves every block above its mmap threshold (128 KB, rising with
use to at most 32 MB) with a fresh mmap and unmaps it on free, and it returns the top of the
heap to the system once more than 128 KB is free there. A tensor of a training step or a
benchmark call at long sequences (33.5 MB for (8, 4, 4,096, 64) float32) is then new memory
on every call, its pages faulting in one at a time on first touch: at T = 4,096 that cost
about a third of the linear chunk form's forward + backward (docs/benchmarks.md). GPU caching
allocators never pay it, and nor should a CPU run.

:func:`configure` raises both thresholds with mallopt (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD) to
2 GiB - 1, the largest value mallopt takes, so freed blocks stay in the heap for the next
call (after a few calls: the first blocks of a size are not reused while the few bytes that
torch's aligned allocations give back wait in glibc's thread cache between them and the top of
the heap, until that cache holds its 7 entries). The same settings the MALLOC_MMAP_THRESHOLD_ /
MALLOC_TRIM_THRESHOLD_ environment variables give, but at runtime, so every process that
imports harness runs alike: the CLI,
Hydra's launchers, the benchmark and a notebook calling harness.ops. The price: memory a run
freed stays with the process (its peak, not its current use, is what the system sees).

Linux with glibc only; elsewhere nothing happens. A threshold the environment sets already
(MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_) is left to it. HARNESS_MALLOC=system (or 0, false,
no, off) before the import keeps glibc's defaults.
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any

from harness.env import EnvironmentSwitchError, switch

OPT_OUT_ENV = "HARNESS_MALLOC"  # a switch (harness.env): 0, false, no, off or system leave the allocator as it is
THRESHOLD = 2**31 - 1  # bytes; mallopt's value is a C int
# mallopt's parameter numbers (malloc.h) and the environment variables glibc reads for them.
PARAMETERS = {"mmap_threshold": (-3, "MALLOC_MMAP_THRESHOLD_"), "trim_threshold": (-1, "MALLOC_TRIM_THRESHOLD_")}

_state: dict[str, Any] = {"configured": False, "reason": "not yet configured"}


def glibc_library():
    """The C library when it is glibc (it has gnu_get_libc_version), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        return libc
    except (OSError, AttributeError):  # musl and other C libraries have no gnu_get_libc_version
        return None


def configure() -> dict[str, Any]:
    """Set the thresholds (once per process; later calls return the first answer) and return
    what was done: {"configured", "reason", "glibc", the thresholds set, those the environment set}."""
    if _state["reason"] != "not yet configured":
        return dict(_state)
    try:
        wanted = switch(OPT_OUT_ENV)
    except EnvironmentSwitchError as exc:
        # at import a refusal would be a traceback: the allocator is left as it is, the reason
        # recorded, and the command line refuses the value in one line (harness.run.precheck)
        _state.update(configured=False, reason=str(exc))
        return dict(_state)
    if not wanted:
        _state.update(configured=False, reason=f"{OPT_OUT_ENV}={os.environ[OPT_OUT_ENV].strip()}")
        return dict(_state)
    libc = glibc_library()
    if libc is None:
        _state.update(configured=False, reason="not Linux with glibc")
        return dict(_state)
    _state.update(glibc=libc.gnu_get_libc_version().decode(), set={}, from_environment={})
    for name, (param, env) in PARAMETERS.items():
        if env in os.environ:
            _state["from_environment"][name] = os.environ[env]
        elif libc.mallopt(param, THRESHOLD) == 1:
            _state["set"][name] = THRESHOLD
    done = bool(_state["set"]) or bool(_state["from_environment"])
    _state.update(configured=done, reason="mallopt at import" if _state["set"] else
                  ("environment" if done else "mallopt refused the thresholds"))
    return dict(_state)


def allocator_state() -> dict[str, Any]:
    """What :func:`configure` did in this process (for benchmark and run records)."""
    return dict(_state)
