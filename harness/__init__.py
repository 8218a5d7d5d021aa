"""recall-harness: a mechanistic evaluation harness for long-context recall.

Importing the package sets the process's allocator configuration (harness.allocator: glibc
keeps freed memory for reuse instead of unmapping it; HARNESS_MALLOC=system opts out), so
that the CLI, the benchmark and a notebook calling harness.ops all run alike.
"""

from harness import allocator

allocator.configure()
