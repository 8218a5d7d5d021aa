"""Which device a run uses, how it runs there (its determinism settings), and how much memory it
has: the facts resource checks start from."""
from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path
from typing import Iterator

import torch
import torch.utils.deterministic

LIMIT_ENV = "HARNESS_MEMORY_LIMIT"  # e.g. "8GiB": a smaller limit than the device's (shared machines, tests)
_UNITS = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "KIB": 2**10, "M": 2**20, "MB": 2**20, "MIB": 2**20,
          "G": 2**30, "GB": 2**30, "GIB": 2**30, "T": 2**40, "TB": 2**40, "TIB": 2**40}


def select_device(spec: str) -> torch.device:
    """`trainer.device` as a torch.device: auto is CUDA when present, else the CPU. A CUDA
    device on a machine without one is a ValueError (bad input, refused before any work)."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"trainer.device={spec} but no CUDA device is available")
    return torch.device(spec)


def set_run_determinism(device: torch.device) -> None:
    """What every training run (solo or grouped) sets on a CPU: torch's deterministic algorithms,
    without the NaN fill of every fresh tensor that deterministic mode adds by default.

    The fill makes a read of uninitialised memory reproducible; no operator of a run reads one
    (tests/test_determinism_fill.py trains every built-in mixer with the fill on and off and finds
    the same losses and gradients to the bit), so it only costs time: at the findings shapes, a
    fill of every operator's output is 3-8% of a run's CPU time (docs/benchmarks.md)."""
    if device.type == "cpu":
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = False


@contextlib.contextmanager
def kept_determinism() -> Iterator[None]:
    """Restores torch's determinism settings on exit: for in-process callers of the training
    loops (the benchmarks, the tests), which set them (set_run_determinism)."""
    algorithms = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(algorithms, warn_only=warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = fill


def format_bytes(n: float) -> str:
    """Bytes for a person: '56 GiB', '1.5 GiB', '300 MiB'."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value >= 10 else f"{value:.1f} {unit}"
    return f"{n:.0f} B"


def parse_bytes(text: str) -> int:
    """'8GiB', '512 MB', '1e9' -> bytes (binary units either way); ValueError otherwise."""
    s = str(text).strip().upper().replace(" ", "")
    digits = s.rstrip("KMGTIB")
    unit = s[len(digits):]
    try:
        value = float(digits)
    except ValueError:
        value = -1.0
    size = value * _UNITS.get(unit, 0)
    if not (math.isfinite(size) and size > 0):  # infGiB, 1e300TiB: no int holds them
        raise ValueError(f"{LIMIT_ENV}={text!r}: expected a size such as 8GiB or 512MiB")
    return int(size)


def _cgroup_limit() -> int | None:
    """The memory limit of this process's cgroup (a container, a SLURM job), if it sets one."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:
            return int(text)
    return None


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


def memory_limit(device: torch.device | str) -> tuple[int, str]:
    """(bytes, what they are) the device can hold: CUDA's total memory on a GPU; on the CPU the
    machine's RAM, or its cgroup's limit where that is lower. $HARNESS_MEMORY_LIMIT lowers it."""
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        limit, what = torch.cuda.get_device_properties(index).total_memory, f"GPU {device}"
    else:
        limit, what = _physical_memory(), "this machine"
        cgroup = _cgroup_limit()
        if cgroup is not None and cgroup < limit:
            limit, what = cgroup, "this job's memory limit (cgroup)"
    if os.environ.get(LIMIT_ENV):
        cap = parse_bytes(os.environ[LIMIT_ENV])
        if cap < limit:
            limit, what = cap, f"the limit {LIMIT_ENV}"
    return limit, what


def check_fits(what: str, need: float, device: torch.device | str) -> None:
    """ResourceError (one line, exit code 2) when ``need`` bytes exceed what the device holds."""
    from harness.errors import ResourceError

    limit, where = memory_limit(device)
    if need > limit:
        raise ResourceError(f"{what} needs about {format_bytes(need)}; {where} has {format_bytes(limit)}")
