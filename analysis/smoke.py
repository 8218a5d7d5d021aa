"""A profile smoke-tested: every job of every experiment grid, one training step each, then every
figure, then what the full profile would cost.

    python -m analysis.figures --profile paper --smoke [--out DIR] [--smoke-grid last]
    python -m analysis.figures --profile findings --smoke [--only lr_window]

The experiments are the files of harness/conf/experiment/<profile>/ (the quick profile: the
files of harness/conf/experiment/ itself; the findings profile: findings/), so a new experiment is smoke-tested without being
listed anywhere. Each runs as `python -m harness -m +experiment=<name>` with its own launcher
(the code path a full run takes) and these overrides: one training step, two examples per
batch and per evaluation, on the CPU, one thread a job. Every size that shapes the work (width,
sequence and test lengths, pairs, vocabulary, probe grid, cost lengths) stays the profile's, so
a configuration that cannot build, fit or finish fails here, in minutes, and not hours into a
cluster job. Probe and cost runs have no steps: they run whole (cost with one timed round).

The cost of the full profile is reported per experiment: jobs x steps x seconds per step, the
seconds per step measured in each smoke job (its one step, first-call set-up included, so an
upper estimate) and scaled from the smoke's batch to the profile's; each evaluation and the
end-of-run measurements are scaled from the smoke's examples to the profile's in the same way;
probe and cost runs count their measured time. The device is the one the smoke ran on; run the smoke on a GPU node for a GPU's figure.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

from analysis.pipeline import (compose_experiment, job_count, profile_experiments, render, report,  # noqa: F401
                               sweep_command, sweep_params)
from harness.outputs.atomic import write_text

SMOKE_BATCH = 2
SMOKE = ["logger=none", "trainer.max_steps=1", f"trainer.batch_size={SMOKE_BATCH}",
         f"trainer.eval_examples={SMOKE_BATCH}", f"trainer.measure_examples={SMOKE_BATCH}",
         "trainer.eval_every=1", "trainer.device=cpu", "trainer.threads=1", "trainer.ckpt_every=null",
         "trainer.target_accuracy=null", "trainer.progress=false", "cost.repeats=1"]
COST_FILE = "cost_estimate.json"


def experiments(profile: str) -> list[str]:
    """The experiment names of a profile, from its files: `<profile>/<name>` or `<name>`."""
    return profile_experiments(profile)


def grid_overrides(params: dict[str, list[str]], grid: str) -> list[str]:
    """`last`: each swept key but the mixer pinned to its last value (the profiles list sizes
    in increasing order), so the check runs every mixer at the largest sizes only."""
    if grid == "all":
        return []
    return [f"{k}={v[-1]}" for k, v in params.items() if k != "model"]


def run(profile: str, root: Path, out_dir: Path, specs, *, smoke_grid: str = "all", only=None,
        runner=None) -> int:
    """Run the smoke into ``root``, draw ``specs`` into ``out_dir``, print the cost; exit code
    0 when every job ran and every figure was drawn, 1 otherwise. ``only``: the experiments of
    the figures asked for (`--only`); None: every experiment file of the profile."""
    runner = runner or subprocess.run
    names = [n for n in experiments(profile) if only is None or n in only]
    started = time.time()
    failed = []
    for name in names:
        params = sweep_params(profile, name)
        cmd = [*sweep_command(profile, name, root / name), *SMOKE, *grid_overrides(params, smoke_grid)]
        print(f"smoke {name} ({job_count(params, smoke_grid)} jobs): {' '.join(cmd)}", flush=True)
        t0 = time.time()
        code = runner(cmd, check=False).returncode
        print(f"smoke {name}: exit {code} after {time.time() - t0:.0f} s", flush=True)
        if code != 0:
            failed.append(name)
    elapsed = time.time() - started
    written, missed = render(specs, root, out_dir)
    estimate = cost_estimate(profile, root, names)
    write_text(root / COST_FILE, json.dumps(estimate, indent=2) + "\n")  # whole or not at all
    print(format_estimate(estimate, profile, elapsed))
    if failed:
        print(f"python -m analysis.figures: smoke sweeps that failed: {', '.join(failed)}", file=sys.stderr)
    code = report(written, missed, specs, out_dir)
    return 1 if failed or code else 0


def _full_settings(profile: str, name: str) -> dict:
    """What the full profile runs per job of an experiment (its first grid point)."""
    params = sweep_params(profile, name)
    cfg = compose_experiment(profile, name, [f"{k}={v[0]}" for k, v in params.items()])
    tr = cfg.trainer
    return {"mode": cfg.mode, "max_steps": tr.max_steps, "batch_size": tr.batch_size,
            "eval_every": tr.eval_every, "eval_examples": tr.eval_examples,
            "measure_examples": min(tr.measure_examples, tr.eval_examples) if tr.measure else 0,
            "jobs": job_count(params, "all")}


def job_seconds(result: dict, full: dict) -> float | None:
    """The full profile's seconds for the job a smoke result stands for (None: not measured)."""
    summary = result.get("summary") or {}
    if result.get("mode") != "train":
        return summary.get("wall_time_s")
    step = summary.get("step_time_s")
    if step is None:
        return None
    config = result.get("config") or {}
    batch = config.get("trainer.batch_size") or SMOKE_BATCH
    examples = config.get("trainer.eval_examples") or SMOKE_BATCH
    measured = min(config.get("trainer.measure_examples") or SMOKE_BATCH, examples)
    measure = summary.get("measure_time_s") or 0.0
    setup = summary.get("setup_time_s") or 0.0
    steps = summary.get("steps") or 1
    evaluation = max(0.0, summary.get("wall_time_s", 0.0) - setup - steps * step - measure)  # one evaluation
    evals = full["max_steps"] // full["eval_every"] + 1
    return (setup + full["max_steps"] * step * full["batch_size"] / batch
            + evals * evaluation * full["eval_examples"] / examples
            + measure * full["measure_examples"] / max(1, measured))


# The GPU estimate: training FLOPs at a stated share of one H100's dense bf16 peak. An estimate,
# not a measurement: models this small rarely reach 40% of peak, and evaluation is left out.
GPU_NAME = "H100 SXM"
GPU_PEAK_FLOPS = 989e12      # dense bf16, no sparsity
GPU_UTILISATION = 0.40


def train_length(config: dict) -> int | None:
    """The training sequence length of a run's flat config, as its task derives it (a mixture
    pads to its longest entry; interference without seq_len stores its pairs and queries); None
    for a task that cannot be built from the config, or that is outside code (a results.json
    is data: drawing from it imports nothing it names, harness.outputs.trust)."""
    from harness.outputs.trust import code_names
    from harness.tasks import get_task
    from harness.tasks import train_length as task_length

    if "task.name" in code_names({"task.name": config.get("task.name")}):
        return None
    try:
        module = get_task(str(config.get("task.name")))
        fields = {k[len("task."):]: v for k, v in config.items() if k.startswith("task.") and k != "task.name"}
        return task_length(module, module.Config(**fields))
    except (ValueError, TypeError):
        return None


def job_flops(result: dict, full: dict) -> float | None:
    """Training FLOPs of the full job a smoke result stands for: 6 x parameters x tokens per step
    (forward and backward), plus for every layer that keeps keys (softmax, the sliding window, a
    hybrid's attention slots) the score and mixing products (6 x 2 x T x keys seen x d_model per
    example); None for probe and cost runs."""
    if result.get("mode") != "train":
        return None
    params = (result.get("summary") or {}).get("params")
    if params is None:
        return None
    config = result.get("config") or {}
    seq = train_length(config)
    if seq is None:
        return None
    tokens = full["batch_size"] * seq
    flops = 6.0 * params * tokens
    from harness.layers.registry import resolve

    for layer in layers_keeping_keys(config):  # scores and mixing grow with the keys each token sees
        window = getattr(resolve(layer.name).options_of(layer), "window", None)  # swa's option
        keys = seq if window is None else min(seq, int(window))
        flops += 6.0 * 2 * seq * keys * int(layer.d_model) * full["batch_size"]
    return flops * full["max_steps"]


def layers_keeping_keys(config: dict) -> list:
    """The ModelConfig of each layer of a run's flat config whose mixer keeps keys (softmax, swa;
    a hybrid's attention slots), as harness.model.layer_configs builds them; [] where the config
    does not build."""
    from harness.layers.options import LEGACY_KEYS
    from harness.layers.registry import keeps_keys
    from harness.model import ModelConfig, layer_configs

    known = set(ModelConfig.__dataclass_fields__) | set(LEGACY_KEYS)  # a recorded form keeps the old keys
    fields = {k[len("model."):]: v for k, v in config.items() if k.startswith("model.") and k[len("model."):] in known}
    try:
        return [layer for layer in layer_configs(ModelConfig(**fields)) if keeps_keys(str(layer.name))]
    except (ValueError, TypeError):
        return []


def gpu_hours(flops: float) -> float:
    return flops / (GPU_UTILISATION * GPU_PEAK_FLOPS) / 3600


def cost_estimate(profile: str, root: Path, names: list[str]) -> dict:
    """Per experiment: jobs, steps, measured seconds per step and the full profile's time."""
    from analysis.loader import NoResultsError, find_results

    rows = {}
    for name in names:
        full = _full_settings(profile, name)
        try:
            files = find_results(root / name)
        except NoResultsError:
            files = []
        results = [json.loads(f.read_text()) for f in files]
        ok = [r for r in results if r.get("status") == "ok"]
        seconds = [s for s in (job_seconds(r, full) for r in ok) if s is not None]
        steps = [r["summary"]["step_time_s"] for r in ok if r.get("mode") == "train"
                 and r.get("summary", {}).get("step_time_s") is not None]
        devices = sorted({str((r.get("env") or {}).get("device")) for r in ok})
        mean = sum(seconds) / len(seconds) if seconds else math.nan
        flops = [f for f in (job_flops(r, full) for r in ok) if f is not None]
        gpu = gpu_hours(sum(flops) / len(flops)) * full["jobs"] if flops else math.nan
        rows[name] = {
            "mode": full["mode"], "jobs": full["jobs"], "smoke_jobs": len(results), "smoke_ok": len(ok),
            "steps_per_job": full["max_steps"] if full["mode"] == "train" else None,
            "batch_size": full["batch_size"] if full["mode"] == "train" else None,
            "smoke_seconds_per_step": (sorted(steps)[len(steps) // 2] if steps else None),
            "seconds_per_job": mean, "total_seconds": mean * full["jobs"], "devices": devices,
            "gpu_hours_estimate": gpu,
        }
    total = sum(r["total_seconds"] for r in rows.values() if not math.isnan(r["total_seconds"]))
    gpu_total = sum(r["gpu_hours_estimate"] for r in rows.values() if not math.isnan(r["gpu_hours_estimate"]))
    return {"profile": profile, "experiments": rows, "total_seconds": total,
            "smoke_batch": SMOKE_BATCH, "gpu_hours_estimate": gpu_total,
            "gpu": {"name": GPU_NAME, "peak_flops": GPU_PEAK_FLOPS, "utilisation": GPU_UTILISATION}}


def _hours(seconds: float) -> str:
    return "n/a" if math.isnan(seconds) else f"{seconds / 3600:,.1f} h"


def format_estimate(estimate: dict, profile: str, elapsed: float) -> str:
    rows = estimate["experiments"]
    devices = sorted({d for r in rows.values() for d in r["devices"]}) or ["?"]
    lines = [f"smoke of the {profile} profile: {sum(r['smoke_jobs'] for r in rows.values())} jobs "
             f"({sum(r['smoke_ok'] for r in rows.values())} ok) in {elapsed:.0f} s",
             f"expected cost of the full {profile} profile on {', '.join(devices)}, one thread a job "
             f"(jobs x steps x seconds per step, scaled from batch {estimate['smoke_batch']}):",
             f"  {'experiment':<12} {'mode':<6} {'jobs':>6} {'steps':>7} {'s/step (smoke)':>15} "
             f"{'per job':>10} {'total':>12} {'GPU (estimate)':>15}"]
    for name, r in rows.items():
        steps = "-" if r["steps_per_job"] is None else f"{r['steps_per_job']:,}"
        per = "-" if r["smoke_seconds_per_step"] is None else f"{r['smoke_seconds_per_step']:.2f}"
        lines.append(f"  {name:<12} {r['mode']:<6} {r['jobs']:>6,} {steps:>7} {per:>15} "
                     f"{_hours(r['seconds_per_job']):>10} {_hours(r['total_seconds']):>12} "
                     f"{_gpu(r.get('gpu_hours_estimate', math.nan)):>15}")
    lines.append(f"  {'all':<12} {'':<6} {sum(r['jobs'] for r in rows.values()):>6,} {'':>7} {'':>15} {'':>10} "
                 f"{_hours(estimate['total_seconds']):>12} {_gpu(estimate.get('gpu_hours_estimate', math.nan)):>15}"
                 "  (job-hours: divide by the jobs run at once)")
    gpu = estimate.get("gpu") or {"name": GPU_NAME, "peak_flops": GPU_PEAK_FLOPS, "utilisation": GPU_UTILISATION}
    lines.append(f"GPU column: an estimate, not a measurement: training FLOPs (6 x parameters x tokens, plus "
                 f"softmax's and the window's score products; evaluation left out) at "
                 f"{gpu['utilisation']:.0%} of one {gpu['name']}'s dense bf16 peak "
                 f"({gpu['peak_flops'] / 1e12:,.0f} TFLOP/s), in GPU-hours")
    return "\n".join(lines)


def _gpu(hours: float) -> str:
    if math.isnan(hours):
        return "-"
    return f"{hours:,.1f} GPU-h" if hours < 48 else f"{hours / 24:,.1f} GPU-d"
