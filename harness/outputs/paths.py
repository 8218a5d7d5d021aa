"""Where a path a user gave leads, and whether the harness may write there.

Two questions every writer asks, answered once:

- `user_path(value)`: a relative path a user typed (`out_dir`, `trainer.resume`, `ablate.run`)
  means the directory the command was started in. Hydra's `hydra.job.chdir=true` moves a job
  into its run directory before the job reads its config, so the same relative path would name
  a second place (`rel/rel/`) and the checks made before Hydra started (a finished run there)
  would look at the first. Resolved against the launch directory, both are the one place.
- `check_destination(what, path)`: a place that can be a directory this process writes in, with
  names the file system takes, and not inside the package's own config folder (harness/conf:
  a file written there becomes a config, or replaces one). One line naming `what` otherwise.
"""
from __future__ import annotations

import os
from pathlib import Path

from harness.conf import CONF_DIR

NAME_MAX = 255  # bytes in one path component where the file system does not say (ext4, xfs, tmpfs)


class DestinationError(ValueError):
    """A place the harness will not write in; its message is one line naming the key or flag."""


def launch_dir() -> Path:
    """The directory the command was started in: Hydra's record of it while a Hydra job runs
    (the job may have moved into its run directory), the current directory otherwise."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.cwd)
    except (ImportError, ValueError, AttributeError):
        return Path.cwd()


def user_path(value: str | os.PathLike) -> Path:
    """A path as the user meant it: absolute as given, or relative to the launch directory.
    Where the job still runs there, a relative path stays relative (as printed before)."""
    path = Path(value)
    if path.is_absolute():
        return path
    launched = launch_dir()
    return path if launched.resolve() == Path.cwd().resolve() else launched / path


def inside_config(path: Path) -> bool:
    """Whether ``path`` (followed through links as far as it exists) lies in harness/conf."""
    conf = Path(os.path.realpath(CONF_DIR))
    where = Path(os.path.realpath(path))  # a link into the package counts as the package; never raises
    return where == conf or conf in where.parents


def refuse_config_folder(what: str, path: Path) -> None:
    """DestinationError (one line naming ``what``) when ``path`` lies in harness/conf."""
    if inside_config(path):
        raise DestinationError(f"{what} {path} is inside the harness's own config folder ({CONF_DIR}), "
                               "where a file written becomes a config or replaces one; choose a folder "
                               "outside the package")


def _name_max(place: Path) -> int:
    try:
        return int(os.pathconf(place, "PC_NAME_MAX"))
    except (OSError, ValueError):
        return NAME_MAX


def check_destination(what: str, path: str | os.PathLike) -> None:
    """DestinationError (one line naming ``what``) unless ``path`` can be a directory this
    process writes in: outside the package's config folder, not a file, not a symbolic link that
    leads nowhere (a loop, a dangling link), each name it adds short enough for the file system,
    below a writable directory."""
    path = Path(path)
    refuse_config_folder(what, path)
    # os.path's tests say False where pathlib's raise (a name too long, a loop): the walk never fails
    if os.path.islink(path) and not os.path.exists(path):
        raise DestinationError(f"{what} {path} is a symbolic link that leads nowhere (a loop or a missing target)")
    place, new = path, []
    while not os.path.exists(place):
        if os.path.islink(place):
            raise DestinationError(f"{what} {path}: {place} is a symbolic link that leads nowhere")
        new.append(place.name)
        place = place.parent
    if not place.is_dir():
        raise DestinationError(f"{what} {path} cannot be a directory: {place} is a file")
    longest = max(new, key=lambda name: len(os.fsencode(name)), default="")
    limit = _name_max(place)
    if len(os.fsencode(longest)) > limit:
        shown = longest if len(longest) <= 60 else f"{longest[:40]}...{longest[-12:]}"
        raise DestinationError(f"{what} {path} cannot be made: its name {shown!r} is "
                               f"{len(os.fsencode(longest)):,} bytes, more than the {limit} this file "
                               "system takes; choose a shorter one")
    if not os.access(place, os.W_OK | os.X_OK):  # a read-only mount too (EROFS)
        raise DestinationError(f"{what} {path} cannot be written: {place} is read-only for this user")
