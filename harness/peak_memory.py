"""Peak memory of one call: what the call allocates and holds at once, its inputs excluded
(a base module: the benchmarks and the evaluation of a training run both measure with it).

CUDA keeps exact books (torch.cuda.max_memory_allocated). On CPU nothing does, so a
dispatch mode follows every tensor storage that an operator returns while the call runs
(forward and backward), adds its bytes while it is alive and records the peak of the sum.
Storages that existed before the call (inputs, parameters) are not counted. The mode costs
a little time per operator, so memory is measured in its own, untimed call.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveMemory(TorchDispatchMode):
    """Peak bytes of tensor storage allocated under the mode and alive at the same time, and
    the largest single storage. ``exact`` keeps the peak exact (a sweep at every new peak);
    otherwise it is exact to within a margin of 1% (at least 64 KiB), which keeps token loops
    with many operators cheap to follow."""

    MIN_MARGIN = 1 << 16  # bytes
    RELATIVE_MARGIN = 0.01

    def __init__(self, existing: Iterable[torch.Tensor] = (), exact: bool = False):
        super().__init__()
        self.margin, self.exact = 0, exact
        self.known = {t.untyped_storage().data_ptr() for t in existing}
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.current = self.peak = self.largest = 0

    def _collect(self) -> None:
        for ptr, (ref, size) in list(self.live.items()):
            if ref.expired():
                del self.live[ptr]
                self.current -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view:  # a view allocates nothing
            return out
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                ptr = storage.data_ptr()
                if ptr and ptr not in self.known and (ptr not in self.live or self.live[ptr][0].expired()):
                    if ptr in self.live:  # freed, and its address reused
                        self.current -= self.live[ptr][1]
                    self.live[ptr] = (StorageWeakRef(storage), storage.nbytes())
                    self.current += storage.nbytes()
                    self.largest = max(self.largest, storage.nbytes())
        if self.current > self.peak + self.margin:
            # `current` may still count freed storage: sweep only at a clear new peak. The sweep
            # walks every live storage, so sweeping at each small new peak would be quadratic in
            # the number of operators of a token loop; the peak is exact to within the margin.
            self._collect()
            if self.current > self.peak:
                self.peak = self.current
                if not self.exact:
                    self.margin = max(self.MIN_MARGIN, int(self.RELATIVE_MARGIN * self.peak))
        return out


def peak_memory(fn: Callable[[], object], device: torch.device, existing: Iterable[torch.Tensor] = ()) -> int:
    """Peak bytes allocated by one call of fn beyond what was allocated before it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - base)
    with LiveMemory(existing) as mem:
        fn()
    return int(mem.peak)
