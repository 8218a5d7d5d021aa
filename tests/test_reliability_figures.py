"""`python -m analysis.figures` killed mid-write or meeting a full disk: every figure file left
under its own name is a complete one (the previous or the new), a full disk is one line, and
no temporary file stays behind to keep the disk full.

The kill is made deterministic: the command runs under a wrapper that counts the bytes written
into the output folder through Python's open() and, once a chosen number is reached, writes
part of the current piece and sends the process SIGKILL or SIGTERM. The wrapper knows nothing
of how the figures are written, so it stops the old direct writes and the new temporary files
alike at the same byte.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_results, tmpfs

REPO = Path(__file__).resolve().parents[1]
COMMAND = ["--only", "induction"]

KILLER = r'''
import builtins, io, os, runpy, signal, sys

out, limit, sig = os.path.abspath(sys.argv[1]), int(sys.argv[2]), getattr(signal, sys.argv[3])
real_open, written = io.open, [0]


class Counted:
    def __init__(self, f):
        self._f = f

    def write(self, data):
        room = limit - written[0]
        if len(data) >= room:
            self._f.write(data[:max(room, 0)])
            self._f.flush()
            os.kill(os.getpid(), sig)
            signal.pause()
        written[0] += len(data)
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __iter__(self):
        return iter(self._f)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)


def counted_open(file, mode="r", *args, **kwargs):
    f = real_open(file, mode, *args, **kwargs)
    if isinstance(file, (str, bytes, os.PathLike)) and any(c in mode for c in "wax+") \
            and os.path.abspath(os.fsdecode(file)).startswith(out + os.sep):
        return Counted(f)
    return f


builtins.open = io.open = counted_open
sys.argv = ["analysis.figures", "--out", out, *sys.argv[4:]]
runpy.run_module("analysis.figures", run_name="__main__")
'''


def _figures(out: Path, results: Path, limit: int | None = None, sig: str = "SIGKILL", timeout: int = 120):
    env = dict(os.environ, PYTHONPATH=str(REPO), MPLBACKEND="Agg", WANDB_MODE="disabled")
    if limit is None:
        cmd = [sys.executable, "-m", "analysis.figures", "--out", str(out)]
    else:
        cmd = [sys.executable, "-c", KILLER, str(out), str(limit), sig]
    return subprocess.run([*cmd, "--results", str(results), *COMMAND], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)


def _complete(path: Path, reference: Path) -> bool:
    """Whether a figure file is whole: a PNG that ends in its IEND chunk, a PDF that ends in
    %%EOF, a CSV equal to the uninterrupted run's (the tables are deterministic)."""
    data = path.read_bytes()
    if path.suffix == ".png":
        return data.startswith(b"\x89PNG") and data.endswith(b"IEND\xaeB`\x82")
    if path.suffix == ".pdf":
        return data.startswith(b"%PDF") and data.rstrip().endswith(b"%%EOF")
    return data == reference.read_bytes()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The induction sweep's results and the figure files of an uninterrupted command."""
    root = tmp_path_factory.mktemp("figs")
    results = make_results.write_results_tree(root / "results", experiments=("induction",))
    out = root / "reference"
    proc = _figures(out, results)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = sorted(p for p in out.iterdir() if not p.name.startswith("."))
    assert {p.suffix for p in files} == {".png", ".pdf", ".csv"}, files
    return results, out, files


@pytest.mark.parametrize("sig,fraction", [("SIGKILL", 0.02), ("SIGKILL", 0.6), ("SIGTERM", 0.95)])
def test_a_killed_figure_command_leaves_only_complete_files(reference, tmp_path, sig, fraction):
    results, ref_out, files = reference
    total = sum(p.stat().st_size for p in files)
    out = tmp_path / "out"
    shutil.copytree(ref_out, out)  # the previous complete set, which the killed command rewrites
    proc = _figures(out, results, limit=int(total * fraction), sig=sig)
    assert proc.returncode == -getattr(__import__("signal"), sig), (proc.returncode, proc.stderr[-2000:])
    for ref in files:
        path = out / ref.name
        assert path.exists() and _complete(path, ref), f"{path.name} is partial after {sig} at {fraction:.0%}"
    finals = {p.name for p in out.iterdir() if p.suffix in (".png", ".pdf", ".csv")}
    assert finals == {p.name for p in files}


def test_a_killed_first_figure_command_leaves_no_partial_file(reference, tmp_path):
    """No previous set: what the command leaves is complete files or none."""
    results, _, files = reference
    total = sum(p.stat().st_size for p in files)
    out = tmp_path / "out"
    proc = _figures(out, results, limit=total // 3)
    assert proc.returncode == -9, proc.stderr[-2000:]
    left = {p.name: p for p in out.iterdir() if p.suffix in (".png", ".pdf", ".csv")}
    assert len(left) < len(files)
    for ref in files:
        assert ref.name not in left or _complete(left[ref.name], ref), f"{ref.name} is partial"


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MB tmpfs at tmp_path/disk; skipped where mounting is not allowed."""
    with tmpfs(tmp_path / "disk", "size=1m") as where:
        yield where


def test_a_full_disk_while_writing_figures_is_one_line(reference, small_disk):
    results, _, files = reference
    out = small_disk / "out"
    out.mkdir()
    free = shutil.disk_usage(small_disk).free
    with open(small_disk / "filler", "wb") as f:  # room for less than the first figure file
        try:
            f.write(b"\0" * max(free - min(p.stat().st_size for p in files if p.suffix == ".png") // 2, 0))
        except OSError:
            pass
    proc = _figures(out, results)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "No space left on device" in errors[0], proc.stderr[-3000:]
    left = list(out.iterdir())
    assert not [p for p in left if p.name.endswith(".tmp")], left  # nothing keeps the disk full
    for path in left:
        ref = next(r for r in files if r.name == path.name)
        assert _complete(path, ref), f"{path.name} is partial"
