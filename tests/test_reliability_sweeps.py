"""A sweep stopped by SIGTERM (a scheduler's pre-emption) or SIGINT (Ctrl-C): every worker of the
joblib and submitit-local launchers checkpoints its run and exits, none outlives the parent, no
queued job starts; and a grid too large is refused before any work, naming its job count."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from harness.outputs.checkpoint import checkpoint_files
from harness.run import sweep as sweep_module

# Runs that train until stopped: an evaluation (and a metrics.jsonl row) every 5 steps, no
# periodic checkpoint, so the one found after the stop is the stop's own.
LONG = ["task=recall", "model=elu", "model.d_model=32", "logger=none", "trainer=debug",
        "trainer.max_steps=1000000", "trainer.eval_every=5", "trainer.ckpt_every=1000000",
        "trainer.target_accuracy=null", "trainer.threads=1", "trainer.measure=false"]
START_S = 300  # workers import torch and build their models, on a busy machine


def _sweep(tmp_path, *overrides):
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "harness", "-m", *LONG, *overrides,
                             f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_until_training(proc, run_dirs):
    deadline = time.time() + START_S
    while not all((d / "metrics.jsonl").exists() and (d / "metrics.jsonl").stat().st_size for d in run_dirs):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "the sweep's runs did not start"
        time.sleep(0.2)


@pytest.mark.parametrize("launcher,sig,seeds,running", [
    ("processes", signal.SIGTERM, "1,2,3,4", 2),   # joblib (loky): two at a time, two queued
    ("local", signal.SIGINT, "1,2", 2),            # submitit's local jobs: one process each
])
def test_a_stopped_sweep_leaves_no_worker_and_checkpoints_every_run(tmp_path, launcher, sig, seeds, running):
    # every job alone (a grouped sweep's stop: tests/test_group_sweeps.py)
    alone = ["hydra.launcher.group=false"] if launcher == "processes" else []
    proc = _sweep(tmp_path, f"hydra/launcher={launcher}", f"seed={seeds}", *alone)
    below = []
    try:
        run_dirs = [tmp_path / "sweep" / str(i) for i in range(running)]
        _wait_until_training(proc, run_dirs)
        below = psutil.Process(proc.pid).children(recursive=True)
        assert len(below) >= running
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=getattr(sweep_module, "STOP_GRACE_S", 60) + 60)
        assert proc.returncode == 128 + sig, err[-3000:]
        assert "Traceback" not in err, err[-3000:]
        _, alive = psutil.wait_procs(below, timeout=30)  # a resource tracker exits after the parent
        assert not alive, f"outlived the sweep: {[(p.pid, p.cmdline()) for p in alive]}"
        for run_dir in run_dirs:
            results = json.loads((run_dir / "results.json").read_text())
            assert results["status"] == "failed" and "stopped by SIGTERM after step" in results["error"], results["error"]
            assert checkpoint_files(run_dir), f"{run_dir} kept no checkpoint"
        queued = [tmp_path / "sweep" / str(i) for i in range(running, len(seeds.split(",")))]
        assert not any((d / "metrics.jsonl").exists() for d in queued), "a queued job started after the stop"
    finally:
        for p in below:  # on a failure, never leave a worker training
            try:
                p.kill()
            except psutil.Error:
                pass
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_a_huge_sweep_is_refused_before_any_work_with_its_job_count(tmp_path, run_harness):
    proc = run_harness("-m", "trainer=debug", "logger=none", "seed=range(0,1000000)",
                       f"hydra.sweep.dir={tmp_path / 'sweep'}", timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "1,000,000 jobs" in lines[0] and "sweep.max_jobs=1000000" in lines[0], proc.stderr
    assert not (tmp_path / "sweep").exists()


def test_the_job_count_of_a_grid_is_counted_not_expanded():
    from harness.run.precheck import PrecheckError, check_sweep_size

    check_sweep_size({"seed": "range(0,10)", "model": "elu,softmax"}, max_jobs=20)
    with pytest.raises(PrecheckError, match="21 jobs"):
        check_sweep_size({"seed": "range(0,7)", "model": "elu,softmax,linear"}, max_jobs=20)
    with pytest.raises(PrecheckError, match=f"{10**12:,} jobs"):  # instant: never expanded
        check_sweep_size({"seed": "range(0,1000000000000)"}, max_jobs=100_000)
