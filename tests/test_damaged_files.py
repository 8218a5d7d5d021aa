"""Damaged files never end a run with a traceback, and never cost more than one checkpoint.

A checkpoint truncated (a full disk at copy time, a partial rsync) or with a flipped bit is
found by its checksum: the rerun of the same command warns in one line and resumes from the
checkpoint before it; if none is usable it stops with one line, exit code 2, nothing
overwritten. A damaged model.pt is refused by checkpoint.load_model and makes a sweep redo the
run, as a damaged results.json does.
"""
import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import cut_at_first_evaluation

from harness.outputs.load import load_run
from harness.config.compose import compose_config
from harness.errors import DamagedFile
from harness.outputs import checkpoint
from harness.outputs.checkpoint import checkpoint_files, load_model
from harness.outputs.lock import LOCK_FILE
from harness.outputs.rundir import find_completed
from harness.run.job import run_job

RUN = ["task=recall", "model=elu", "model.d_model=16", "logger=none", "trainer.max_steps=60",
       "trainer.batch_size=8", "trainer.eval_every=50", "trainer.eval_examples=16",
       "trainer.ckpt_every=20", "trainer.warmup_steps=5", "trainer.target_accuracy=null",
       "trainer.progress=false", "trainer.measure=false", "trainer.threads=1"]


@pytest.fixture(autouse=True)
def keep_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def harness(*overrides, timeout=300):
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "harness", *overrides], env=env, capture_output=True,
                          text=True, timeout=timeout)


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


@pytest.fixture
def cut_run(tmp_path, monkeypatch):
    """A run stopped at step 50 (its first evaluation) with the checkpoints of steps 40 and 20."""
    out = tmp_path / "run"
    cut_at_first_evaluation(monkeypatch, [*RUN, f"out_dir={out}"])
    assert [step for step, _, _ in checkpoint_files(out)] == [40, 20]
    return out


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def flip_a_bit(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10  # inside a tensor's bytes: the file still unzips and loads
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [truncate, flip_a_bit], ids=["truncated", "bit-flipped"])
def test_damaged_latest_checkpoint_falls_back_to_the_previous_one(cut_run, damage):
    newest = checkpoint_files(cut_run)[0][1]
    damage(newest)
    proc = harness(*RUN, f"out_dir={cut_run}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    err = lines(proc.stderr)
    assert len(err) == 1 and err[0].startswith("harness: warning: "), err
    assert newest.name in err[0] and "damaged" in err[0] and "checkpoint-00000020-" in err[0]
    assert "at step 20" in proc.stdout  # resumed from the previous checkpoint
    res = json.loads((cut_run / "results.json").read_text())
    assert res["status"] == "ok" and res["summary"]["steps"] == 60
    assert not checkpoint_files(cut_run)  # finished: removed, damaged one included


def test_no_usable_checkpoint_is_one_line_and_overwrites_nothing(cut_run):
    for _, path, _ in checkpoint_files(cut_run):
        truncate(path)
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in cut_run.iterdir() if p.is_file()
              and p.name != LOCK_FILE}
    proc = harness(*RUN, f"out_dir={cut_run}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = lines(proc.stderr)
    assert len(err) == 1 and err[0].startswith("harness: error: no usable checkpoint"), err
    for _, path, _ in checkpoint_files(cut_run):
        assert path.name in err[0]
    assert "trainer.resume=" in err[0] and "move" in err[0] and "aside" in err[0]
    after = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in cut_run.iterdir() if p.is_file()
             and p.name != LOCK_FILE}
    assert {name: after.get(name) for name in before} == before  # Hydra may add its own log
    assert not (cut_run / "results.json").exists()


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("finished")
    run_job(compose_config(["task=recall", "model=elu", "trainer=debug", "logger=none",
                            "trainer.measure=false", f"out_dir={out}"]))
    return out


def test_model_file_checksum_is_recorded_and_verified(finished):
    res = json.loads((finished / "results.json").read_text())
    entry = res["files"]["model.pt"]
    assert entry["sha256"] == checkpoint.file_digest(finished / "model.pt")
    payload = load_model(finished)
    assert set(payload) >= {"model", "config"} and payload["config"]["model"]["name"] == "elu"


@pytest.mark.parametrize("damage", [truncate, flip_a_bit], ids=["truncated", "bit-flipped"])
def test_damaged_model_file_is_one_line(finished, tmp_path, damage):
    import shutil

    run = tmp_path / "copy"
    shutil.copytree(finished, run)
    damage(run / "model.pt")
    with pytest.raises(DamagedFile) as err:
        load_model(run / "model.pt")
    message = str(err.value)
    assert "\n" not in message and str(run / "model.pt") in message and "damaged" in message
    assert isinstance(err.value, ValueError)  # bad input: exit code 2 at the command line
    with pytest.raises(DamagedFile, match="damaged"):  # and harness.load_run, which verifies through it
        load_run(run)


def test_sweep_redoes_a_run_whose_model_or_results_are_damaged(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "task=recall", "trainer=debug", "logger=none", "trainer.measure=false",
            "model=softmax,elu", f"hydra.sweep.dir={sweep}"]
    first = harness(*args, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    runs = {json.loads(p.read_text())["model"]: p.parent for p in sweep.rglob("results.json")}
    flip_a_bit(runs["softmax"] / "model.pt")
    (runs["elu"] / "results.json").write_text('{"status": "ok", "conf')  # cut short
    cfg = compose_config(["task=recall", "trainer=debug", "logger=none", "trainer.measure=false",
                          "model=softmax"])
    from harness.config.digest import config_hash

    assert find_completed(sweep, config_hash(cfg)) is None
    second = harness(*args, timeout=600)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "skip: results" not in second.stdout  # both runs done again
    assert "redo: " in second.stdout and "model.pt is damaged" in second.stdout
    for run in runs.values():
        res = json.loads((run / "results.json").read_text())
        assert res["status"] == "ok"
        load_model(run)  # whole again
