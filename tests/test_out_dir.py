"""A bad or busy out_dir through `python -m harness`: one line, nothing written where it must not be."""
import json
import os

import pytest

from harness.config.compose import compose_config
from harness.outputs.lock import RunDirLock
from harness.run.job import run_job

QUICK = ["trainer=debug", "logger=none", "trainer.measure=false"]


def _bad_places(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    return {"file": tmp_path / "file", "file_below": tmp_path / "file" / "run", "loop": tmp_path / "loop"}


@pytest.mark.parametrize("kind", ["file", "file_below", "loop", "read_only"])
def test_a_bad_out_dir_is_one_line(run_harness, tmp_path, kind):
    if kind == "read_only":
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only directory")
        place = tmp_path / "ro"
        place.mkdir()
        place.chmod(0o555)
        out = place / "run"
    else:
        out = _bad_places(tmp_path)[kind]
    proc = run_harness(*QUICK, f"out_dir={out}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("harness: error: out_dir"), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_a_held_directory_gets_no_hydra_files(run_harness, tmp_path):
    held = tmp_path / "held"
    held.mkdir()
    lock = RunDirLock(held)
    assert lock.try_acquire()
    try:
        proc = run_harness(*QUICK, f"out_dir={held}")
    finally:
        lock.release()
    assert proc.returncode == 1 and "in use by another harness process" in proc.stderr, proc.stderr[-2000:]
    assert not (held / ".hydra").exists() and not (held / "config.yaml").exists()


def test_a_finished_run_is_not_overwritten_by_another_config(run_harness, tmp_path):
    run_job(compose_config([*QUICK, f"out_dir={tmp_path}", "seed=1"]))
    before = (tmp_path / "results.json").read_text(), (tmp_path / "model.pt").read_bytes()
    proc = run_harness(*QUICK, f"out_dir={tmp_path}", "seed=2", "trainer.lr=0.01")
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("harness: error:") and "seed (1 there, 2 now)" in line and "trainer.lr" in line
    assert "+overwrite=true" in line
    assert ((tmp_path / "results.json").read_text(), (tmp_path / "model.pt").read_bytes()) == before
    proc = run_harness(*QUICK, f"out_dir={tmp_path}", "seed=2", "trainer.lr=0.01", "+overwrite=true")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((tmp_path / "results.json").read_text())["config"]["seed"] == 2
