"""Grouped training from a sweep (harness.run.grouped through the `processes` launcher): the run
directories are the ones an ungrouped sweep writes, with the same files and keys; five float32
seeds grouped and solo end within the seeds' noise; a rerun skips; jobs that cannot share a group
train alone with the reason said; a stopped group checkpoints and fails every member with the stop."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from analysis.loader import load_results

# elu learns this in about 200 steps (0.96 at seed 0): the seeds' accuracies have a spread to compare
SMALL = ["task=recall", "task.num_pairs=2", "task.seq_len=16", "task.vocab_size=32", "trainer.lr=1e-2",
         "model=elu", "model.d_model=16", "logger=none", "trainer.progress=false",
         "trainer.eval_every=25", "trainer.measure=false", "trainer.threads=1", "hydra/launcher=processes"]


def _files(root: Path) -> dict[str, set[str]]:
    """Each run directory's files (the lock and the sweep's own files aside)."""
    return {d.name: {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file() and p.name != ".harness.lock"}
            for d in sorted(root.iterdir()) if d.is_dir() and not d.name.startswith(".")}


def _keys(record, prefix=""):
    out = set()
    if isinstance(record, dict):
        for k, v in record.items():
            out |= {prefix + k} | _keys(v, prefix + k + ".")
    return out


def test_a_grouped_sweep_writes_what_an_ungrouped_one_does_and_ends_within_the_seeds_noise(run_harness, tmp_path):
    seeds = "seed=0,1,2,3,4"
    grouped = run_harness("-m", *SMALL, seeds, "trainer.max_steps=200", f"hydra.sweep.dir={tmp_path / 'on'}")
    solo = run_harness("-m", *SMALL, seeds, "trainer.max_steps=200", "hydra.launcher.group=false",
                       f"hydra.sweep.dir={tmp_path / 'off'}")
    assert grouped.returncode == 0 and solo.returncode == 0, (grouped.stderr[-2000:], solo.stderr[-2000:])
    assert "grouped training: 5 of 5 jobs in 2 group(s) (sizes 2, 3)" in grouped.stdout, grouped.stdout[-2000:]
    assert "grouped training" not in solo.stdout
    assert _files(tmp_path / "on") == _files(tmp_path / "off")
    assert not (tmp_path / "on" / ".groups").exists()  # the group checkpoints go once their runs are written
    acc = {}
    for side in ("on", "off"):
        runs = load_results(tmp_path / side).sort_values("config.seed")
        assert (runs["status"] == "ok").all() and list(runs["config.seed"]) == [0, 1, 2, 3, 4]
        acc[side] = runs["summary.accuracy"].to_numpy()
    for name in ("0", "1", "2", "3", "4"):
        on = json.loads((tmp_path / "on" / name / "results.json").read_text())
        off = json.loads((tmp_path / "off" / name / "results.json").read_text())
        assert on["config_hash"] == off["config_hash"]
        assert _keys(on) - {"group"} - {k for k in _keys(on) if k.startswith("group.")} == _keys(off)
        assert on["group"]["size"] in (2, 3) and 0 < on["group"]["share"] <= 1
        assert on["summary"]["steps"] == off["summary"]["steps"]
    # float32: the members' sums are reduced in another order than a solo run's, so equality is
    # to rounding, and what must hold is that the two samples of seeds are one distribution
    diff = acc["on"] - acc["off"]
    assert acc["off"].mean() > 0.5, acc["off"]  # learned: a comparison of chance levels would say nothing
    assert np.abs(diff).max() <= 0.02, (acc["on"], acc["off"])
    noise = np.sqrt(acc["on"].var(ddof=1) / 5 + acc["off"].var(ddof=1) / 5)
    assert abs(diff.mean()) <= stats.t.ppf(0.975, 8) * noise + 1e-6, (acc["on"], acc["off"])


def test_a_rerun_of_a_grouped_sweep_skips_every_run(run_harness, tmp_path):
    args = ["-m", *SMALL, "seed=0,1", "trainer.max_steps=20", f"hydra.sweep.dir={tmp_path / 's'}"]
    first = run_harness(*args)
    assert first.returncode == 0, first.stderr[-2000:]
    again = run_harness(*args)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.count("[harness] skip: results for this config exist") == 2, again.stdout[-2000:]


def test_jobs_that_cannot_share_a_shape_train_alone_with_the_reason_said(run_harness, tmp_path):
    proc = run_harness("-m", *SMALL, "seed=0,1", "model.d_model=16,64", "trainer.max_steps=10",
                       f"hydra.sweep.dir={tmp_path / 's'}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "grouped training: 2 of 4 jobs in 1 group(s) (sizes 2), 2 alone" in proc.stdout, proc.stdout[-2000:]
    assert "model.d_model=64 is above hydra.launcher.group_max_width=16" in proc.stdout
    runs = load_results(tmp_path / "s")
    assert len(runs) == 4 and (runs["status"] == "ok").all()


def test_a_stopped_group_checkpoints_and_every_member_records_the_stop(tmp_path):
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONUNBUFFERED="1")
    sweep = tmp_path / "sweep"
    proc = subprocess.Popen([sys.executable, "-m", "harness", "-m", *SMALL, "seed=1,2,3,4", "trainer.max_steps=1000000",
                             "trainer.ckpt_every=1000000", "trainer.target_accuracy=null", "trainer.patience=null",
                             f"hydra.sweep.dir={sweep}"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300  # workers import torch and build the group, on a busy machine
        while not all((sweep / str(i) / "config.yaml").exists() for i in range(4)):  # two groups of two
            assert proc.poll() is None, proc.communicate()
            assert time.time() < deadline, "the group did not start"
            time.sleep(0.2)
        # at once: a group may still be between its claims and its first step, and one worker may
        # exit well before the other (whose checkpoint the pool must not cost it)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert len(list((sweep / ".groups").glob("group-*.pt"))) == 2
    for i in range(4):
        results = json.loads((sweep / str(i) / "results.json").read_text())
        assert results["status"] == "failed" and "stopped by SIGTERM after step" in results["error"], results["error"]
        assert ".groups" in results["error"]  # the checkpoint that holds it


class _Loader:
    """Hydra's config loader as plan_units calls it: each job's overrides composed (with a hydra node)."""

    def load_sweep_config(self, config, overrides):
        from omegaconf import open_dict

        from harness.config.compose import compose_config

        cfg = compose_config(list(overrides))
        with open_dict(cfg):
            cfg.hydra = {}
        return cfg


def test_the_units_give_every_worker_work_and_count_every_job():
    from harness.run.grouped import describe, plan_units

    jobs = [["model=elu", "model.d_model=16", f"trainer.lr={lr}"] for lr in ("1e-3", "3e-3", "1e-2")]
    units, alone = plan_units(None, _Loader(), jobs, n_jobs=2)
    assert sorted(map(len, units)) == [1, 2] and sorted(i for u in units for i in u) == [0, 1, 2]
    assert list(alone) == [2] and "each of the 2 workers has work" in alone[2]
    said = describe(units, alone, 2)
    assert said[0].startswith("[harness] grouped training: 2 of 3 jobs in 1 group(s) (sizes 2), 1 alone")
    units, alone = plan_units(None, _Loader(), jobs + [["model=softmax", "model.d_model=16"]], n_jobs=1)
    assert units == [[0, 1, 2], [3]] and "no other run shares its shape" in alone[3]
