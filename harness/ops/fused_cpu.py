"""The fused CPU kernels of the chunk forms: building, loading, the switch.

The batched forms in harness.ops.linear.chunk, decay.chunk and delta.chunk stream every tensor
through main memory once per product; on a CPU that traffic, not the arithmetic, sets their
speed. The fused kernels walk each sequence chunk by chunk in one thread (the sequences in
parallel), so a chunk's q, k, v stay in cache through all of its products: the same
mathematics, with the batched forms as the oracles of their tests. Their autograd Functions
sit beside the batched ones (LinearChunkCPU; DecayChunkCPU for scalar and per-dimension gates;
the delta rule's in delta.chunk; the short convolution's in conv.forms). Each family's kernel
source sits in its folder (linear/linear_cpu.cpp, ...), the bindings and the shared header in
csrc/; csrc/chunk_cpu.h lists the files of the one extension module.

The extension is compiled with torch.utils.cpp_extension by
scripts/setup.sh, or else on first use, and runs for float32 and float64 CPU inputs. Its build
directory, under TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions), is named by a hash of
the sources' contents, the compiler flags, torch's version and Python's extension suffix
(:func:`build_key`), not by the extension's name, and the build compiles copies of the sources
kept there: two checkouts of the same code share one build and never rebuild each other's, and
different code never meets an old build. Once built, a process imports the module directly,
without the compiler, ninja or torch's `lock` file. Where it cannot be built or loaded (no
compiler, a torch without its bundled MKL, the `lock` of a build that was killed, another
process's build running past LOCK_WAIT_S) the batched forms run instead, after one warning.
``set_fused_cpu(False)`` or HARNESS_FUSED_CPU=0 turns it off.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import sys
import sysconfig
import threading
import time
from pathlib import Path

import torch

from harness.env import switch

# Every *.cpp in a folder of harness/ops (csrc/ and the families') is compiled; *.h files are
# included. The build copies them into one folder, so a file includes the header by its name alone.
ROOT = Path(__file__).parent
NAME = "harness_chunk_cpu"
LDFLAGS = ["-fopenmp"]
DTYPES = (torch.float32, torch.float64)
BUILT = "harness-built"  # in the build directory: the module's file name, once it has imported
# torch waits on its build directory's `lock` without end, and a process killed while building
# (SIGKILL, out of memory, a preempted job) leaves it behind. Builders here take an flock first,
# which the kernel releases when its holder dies: a `lock` found while holding it is a dead
# build's. Where the filesystem has no flock (some network mounts), a `lock` this old, or one
# waited on this long, is taken for one; and no process waits longer than this for another's
# build, which leaves room for a build on a busy machine.
LOCK_WAIT_S = 300.0
POLL_S = 0.2  # how often a waiting process looks again at the lock and at the build

_enabled = switch("HARNESS_FUSED_CPU")  # harness.env: 1/0, true/false, yes/no, on/off
_module = None
_failed = False
_lock = threading.Lock()


def set_fused_cpu(enabled: bool) -> None:
    """Use the fused CPU kernels where they apply (True, the default) or always the batched forms."""
    global _enabled
    _enabled = bool(enabled)


def fused_cpu_enabled() -> bool:
    return _enabled


def build_flags() -> list[str]:
    """The compiler flags. Where torch's own dispatch finds AVX2 (x86-64), the elementwise loops
    are built for it (8 floats at a time instead of SSE2's 4, for the short convolution and the
    gates' loops); the flags are part of the build key, so a cache shared with a machine without
    AVX2 never hands it that build."""
    import platform

    flags = ["-O3", "-fopenmp"]
    if platform.machine().lower() in ("x86_64", "amd64") and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        return flags + ["-mavx2", "-mfma"]
    return flags


def read_sources(root: Path | None = None) -> dict[str, bytes]:
    """The extension's source files under `root` (harness/ops; name -> contents), sorted by name.
    Keyed by file name alone, not folder: moving a file between folders is not a new build."""
    paths = sorted([*(root or ROOT).glob("*/*.cpp"), *(root or ROOT).glob("*/*.h")], key=lambda p: p.name)
    sources = {p.name: p.read_bytes() for p in paths}
    if len(sources) != len(paths):
        raise ValueError(f"two kernel sources under {root or ROOT} share a file name")
    return sources


def build_key(sources: dict[str, bytes], flags: list[str]) -> str:
    """What the compiled module depends on, hashed: the sources' names and contents, the flags,
    torch's version (its headers and ABI) and Python's extension suffix (its version and platform;
    TORCH_EXTENSIONS_DIR holds builds for every Python alike)."""
    digest = hashlib.sha256()
    for name, data in sources.items():
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    digest.update(json.dumps([flags, LDFLAGS, torch.__version__, sysconfig.get_config_var("EXT_SUFFIX")]).encode())
    return digest.hexdigest()[:16]


def build_directory(key: str) -> Path:
    """Where the build with this key lives (TORCH_EXTENSIONS_DIR is read at each call)."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if not root:  # torch's default; cpp_extension takes a good part of a second to import
        from torch.utils.cpp_extension import get_default_build_root

        root = get_default_build_root()
    return Path(root) / f"{NAME}-{key}"


def _import_built(directory: Path):
    """The module a finished build left in `directory`, or None where there is none."""
    try:
        filename = (directory / BUILT).read_text().strip()
    except FileNotFoundError:
        return None
    path = directory / filename
    if not filename or not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location(filename.split(".")[0], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write_new(path: Path, data: bytes) -> None:
    """Write `path` whole (a temporary file renamed over it) unless it already holds `data`: its
    time stamp then stays, so ninja sees nothing to rebuild."""
    if path.is_file() and path.read_bytes() == data:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@contextlib.contextmanager
def _builder_lock(path: Path, deadline: float):
    """One building process per build directory: yields True while holding an flock on `path`
    (released by the kernel when its holder dies, so it never goes stale), False on a filesystem
    without flock, where torch's own lock is all there is."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield False
        return
    with open(path, "a") as handle:  # closing it releases the flock
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"another process has been building {path.parent} for over "
                                       f"{LOCK_WAIT_S:.0f} s") from None
                time.sleep(POLL_S)
            except OSError:
                held = False
                break
        yield held


def _check_torch_lock(lock: Path, held: bool, deadline: float) -> None:
    """Return once torch's build lock is gone. Held under the builders' flock, a lock is a dead
    build's at once; without the flock, once it has stood LOCK_WAIT_S (by its age) or this process
    has waited that long (TimeoutError either way)."""
    while True:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return
        if held or age >= LOCK_WAIT_S or time.monotonic() >= deadline:
            raise TimeoutError(f"{lock} was left by a build that was killed or is stuck ({age:.0f} s ago); "
                               f"delete it if no build is running")
        time.sleep(POLL_S)


def _build_or_import():
    """The extension module: imported from its finished build, or built there first."""
    sources, flags = read_sources(), build_flags()
    directory = build_directory(build_key(sources, flags))
    module = _import_built(directory)
    if module is not None:
        return module
    deadline = time.monotonic() + LOCK_WAIT_S
    directory.mkdir(parents=True, exist_ok=True)
    with _builder_lock(directory / "builder.lock", deadline) as held:
        module = _import_built(directory)  # built by the process this one waited for
        if module is not None:
            return module
        _check_torch_lock(directory / "lock", held, deadline)
        src = directory / "src"  # the hashed bytes themselves: no checkout's path in build.ninja
        src.mkdir(exist_ok=True)
        for name, data in sources.items():
            _write_new(src / name, data)
        from torch.utils.cpp_extension import load

        module = load(name=NAME, sources=[str(src / name) for name in sources if name.endswith(".cpp")],
                      extra_cflags=flags, extra_ldflags=LDFLAGS, build_directory=str(directory), verbose=False)
        _write_new(directory / BUILT, Path(module.__file__).name.encode())
        return module


def _load():
    """The compiled extension, or None (after one warning) when it cannot be built or loaded."""
    global _module, _failed
    with _lock:
        if _module is None and not _failed:
            try:
                _module = _build_or_import()
            except Exception as exc:  # a missing compiler or BLAS symbol, a dead build's lock: the batched form works
                _failed = True
                last = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
                print(f"[harness] warning: the fused CPU chunk kernels are unavailable "
                      f"({last[:300]}); using the batched chunk forms", file=sys.stderr)
        return _module


def build() -> bool:
    """Compile (or load the cached build of) the kernels now; True when they are usable."""
    return _load() is not None


def applies(*tensors: torch.Tensor) -> bool:
    """Whether chunked inputs go to a fused kernel: CPU, one float32/64 dtype, not while
    torch.compile traces. No size threshold: the kernel keeps a chunk in cache however few chunks
    there are, so it is taken from one chunk up."""
    q = tensors[0]
    return (_enabled and q.device.type == "cpu" and q.dtype in DTYPES
            and all(t.dtype == q.dtype for t in tensors)
            and not torch.compiler.is_compiling() and _load() is not None)


def kernels():
    """The loaded extension (call after :func:`applies` said yes)."""
    return _module
