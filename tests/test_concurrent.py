"""Two copies of one sweep started at once on one directory neither corrupt nor duplicate a run.

Each job claims its run directory with a lock before writing; the copy that finds a directory
claimed waits for it, says so, and skips the run once the other has finished it.
"""
import json
import os
import subprocess
import sys

from harness.outputs.lock import RunDirLock

SWEEP = ["-m", "task=recall", "trainer=debug", "logger=none", "trainer.measure=false",
         "trainer.checkpoint=false", "trainer.threads=1", "model=softmax,elu,linear"]


def test_two_copies_of_a_sweep_do_each_run_once(tmp_path):
    sweep = tmp_path / "sweep"
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "harness", *SWEEP, f"hydra.sweep.dir={sweep}"]
    copies = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in copies]
    for p, (out, err) in zip(copies, outs):
        assert p.returncode == 0, err[-2000:]
    stdout = "".join(out for out, _ in outs)
    assert stdout.count("[harness] results: ") == 3, stdout  # each run trained by one copy only
    assert stdout.count("skip: results for this config exist") == 3, stdout
    files = sorted(sweep.rglob("results.json"))
    assert len(files) == 3
    for f in files:
        res = json.loads(f.read_text())  # whole: parses
        assert res["status"] == "ok"
        rows = [json.loads(line)["step"] for line in (f.parent / "metrics.jsonl").read_text().splitlines()]
        assert rows == sorted(set(rows))  # no row written twice


def test_a_sweep_job_waits_for_the_holder_and_says_so(tmp_path):
    sweep = tmp_path / "sweep"
    (sweep / "0").mkdir(parents=True)
    lock = RunDirLock(sweep / "0")
    assert lock.try_acquire()
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "harness", *SWEEP[:-1], "model=elu", f"hydra.sweep.dir={sweep}"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        waiting = ""
        for line in proc.stdout:  # the job announces the wait, then blocks on the lock
            waiting = line
            if "wait: " in line:
                break
        assert "is being written by another process" in waiting and str(os.getpid()) in waiting
        assert proc.poll() is None and not (sweep / "0" / "results.json").exists()
    finally:
        lock.release()  # the holder goes away without results: the waiting job does the run
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-2000:]
    assert json.loads((sweep / "0" / "results.json").read_text())["status"] == "ok"


def test_a_single_run_refuses_a_directory_another_process_holds(tmp_path, run_harness):
    out = tmp_path / "run"
    out.mkdir()
    lock = RunDirLock(out)
    assert lock.try_acquire()
    try:
        proc = run_harness("trainer=debug", "logger=none", f"out_dir={out}", timeout=120)
    finally:
        lock.release()
    assert proc.returncode == 1
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and "in use by another harness process" in err[0] and str(os.getpid()) in err[0]
    assert not (out / "results.json").exists()


def test_the_lock_goes_with_the_process(tmp_path):
    """A holder killed with SIGKILL leaves the directory free at once."""
    code = ("import sys, time; from harness.outputs.lock import RunDirLock; "
            f"l = RunDirLock({str(tmp_path)!r}); assert l.try_acquire(); print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    mine = RunDirLock(tmp_path)
    assert not mine.try_acquire()
    assert mine.holder() == str(holder.pid)
    holder.kill()
    holder.wait()
    assert mine.try_acquire()
    mine.release()
