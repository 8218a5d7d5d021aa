"""Peak memory of one call (harness.memory, kept here for the benchmarks that import it)."""

from harness.memory import LiveMemory, peak_memory

__all__ = ["LiveMemory", "peak_memory"]
