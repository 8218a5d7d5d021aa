"""Failures that end a run for a reason one line can state.

`harness.run.job` prints such an error as one line (`harness: error: ...`, exit code 1) and
records it in results.json; anything else is a bug and keeps its traceback. Configuration
errors are ValueErrors (exit code 2) and are raised before any work starts.
"""
from __future__ import annotations

import os


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
