"""Bad command lines refused before Hydra starts, in one line with exit code 2: Hydra's run and
sweep directories where they cannot be made, and environment switches that are neither true
nor false (read by one helper, which takes the usual spellings of both)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

QUICK = ["trainer=debug", "logger=none", "trainer.measure=false", "trainer.threads=1"]


def _one_line(proc, starts: str) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"harness: error: {starts}"), proc.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("key,multirun", [("hydra.sweep.dir", True), ("hydra.run.dir", False)])
def test_a_hydra_dir_on_a_read_only_mount_is_one_line(run_harness, read_only, key, multirun):
    flags = ["-m", "seed=1,2"] if multirun else []
    line = _one_line(run_harness(*flags, *QUICK, f"{key}={read_only / 'runs'}", timeout=300), key)
    assert "cannot be written" in line


@pytest.mark.parametrize("key,multirun", [("hydra.sweep.dir", True), ("hydra.run.dir", False)])
def test_a_hydra_dir_below_a_file_is_one_line(run_harness, tmp_path, key, multirun):
    (tmp_path / "file").write_text("x")
    flags = ["-m", "seed=1,2"] if multirun else []
    line = _one_line(run_harness(*flags, *QUICK, f"{key}={tmp_path / 'file' / 'runs'}", timeout=300), key)
    assert f"{tmp_path / 'file'} is a file" in line
    assert (tmp_path / "file").read_text() == "x"


def test_non_ascii_in_hydra_run_dir_is_one_line_that_says_to_quote_it(run_harness, tmp_path):
    line = _one_line(run_harness(*QUICK, f"hydra.run.dir={tmp_path / 'runs-é'}", timeout=300),
                     "bad value for 'hydra.run.dir'")
    assert "quoted" in line


@pytest.mark.parametrize("name", ["HARNESS_FUSED_CPU", "HARNESS_MALLOC"])
def test_a_switch_set_to_junk_is_refused_in_one_line(run_harness, monkeypatch, name):
    monkeypatch.setenv(name, "junk")
    line = _one_line(run_harness(*QUICK, timeout=300), name)
    assert "'junk'" in line and "true" in line and "false" in line


@pytest.mark.parametrize("value,expected", [
    ("1", True), ("true", True), ("TRUE", True), ("yes", True), ("on", True), (" On ", True),
    ("0", False), ("false", False), ("False", False), ("no", False), ("off", False), ("", True),
])
def test_one_helper_reads_every_spelling_of_a_switch(monkeypatch, value, expected):
    from harness.env import switch

    monkeypatch.setenv("HARNESS_FUSED_CPU", value)
    assert switch("HARNESS_FUSED_CPU") is expected


@pytest.mark.parametrize("value", ["junk", "2", "flase", "y"])
def test_the_helper_refuses_anything_else(monkeypatch, value):
    from harness.env import EnvironmentSwitchError, switch

    monkeypatch.setenv("HARNESS_MALLOC", value)
    with pytest.raises(EnvironmentSwitchError, match="HARNESS_MALLOC"):
        switch("HARNESS_MALLOC")


@pytest.mark.parametrize("value", ["false", "off", "no", "0"])
def test_fused_kernels_off_for_every_spelling_of_false(value):
    """Read where the kernels read it: a fresh process importing harness.ops.fused_cpu."""
    env = dict(os.environ, HARNESS_FUSED_CPU=value)
    code = "import harness.ops.fused_cpu as f; print(f._enabled)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


@pytest.mark.parametrize("value", ["false", "off", "system"])
def test_allocator_left_alone_for_false_and_system(value):
    env = dict(os.environ, HARNESS_MALLOC=value)
    code = "import harness.allocator as a; print(a.allocator_state()['configured'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


def test_a_run_piped_into_head_keeps_its_results(tmp_path):
    """`python -m harness ... | head -1`: the reader leaves after one line; the run still trains to
    its end and records itself finished (a print into the closed pipe failed it before)."""
    import json

    from tests.conftest import ROOT

    env = dict(os.environ, WANDB_MODE="disabled", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    out = tmp_path / "run"
    # a line at step 20 of 200: the reader leaves while the run has 180 steps and its report to go
    proc = subprocess.Popen([sys.executable, "-m", "harness", *QUICK, "trainer.max_steps=200", "trainer.eval_every=20",
                             "trainer.progress=true", "trainer.target_accuracy=null", f"out_dir={out}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env=env)
    first = proc.stdout.readline()
    proc.stdout.close()  # as head does after its line
    _, err = proc.communicate(timeout=300)
    assert first.startswith("[harness]") and proc.returncode == 0, err[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "ok" and results["summary"]["steps"] == 200, results.get("error")
