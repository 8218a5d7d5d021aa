"""Failures that end a run for a reason one line can state.

`harness.run.job` prints such an error as one line (`harness: error: ...`, exit code 1) and
records it in results.json; anything else is a bug and keeps its traceback. Configuration
errors are ValueErrors (exit code 2) and are raised before any work starts.
"""
from __future__ import annotations

import os
import re
import sys
from contextlib import contextmanager
from typing import Hashable, NoReturn


class RunError(RuntimeError):
    """A run that cannot go on; ``record`` holds extra fields for its results.json."""

    def __init__(self, message: str, **record) -> None:
        super().__init__(message)
        self.record = record


class OutputError(RunError):
    """The output directory cannot be written: missing, not a directory, unwritable, full."""


def in_one_line(exc: BaseException) -> bool:
    """Whether exc is reported as one line: bad input (ValueError) and run errors, unless
    HYDRA_FULL_ERROR=1 (Hydra's own switch, honoured everywhere) asks for the traceback."""
    return isinstance(exc, (ValueError, RunError)) and os.environ.get("HYDRA_FULL_ERROR") != "1"


def refuse(message: object, code: int = 2) -> NoReturn:
    """The command line's one way to stop with a reason: `harness: error: <message>` (shown: long
    values cut) on stderr, and exit ``code`` (2 bad input, 1 a run error, 128+n a signal)."""
    print(f"harness: error: {shown(message)}", file=sys.stderr)
    raise SystemExit(code) from None


@contextmanager
def refusing(code: int = 2):
    """Turn an error that is said in one line (in_one_line) into :func:`refuse`: bad input with
    ``code``, a run error with 1; anything else keeps its traceback."""
    try:
        yield
    except (ValueError, RunError) as exc:
        if not in_one_line(exc):
            raise
        refuse(exc, code if isinstance(exc, ValueError) else 1)


class DamagedFile(ValueError):
    """A file the harness wrote earlier that no longer matches its checksum or does not load
    (truncated by a full disk, cut short by a partial copy, a flipped bit)."""


class OutOfMemory(RunError, MemoryError):
    """An allocation failed mid-run although the estimate before it fitted."""


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether exc is an allocation failure: CUDA's OutOfMemoryError, Python's MemoryError, or
    the RuntimeError the CPU allocator raises ("DefaultCPUAllocator: can't allocate memory")."""
    import torch

    if isinstance(exc, OutOfMemory):
        return False  # already reported as one
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in str(exc)
                                              or "out of memory" in str(exc).lower()[:200])


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message, at most `limit` characters."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


# An error line names the value it refuses, and a value can be anything a user typed or a file
# held (a 100,000-character model.name): what is printed keeps each value's start and end.
LONG_VALUE = 400   # characters of one unbroken value (no spaces) shown whole; a long path still fits
LONG_LINE = 2000   # characters of a whole message shown whole


def _cut(text: str, limit: int) -> str:
    keep_head, keep_tail = limit * 2 // 3, limit // 5
    return f"{text[:keep_head]}...[{len(text) - keep_head - keep_tail:,} characters]...{text[-keep_tail:]}"


def shown(message: object) -> str:
    """A message as the user sees it: every unbroken run of more than LONG_VALUE characters, and
    then the whole message if it is still over LONG_LINE, cut in the middle, saying how much."""
    text = re.sub(r"\S{%d,}" % (LONG_VALUE + 1), lambda m: _cut(m.group(0), LONG_VALUE), str(message))
    return text if len(text) <= LONG_LINE else _cut(text, LONG_LINE)


class ResourceError(ValueError):
    """A request the device cannot hold, refused before any allocation with the estimate and the
    limit (bad input for this machine: exit code 2)."""


_SAID: set = set()  # the `once` keys of the warnings said in this process


def warn(message: str, once: Hashable | None = None) -> None:
    """A one-line warning on stderr (`harness: warning: ...`), the run going on; with ``once``,
    only the first warning under that key in this process (a sweep's launcher validates every
    job's config, and one line says it)."""
    if once is not None:
        if once in _SAID:
            return
        _SAID.add(once)
    print(f"harness: warning: {message}", file=sys.stderr, flush=True)
