"""Measured cost of every mixer core: `python -m harness.bench` (see docs/benchmarks.md).

Time and peak memory of each family and form against sequence length, each held against
the physical limit (the essential 4 Dk Dv flops per token and head at the rate of a large
GEMM measured in the same run); the length from which the chunk form beats the parallel
one; decoding cost against context; and the efficiency of the real training loop.
"""
