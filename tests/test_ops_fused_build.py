"""The fused kernels' build: keyed by what it is built from, shared by two checkouts of the same
code, and never stuck behind a dead build's lock. Only the suite's own build is compiled (the
first test reuses it); everything else stops before the compiler."""
import errno
import fcntl
import shutil
import threading

import pytest
import torch

import harness.ops.fused_cpu as fused
from harness.ops.linear.chunk import linear_chunk


def checkout(tmp_path, name):
    """The kernels' sources (harness/ops/*/*.cpp, *.h) as another clone or worktree holds them."""
    return shutil.copytree(fused.ROOT, tmp_path / name / "harness" / "ops",
                           ignore=shutil.ignore_patterns("*.py", "__pycache__"))


def new_process(monkeypatch, root=None):
    """The module's state as a process that has not loaded the kernels yet has it."""
    monkeypatch.setattr(fused, "_module", None)
    monkeypatch.setattr(fused, "_failed", False)
    if root is not None:
        monkeypatch.setattr(fused, "ROOT", root)


def no_compiling(monkeypatch):
    """Every call of torch's load (which builds) recorded and refused."""
    import torch.utils.cpp_extension as cpp

    calls = []

    def load(**kwargs):
        calls.append(kwargs)
        raise RuntimeError("the extension was built again")

    monkeypatch.setattr(cpp, "load", load)
    return calls


def load_within(seconds):
    """fused._load() in a thread, so that a wait without end fails the test instead of hanging it."""
    result = {}
    worker = threading.Thread(target=lambda: result.update(module=fused._load()), daemon=True)
    worker.start()
    worker.join(timeout=seconds)
    assert not worker.is_alive(), "still waiting for the build lock"
    return result["module"]


def ran_batched():
    """Whether the linear chunk form took the batched path (the fused one's Function differs)."""
    q, k, v = (torch.rand(2, 3, 8, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = linear_chunk(q, k, v, None, None, False, None)
    return type(out[0].grad_fn).__name__ == "LinearChunkBackward"


def test_two_checkouts_share_one_build_and_neither_builds_again(tmp_path, monkeypatch):
    if fused._load() is None:
        pytest.skip("the fused kernel could not be built here")
    flags = fused.build_flags()
    built = fused.build_directory(fused.build_key(fused.read_sources(), flags))
    assert (built / fused.BUILT).is_file()
    calls = no_compiling(monkeypatch)
    clone, worktree = checkout(tmp_path, "clone"), checkout(tmp_path, "worktree")
    for root in (clone, worktree, clone, worktree):  # alternately, as two checkouts' runs go
        new_process(monkeypatch, root)
        assert fused.build_directory(fused.build_key(fused.read_sources(root), flags)) == built
        assert fused._load() is not None and not ran_batched()
    assert calls == []


@pytest.mark.parametrize("flock", [True, False], ids=["flock", "no-flock"])
def test_a_dead_builds_lock_costs_at_most_the_limit_and_one_warning(tmp_path, monkeypatch, capsys, flock):
    """Under the builders' flock a leftover `lock` is a dead build's at once; where the filesystem
    has no flock (simulated), it is waited on for LOCK_WAIT_S. Then the batched forms run."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(fused, "LOCK_WAIT_S", 0.5)
    if not flock:
        def unsupported(*args):
            raise OSError(errno.ENOLCK, "No locks available")

        monkeypatch.setattr(fcntl, "flock", unsupported)
    new_process(monkeypatch)
    calls = no_compiling(monkeypatch)
    directory = fused.build_directory(fused.build_key(fused.read_sources(), fused.build_flags()))
    directory.mkdir(parents=True)
    (directory / "lock").touch()  # what a process killed while building leaves
    assert load_within(60) is None and calls == []
    assert ran_batched() and ran_batched()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unavailable" in err[0] and str(directory / "lock") in err[0], err


def test_a_build_that_runs_too_long_is_not_waited_for(tmp_path, monkeypatch, capsys):
    """Another process holding the builders' flock past LOCK_WAIT_S: this one runs batched."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(fused, "LOCK_WAIT_S", 0.5)
    new_process(monkeypatch)
    calls = no_compiling(monkeypatch)
    directory = fused.build_directory(fused.build_key(fused.read_sources(), fused.build_flags()))
    directory.mkdir(parents=True)
    with open(directory / "builder.lock", "a") as other:  # a second open file: flock tells them apart
        fcntl.flock(other, fcntl.LOCK_EX)
        assert load_within(60) is None and calls == []
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "another process has been building" in err[0], err


def test_the_key_follows_contents_flags_and_versions_not_the_path(tmp_path, monkeypatch):
    flags = fused.build_flags()
    root = checkout(tmp_path, "copy")
    key = fused.build_key(fused.read_sources(root), flags)
    assert key == fused.build_key(fused.read_sources(), flags)  # another path, the same build
    for source in (root / "csrc" / "chunk_cpu.h", root / "delta" / "delta_cpu.cpp"):  # included, and a family's
        original = source.read_bytes()
        source.write_bytes(original + b"// one more line\n")
        assert fused.build_key(fused.read_sources(root), flags) != key
        source.write_bytes(original)
    (root / "conv" / "extra_cpu.cpp").write_text("// a new source\n")
    assert fused.build_key(fused.read_sources(root), flags) != key
    (root / "linear" / "extra_cpu.cpp").write_text("// the same name in another family\n")
    with pytest.raises(ValueError, match="share a file name"):
        fused.read_sources(root)
    sources = fused.read_sources()
    assert fused.build_key(sources, flags + ["-DEXTRA"]) != key
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    assert fused.build_key(sources, flags) != key
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    assert fused.build_directory(key).parent == tmp_path / "ext"
