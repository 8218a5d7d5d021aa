"""Shared test set-up: no network, no GPU assumptions, small thread counts."""
import contextlib
import os

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.pop("HYDRA_FULL_ERROR", None)

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]  # the checkout

pytest_plugins = ["tests.durations"]  # the recorded times and the slow mark (scripts/test.sh --fast)

# Two pytest workers share two cores: one torch thread each avoids oversubscription.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


def _load_make_results():
    """tests/fixtures/make_results.py: synthetic results trees shared by the analysis tests."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parent / "fixtures" / "make_results.py"
    spec = importlib.util.spec_from_file_location("make_results", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_results = _load_make_results()


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A synthetic tree of every experiment's sweep (module-scoped: built once per file)."""
    return make_results.write_results_tree(tmp_path_factory.mktemp("results"))


@pytest.fixture
def run_harness(tmp_path):
    """Run `python -m harness <overrides>` in a subprocess; returns the CompletedProcess."""
    import subprocess
    import sys

    def run(*overrides: str, cwd=None, timeout: int = 600):
        # the checkout on the path, as pytest's own (pyproject pythonpath): a test names its own
        # classes (tests.test_hybrid.Plain) by dotted path from a subprocess run elsewhere
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        env = dict(os.environ, WANDB_MODE="disabled", PYTHONUNBUFFERED="1", PYTHONPATH=path)
        return subprocess.run([sys.executable, "-m", "harness", *overrides], cwd=cwd or tmp_path,
                              capture_output=True, text=True, timeout=timeout, env=env)

    return run


def cut_at_first_evaluation(monkeypatch, overrides: list[str]):
    """Run `overrides` until its first evaluation, where a KeyboardInterrupt stops it (the
    checkpoints written before it are kept); returns the run's composed config."""
    from harness.config.compose import compose_config
    from harness.run.job import run_job
    from harness.train import loop as train_module

    def die(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_module, "evaluate", die)
    cfg = compose_config(overrides)
    with pytest.raises(KeyboardInterrupt):
        run_job(cfg)
    monkeypatch.undo()
    return cfg


@contextlib.contextmanager
def tmpfs(where, options: str):
    """A tmpfs mounted at `where` with mount `options` ("size=1m", "ro,size=64k") for the body,
    unmounted after; pytest.skip where mounting is not allowed (needs root and a machine that
    allows mounts)."""
    import subprocess

    where.mkdir(exist_ok=True)
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                                 capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        mounted = False
    if not mounted:
        pytest.skip(f"cannot mount a tmpfs ({options}) here")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


@pytest.fixture
def read_only(tmp_path):
    """A directory this process cannot write in: a read-only tmpfs mount (as root, who writes
    through permission bits), or a directory without write permission; skipped where neither is."""
    place = tmp_path / "ro"
    place.mkdir()
    if os.geteuid() != 0:
        place.chmod(0o555)
        yield place
        place.chmod(0o755)
        return
    with tmpfs(place, "ro,size=64k"):
        yield place


def draw_figure(root, name: str):
    """The figure `name` drawn from the results under `root`, as `python -m analysis.figures` draws it."""
    from analysis import figures

    spec = next(s for s in figures.FIGURES if s.name == name)
    return spec.draw(figures.load_figure_data(root, spec))
