"""The default run's time against the bare model loop: what `python -m harness` costs beyond its steps.

The default run is run as a user runs it, `WANDB_MODE=disabled python -m harness` in a process of
its own (task recall, model elu, its steps, evaluations, end-of-run measurements and saved
files), with its progress lines off, its output directory temporary and the benchmark's thread
count.
Its parts come from the results.json it writes: the set-up before the first step, the steps
(the median step times the steps run), the measurements, and the rest of its wall time (the
evaluations, the checkpoint); the process's own start (imports) and its saving are the time
outside that wall time. The bare loop (harness.bench.loop.time_bare_loop) runs the same model,
optimizer and batch size for as many steps with nothing else. Their ratio is the table's line:
a run that slows down while its numbers stay the same shows there, beside its accuracy and
loss, which show a change of result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from harness.devices import kept_determinism, set_run_determinism

# What the run is told beyond the user's command (WANDB_MODE=disabled, as in the quick start): no
# progress lines, the benchmark's threads, a temporary output directory.
QUIET = ("trainer.progress=false",)


def run_command(out_dir: Path, threads: int, overrides: list[str]) -> list[str]:
    """The default run's command line, as `python -m harness` with the benchmark's settings."""
    return [sys.executable, "-m", "harness", *overrides, *QUIET, f"trainer.threads={threads}", f"out_dir={out_dir}"]


def run_parts(summary: dict[str, Any], process_s: float) -> dict[str, float]:
    """Seconds of a run by part, from its results.json summary and the process's wall time."""
    steps = summary["step_time_s"] * summary["steps"]
    measure = summary.get("measure_time_s") or 0.0
    setup = summary["setup_time_s"]
    return {"process": process_s, "start_and_save": process_s - summary["wall_time_s"], "setup": setup,
            "steps": steps, "evaluations_and_checkpoints": summary["wall_time_s"] - setup - steps - measure,
            "measurements": measure}


def time_default_run(overrides: list[str], threads: int) -> dict[str, Any]:
    """One default run in a fresh process: its parts (run_parts), steps, accuracy and loss."""
    with tempfile.TemporaryDirectory(prefix="harness-bench-run-") as tmp:
        out_dir = Path(tmp) / "run"
        start = time.perf_counter()
        done = subprocess.run(run_command(out_dir, threads, overrides), capture_output=True, text=True,
                              env={**os.environ, "WANDB_MODE": "disabled"})
        process_s = time.perf_counter() - start
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"the default run failed ({done.returncode}): {tail}")
        found = sorted(out_dir.rglob("results.json"))
        summary = json.loads(found[-1].read_text())["summary"]
    return {"parts": run_parts(summary, process_s), "steps": summary["steps"], "accuracy": summary["accuracy"],
            "loss": summary["loss"], "cpu_time_s": summary["cpu_time_s"]}


def default_run_cost(overrides: list[str] | None = None, *, rounds: int = 1, device: str = "cpu") -> dict[str, Any]:
    """The default run's process time over the bare loop's time for the same steps, medians of
    `rounds` alternating runs of each."""
    from harness.bench.loop import loop_plan, time_bare_loop
    from harness.bench.timing import median

    overrides = list(overrides or [])
    threads = torch.get_num_threads()
    runs, bare = [], []
    with kept_determinism():
        for _ in range(rounds):
            runs.append(time_default_run([*overrides, f"trainer.device={device}"], threads))
            with tempfile.TemporaryDirectory(prefix="harness-bench-run-") as tmp:
                plan = loop_plan(overrides, runs[-1]["steps"], device, Path(tmp))
                set_run_determinism(plan.device)  # as the run has them
                bare.append(runs[-1]["steps"] / time_bare_loop(plan, runs[-1]["steps"]))
    parts = {k: median([r["parts"][k] for r in runs]) for k in runs[0]["parts"]}
    bare_s = median(bare)
    return {"ratio": parts["process"] / bare_s, "run_s": parts["process"], "bare_s": bare_s, "parts": parts,
            "steps": runs[0]["steps"], "accuracy": runs[0]["accuracy"], "loss": runs[0]["loss"],
            "run_samples": [r["parts"]["process"] for r in runs], "bare_samples": bare, "rounds": rounds,
            "threads": threads, "overrides": overrides}
