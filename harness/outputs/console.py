"""The run's own stdout, kept from ending a run when its reader goes away.

`python -m harness ... | head` closes the pipe after a few lines; the next print would raise
BrokenPipeError inside the training run, which would then be recorded as failed though it had
trained (or had finished and written its results). Output to a reader that has left is dropped
instead, as Python's documentation advises (stdout pointed at os.devnull), and the run goes on.
"""
from __future__ import annotations

import os
import sys
from typing import Any, TextIO


class ReaderSafeStream:
    """A text stream whose writes and flushes stop, silently, once its pipe is closed."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def _reader_left(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())  # the interpreter's last flush goes nowhere too
        finally:
            os.close(devnull)
        self._stream = open(os.devnull, "w")

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._reader_left()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._reader_left()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def keep_running_when_the_reader_leaves() -> None:
    """Wrap sys.stdout (once) so that a closed pipe drops output instead of failing the run."""
    if not isinstance(sys.stdout, ReaderSafeStream) and sys.stdout is not None:
        sys.stdout = ReaderSafeStream(sys.stdout)
