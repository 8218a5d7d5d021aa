"""Wall-clock timing that is honest on a shared, noisy machine, and the GEMM rate that defines the limit.

A single timing on a machine shared with other jobs says little. Every figure here is a
median of several samples, and the samples of different cells are interleaved (each round
measures every cell once, in a new random order) so that a burst of load elsewhere hits all
cells alike instead of one, and no cell always runs after the same neighbour. On CUDA every
sample is bracketed by synchronisations: kernels are asynchronous.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Callable, Hashable

import torch

GEMM_N = 1024  # the large float32 GEMM whose rate is the machine's best arithmetic rate


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_once(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds for one call of fn, all queued device work included."""
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def gemm_sampler(device: torch.device, dtype: torch.dtype = torch.float32, n: int = GEMM_N) -> Callable[[], float]:
    """A function returning one sample of the rate (flop/s) of an n x n x n GEMM into a preallocated output."""
    g = torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn(n, n, generator=g, device=device, dtype=dtype) for _ in range(2))
    out = torch.empty(n, n, device=device, dtype=dtype)
    torch.mm(a, b, out=out)  # warm the library (first calls pick kernels, fault pages in)

    def sample() -> float:
        # Several products per sample so that one sample is long enough to time on a GPU.
        reps = 1 if device.type == "cpu" else 100
        elapsed = time_once(lambda: [torch.mm(a, b, out=out) for _ in range(reps)], device)
        return 2.0 * n**3 * reps / elapsed

    return sample


def interleaved(cells: dict[Hashable, Callable[[], object]], rounds: int, device: torch.device, *,
                gemm: Callable[[], float] | None = None, warmup: int = 1,
                on_round: Callable[[int], None] | None = None) -> tuple[dict[Hashable, list[float]], list[float]]:
    """Time every cell `rounds` times, one sample of each per round; returns samples per cell
    and the GEMM rate samples (one per round, taken between the cells) when `gemm` is given."""
    for _ in range(warmup):
        for fn in cells.values():
            fn()
    sync(device)
    samples: dict[Hashable, list[float]] = {key: [] for key in cells}
    rates: list[float] = []
    keys = list(cells)
    order = random.Random(0)
    for r in range(rounds):
        order.shuffle(keys)  # a new order every round: no cell always follows the same one
        for key in keys:
            samples[key].append(time_once(cells[key], device))
        if gemm is not None:
            rates.append(gemm())
        if on_round is not None:
            on_round(r)
    return samples, rates


def median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")
