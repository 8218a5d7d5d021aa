"""A run directory claimed by one process at a time: an advisory lock (fcntl.flock) on a file in it.

Two copies of the same sweep started at once on one directory (a SLURM array resubmitted, two
terminals) would otherwise both write each run directory. A job claims its directory before it
writes anything there; the lock belongs to the open file, so it is released when the job ends or
its process dies, however it dies (SIGKILL included), and never needs cleaning up.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_FILE = ".harness.lock"


class RunDirLock:
    """The claim on one run directory (which must exist)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def _open(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        return self._fd

    def try_acquire(self) -> bool:
        """Claim the directory if no other process holds it; True when claimed."""
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        self._mark()
        return True

    def acquire(self) -> None:
        """Claim the directory, waiting for the process that holds it to let go."""
        fcntl.flock(self._open(), fcntl.LOCK_EX)
        self._mark()

    def _mark(self) -> None:
        """Write our pid into the lock file, for the message another process shows."""
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def holder(self) -> str:
        """The pid written by the process holding the lock ('?' if it has not written it yet)."""
        try:
            return self.path.read_text().strip() or "?"
        except OSError:
            return "?"

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
