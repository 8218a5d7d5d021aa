"""A run killed with SIGKILL and rerun ends exactly where an uninterrupted run ends."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from harness.outputs.checkpoint import checkpoint_files, latest_checkpoint
from harness.outputs.lock import LOCK_FILE
from harness.config.compose import compose_config
from harness.run.job import run_job

# Small enough to be quick, long enough (200 steps, a checkpoint every 20) to be killed mid-way.
RUN = ["task=recall", "model=elu", "model.d_model=32", "logger=none", "trainer.max_steps=200",
       "trainer.batch_size=16", "trainer.eval_every=40", "trainer.eval_examples=64",
       "trainer.ckpt_every=20", "trainer.warmup_steps=10", "trainer.target_accuracy=null",
       "trainer.progress=false", "trainer.measure_examples=16", "trainer.threads=1"]


def harness(*overrides):
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "harness", *overrides], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def comparable(results: dict) -> dict:
    """Everything a run computes: drop the times (wall, set-up, step, measurement) and the environment."""
    summary = {k: v for k, v in results["summary"].items() if not k.endswith("_time_s")}
    return {"summary": summary, "slices": results["slices"], "heads": results["heads"]}


def metrics_rows(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k != "time_s"} for row in rows]


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """The uninterrupted run every interrupted one must match."""
    out = tmp_path_factory.mktemp("whole")
    out_, err = harness(*RUN, f"out_dir={out}").communicate(timeout=300)
    assert (out / "results.json").exists(), err[-2000:]
    return out


def wait_for(found, proc):
    """Until found() is a path that exists and is not empty (metrics.jsonl is opened before the
    first step); returns it."""
    deadline = time.time() + 120
    while not ((path := found()) and path.exists() and path.stat().st_size > 0):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, f"{path} did not appear"
        time.sleep(0.01)
    return path


def resume_and_compare(whole, killed):
    resumed = harness(*RUN, f"out_dir={killed}")  # the same command, the same directory
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-2000:]
    assert f"resuming from {killed}/checkpoint-" in out
    a = json.loads((whole / "results.json").read_text())
    b = json.loads((killed / "results.json").read_text())
    assert a["status"] == b["status"] == "ok" and b["summary"]["steps"] == 200
    assert comparable(a) == comparable(b)  # bit for bit: JSON floats round-trip exactly
    assert metrics_rows(whole) == metrics_rows(killed)  # no row lost or written twice
    assert not checkpoint_files(killed)  # finished: model.pt replaces them
    w, k = (torch.load(d / "model.pt", weights_only=True)["model"] for d in (whole, killed))
    assert all(torch.equal(w[key], k[key]) for key in w)


def test_sigkill_then_rerun_matches_an_uninterrupted_run(tmp_path, whole):
    killed = tmp_path / "killed"
    victim = harness(*RUN, f"out_dir={killed}")
    wait_for(lambda: latest_checkpoint(killed), victim)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL
    assert not (killed / "results.json").exists(), "the run finished before it was killed"
    saved = torch.load(latest_checkpoint(killed), weights_only=True)
    assert 20 <= saved["step"] < 200 and saved["step"] % 20 == 0
    resume_and_compare(whole, killed)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_checkpoints_the_current_step_then_resumes_exactly(tmp_path, whole, sig):
    """A pre-empted job (SIGTERM) or Ctrl-C (SIGINT) saves the step it is at, not the last
    periodic checkpoint, and exits as the shell reports that signal (128 + its number)."""
    stopped = tmp_path / "stopped"
    victim = harness(*RUN, "trainer.ckpt_every=1000", f"out_dir={stopped}")  # no periodic ones
    wait_for(lambda: stopped / "metrics.jsonl", victim)  # the first evaluation (step 40) is done
    victim.send_signal(sig)
    out, err = victim.communicate(timeout=120)
    assert victim.returncode == 128 + sig, err[-2000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and f"stopped by {sig.name} after step" in lines[0], err
    saved = torch.load(latest_checkpoint(stopped), weights_only=True)
    assert 40 <= saved["step"] < 200
    assert json.loads((stopped / "results.json").read_text())["status"] == "failed"
    resume_and_compare(whole, stopped)


@pytest.fixture(autouse=True)
def keep_threads():
    """RUN sets trainer.threads=1, which in-process runs apply to this whole process."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def run(tmp_path, *overrides):
    cfg = compose_config([*RUN, "trainer.max_steps=60", "trainer.measure=false",
                          f"out_dir={tmp_path}", *overrides])
    run_job(cfg)
    return json.loads((tmp_path / "results.json").read_text())


def fails_in_one_line(overrides, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        run_job(compose_config([*RUN, *overrides]))
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("harness: error: "), err
    return err[0]


def test_resume_option_continues_a_run_in_its_directory(tmp_path, monkeypatch):
    """trainer.resume=<dir> picks up that directory's checkpoint, even when launched elsewhere."""
    from harness.train import loop as train_module

    whole = run(tmp_path / "whole")
    stop = train_module.evaluate

    def evaluate_then_die(model, eval_sets, autocast, **kwargs):  # "killed" at the first eval
        raise KeyboardInterrupt

    monkeypatch.setattr(train_module, "evaluate", evaluate_then_die)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "cut")
    assert latest_checkpoint(tmp_path / "cut") is not None
    monkeypatch.setattr(train_module, "evaluate", stop)
    run_job(compose_config([*RUN, "trainer.max_steps=60", "trainer.measure=false",
                            f"out_dir={tmp_path / 'elsewhere'}", f"trainer.resume={tmp_path / 'cut'}"]))
    resumed = json.loads((tmp_path / "cut" / "results.json").read_text())
    assert resumed["summary"]["steps"] == 60
    assert resumed["summary"]["loss"] == whole["summary"]["loss"]
    assert not (tmp_path / "elsewhere").exists()  # the run continued in its own directory


def test_checkpoint_of_another_config_is_refused_by_name(tmp_path, capsys):
    from harness.outputs import checkpoint
    from harness.config.digest import config_hash, flat_config

    cut = tmp_path / "run"
    cut.mkdir()
    cfg = compose_config([*RUN, f"out_dir={cut}"])
    path = checkpoint.save_checkpoint(cut, 20, {"format": checkpoint.FORMAT, "step": 20,
                                                "config_hash": config_hash(cfg), "config": flat_config(cfg)})
    line = fails_in_one_line(["trainer.lr=0.01", f"out_dir={cut}"], capsys)
    assert "belongs to another configuration" in line and "trainer.lr: 0.003 -> 0.01" in line
    assert [p for p in cut.iterdir() if p.name != LOCK_FILE] == [path]  # the killed run's files are untouched


@pytest.mark.parametrize("where, why", [("missing", "not a directory"),
                                        ("empty", "no checkpoint there")])
def test_resume_without_a_checkpoint_is_one_line(tmp_path, capsys, where, why):
    (tmp_path / "empty").mkdir()
    line = fails_in_one_line([f"trainer.resume={tmp_path / where}", f"out_dir={tmp_path / 'out'}"], capsys)
    assert why in line and "trainer.resume=" in line


def test_resume_from_a_directory_that_is_no_run_touches_nothing(tmp_path, capsys):
    """trainer.resume=/etc, say: refused before the run claims the directory (no lock file)."""
    foreign = tmp_path / "etc"
    foreign.mkdir()
    (foreign / "hostname").write_text("box\n")
    line = fails_in_one_line([f"trainer.resume={foreign}", f"out_dir={tmp_path / 'out'}"], capsys)
    assert f"trainer.resume={foreign}: nothing to resume" in line and "not a harness run directory" in line
    assert sorted(p.name for p in foreign.iterdir()) == ["hostname"]
    assert not (tmp_path / "out").exists()
