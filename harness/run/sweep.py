"""Hydra callback for every multirun: a stop signal reaches every job, and a summary at the end.

A sweep's jobs run in worker processes (joblib's loky workers, submitit's local jobs). A
scheduler pre-empting the sweep, or Ctrl-C, signals the parent; by default the parent then dies
alone and its workers train on as orphans, holding their run locks. So the parent, on SIGTERM or
SIGINT, passes SIGTERM to every process below it, waits up to STOP_GRACE_S for them to
checkpoint their current step and exit (harness.train.faults.StopRequest; a rerun of the same
command resumes them), kills what is left, and exits with 128 + the signal's number. A worker
whose run was stopped exits after that run, rather than take the next job.
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from harness.outputs.results import RESULTS_FILE, read_results
from harness.train.faults import STOP_SIGNALS, StopRequest

# How long a stopped sweep waits for its workers: a step, a checkpoint and the failed run's
# results.json, on a busy machine. Past it a worker is killed; its last checkpoint stands.
STOP_GRACE_S = 60.0
_stopping: list[int] = []  # the stop signals this parent has received


def summarise(sweep_dir: Path) -> dict[str, list]:
    ok, failed = [], []
    for path in sorted(Path(sweep_dir).rglob(RESULTS_FILE)):
        res = read_results(path.parent) or {"status": "failed", "error": "unreadable results.json"}
        (ok if res.get("status") == "ok" else failed).append((path.parent, res.get("error")))
    return {"ok": ok, "failed": failed}


def stop_workers(signum: int, frame: Any = None, grace_s: float = STOP_GRACE_S) -> None:
    """The parent's handler of a stop signal: SIGTERM to every process below this one, a wait
    of up to ``grace_s`` for them (none after a second signal), SIGKILL to the rest, then exit
    128 + signum. Resource trackers (joblib's, multiprocessing's) are not waited for: they
    ignore signals and exit when the last process that writes to them has."""
    import psutil

    if _stopping:  # a second signal while waiting: no more waiting
        grace_s = 0.0
    _stopping.append(signum)
    _spare_the_others()
    name = signal.Signals(signum).name
    below = psutil.Process().children(recursive=True)
    workers = [p for p in below if not _is_resource_tracker(p)]
    print(f"[harness] sweep stopped by {name}: asking {len(workers)} worker process(es) to checkpoint "
          "and exit; rerun the same command to resume", file=sys.stderr, flush=True)
    for proc in below:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(workers, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=10)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + signum)  # not SystemExit: the launcher's clean-up would wait on the workers again


def _spare_the_others() -> None:
    """Keep joblib's loky executor from killing the workers still checkpointing. Its manager thread
    (in this process) takes the first worker to exit for a crash of the pool and SIGKILLs every
    other worker, so a worker that finished its stop quickly would cost a slower one its
    checkpoint and results.json; from here on this handler waits for them and kills what is left."""
    import threading

    for thread in threading.enumerate():
        if hasattr(thread, "kill_workers") and hasattr(thread, "terminate_broken"):  # loky's manager thread
            thread.kill_workers = lambda reason="": None


def _is_resource_tracker(proc) -> bool:
    try:
        return any("resource_tracker" in part for part in proc.cmdline())
    except Exception:  # gone meanwhile, or not ours to read
        return False


def exit_if_stopped(signum: int | None = None) -> None:
    """In a worker: after a run stopped by a signal (its checkpoint and results.json written),
    exit with the signal's code instead of starting the next job. ``signum``: the signal a
    caller's own StopRequest took (a later run in the same process resets received())."""
    signum = signum or StopRequest.received()
    if signum is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + signum)


class SweepSummary(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # in the parent, before any worker starts; a run in this process (the basic launcher)
        # takes the signals over while it trains and gives them back after
        for sig in STOP_SIGNALS:
            signal.signal(sig, stop_workers)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        """In the process that ran the job: after a run stopped by a signal, exit (it has written
        its checkpoint and results.json) instead of starting the next job. A group member's job
        only claims it: its group, not yet trained, answers the stop (harness.run.grouped)."""
        from hydra.core.utils import JobStatus

        from harness.run.job import Claimed

        if job_return.status == JobStatus.COMPLETED and isinstance(job_return.return_value, Claimed):
            return
        exit_if_stopped()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        summary = summarise(sweep_dir)
        print(f"[harness] sweep {sweep_dir}: {len(summary['ok'])} ok, "
              f"{len(summary['failed'])} failed")
        for run_dir, error in summary["failed"]:
            print(f"[harness]   failed {run_dir}: {error}")
        if summary["failed"]:
            raise SystemExit(1)
