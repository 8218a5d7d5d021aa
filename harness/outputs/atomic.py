"""The harness's one way to write a file: to a temporary name beside it, then renamed into place,
so a reader (or a rerun after SIGKILL) sees the old file or the new one, never half of one."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from harness.errors import OutputError


def temporary_path(path: Path) -> Path:
    """Where ``path`` is written before it is renamed into place: ``<name>.tmp`` beside it (a
    stray one, left by a killed process, is simply written over), or, when something that is
    not a file sits at that name (a directory), a fresh name beside it, so that it is never in
    the way and never removed."""
    import tempfile

    tmp = path.with_name(path.name + ".tmp")
    if not os.path.lexists(tmp) or tmp.is_symlink() or tmp.is_file():
        return tmp
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    return Path(name)


def discard(tmp: Path) -> None:
    """Remove a temporary file of ours after a failed write (never a directory); a failure here
    must not hide the one being reported."""
    try:
        if tmp.is_symlink() or tmp.is_file():
            tmp.unlink()
    except OSError:
        pass


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` then rename tmp onto path: readers (and a rerun after SIGKILL) see
    the old file or the new one, never half of one. An OSError (unwritable directory, full
    disk, a directory where the file should go) leaves no temporary file behind and becomes an
    OutputError naming the file; an interruption (Ctrl-C) leaves none behind either."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = temporary_path(path)
        write(tmp)
        with open(tmp, "rb") as f:  # on disk before the rename, so a crash cannot expose a hole
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        discard(tmp)
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from exc
    except BaseException:  # Ctrl-C or a stop signal mid-write: the old file stays, no temporary one
        discard(tmp)
        raise


def write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))


def write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda tmp: tmp.write_bytes(data))
