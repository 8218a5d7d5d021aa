"""Grouped training against solo runs: CPU seconds per run, per training step, at the quick
profile's shapes.

For a shape (Hydra overrides: an experiment, a mixer, a width) and a group size G, the runs
are G seeds of it. Solo: harness.train.loop.train on `solo_runs` of them, one after another
(each run's cost is the same: one shape); grouped: harness.train.group.train_group on all G.
Both are timed from inside, by process CPU time at each step's end (their on_step callbacks),
over `steps` steps after `warmup`; evaluation waits until after the last timed step, and the
end-of-run measurements and model.pt are off, as they are not training steps. With one torch
thread, CPU seconds are what a run costs a core, whatever else the machine runs. On a GPU
(``--device cuda``) the clock is wall seconds, each stamp taken once the device has finished
the step's kernels (the GPU's time is not the process's), and torch keeps its threads.

With ``bound``, each row also times one solo run at the group's whole batch (G x batch): the
arithmetic a group step cannot do with less, so G x solo / that is the most grouping can save at
that shape on this machine, and grouped / that is what the group's own overhead costs.

`python -m harness.bench.group [--steps N] [--sizes 8,16] [--bound] [--device cuda] [--json PATH]`
prints the table of SHAPES (scripts/gpu_bench.sh runs it on a GPU).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from harness.bench.timing import median, sync
from harness.devices import kept_determinism

# The quick profile's shapes: capacity's d_model 8 (and 16), sharpness's d_model 32, a 4-layer hybrid.
CAPACITY = ["+experiment=capacity", "task.num_pairs=8"]
SHAPES: dict[str, list[str]] = {
    "capacity elu d_model 8": [*CAPACITY, "model=elu", "model.d_model=8"],
    "capacity deltanet d_model 8": [*CAPACITY, "model=deltanet", "model.d_model=8"],
    "capacity elu d_model 16": [*CAPACITY, "model=elu", "model.d_model=16"],
    "sharpness gated_deltanet d_model 32": ["+experiment=sharpness", "model=gated_deltanet"],
    "hybrid gated_deltanet*3+softmax d_model 32": [
        "+experiment=hybrid", "model=gated_deltanet",
        "model.layers=[gated_deltanet,gated_deltanet,gated_deltanet,softmax]"],
}


def shape_plans(overrides: Sequence[str], seeds: int, max_steps: int, out_dir: Path, device: str = "cpu") -> list:
    """Plans of `seeds` runs of the shape (seeds 0, 1, ...) on ``device``, fitted as run_job fits them."""
    from harness.config.compose import compose_config
    from harness.config.plan import prepare
    from harness.train.memory import fitted

    fixed = ["logger=none", "trainer.progress=false", "trainer.measure=false", "trainer.checkpoint=false",
             f"trainer.max_steps={max_steps}", f"trainer.eval_every={max_steps}", "trainer.target_accuracy=null",
             "trainer.patience=null", "trainer.ckpt_every=null", f"trainer.device={device}"]
    return [fitted(prepare(compose_config([*overrides, *fixed, f"seed={s}", f"out_dir={out_dir / str(s)}"])))
            for s in range(seeds)]


def clock_name(device: torch.device) -> str:
    """What the rows of a device count: a CPU's process time, a GPU's wall time."""
    return "cpu" if device.type == "cpu" else "wall"


def step_clock(device: torch.device) -> Callable[[], float]:
    """The seconds a step is stamped with on ``device`` (clock_name)."""
    if clock_name(device) == "cpu":
        return time.process_time

    def stamp() -> float:
        sync(device)  # the step's kernels are queued, not done, when the loop moves on
        return time.perf_counter()
    return stamp


def _per_step(stamps: list[float], warmup: int) -> float:
    """Seconds per step between the end of step `warmup` and the last step."""
    return (stamps[-1] - stamps[warmup - 1]) / (len(stamps) - warmup)


def solo_seconds(plan, warmup: int) -> float:
    """Seconds per step of one solo run (harness.train.loop.train), by the device's step_clock."""
    from harness.train.loop import train

    stamps: list[float] = []
    clock = step_clock(plan.device)
    with contextlib.redirect_stdout(io.StringIO()):  # train() reports its run
        train(plan, Path(plan.cfg.out_dir), on_step=lambda step: stamps.append(clock()))
    return _per_step(stamps, warmup)


def grouped_seconds(plans: list, warmup: int) -> float:
    """Seconds per step of the whole group (harness.train.group.train_group), by step_clock."""
    from harness.train.group import train_group

    stamps: list[float] = []
    clock = step_clock(plans[0].device)
    train_group(plans, on_step=lambda step, group: stamps.append(clock()))
    return _per_step(stamps, warmup)


def shape_rows(name: str, overrides: Sequence[str], sizes: Sequence[int], *, steps: int = 30, warmup: int = 5,
               solo_runs: int = 2, bound: bool = False, device: str = "cpu") -> list[dict[str, Any]]:
    """The shape's rows, one per group size: milliseconds per run and step (CPU time on a CPU, wall
    time on a GPU: the row's ``clock``), solo (the median of
    `solo_runs` runs, measured once for every size) and in a group of that size; with ``bound``,
    a solo run at the group's whole batch too (module docstring)."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="harness-bench-group-") as tmp:
        plans = shape_plans(overrides, max(sizes), warmup + steps, Path(tmp), device)
        batch = plans[0].trainer.batch_size
        solo = median([solo_seconds(p, warmup) for p in plans[:solo_runs]])
        for size in sizes:
            grouped = grouped_seconds(plans[:size], warmup) / size
            row = {"shape": name, "group_size": size, "batch_size": batch, "device": str(plans[0].device),
                   "clock": clock_name(plans[0].device),
                   "train_len": plans[0].train_len, "solo_ms_per_step": solo * 1e3,
                   "grouped_ms_per_step_per_run": grouped * 1e3, "speedup": solo / grouped,
                   "steps": steps, "warmup": warmup, "solo_runs": solo_runs, "overrides": list(overrides)}
            if bound:
                whole, = shape_plans([*overrides, f"trainer.batch_size={size * batch}"], 1, warmup + steps,
                                     Path(tmp) / f"whole-{size}", device)
                at_whole = solo_seconds(whole, warmup) / size  # per run's share of the batch
                row.update(solo_whole_batch_ms_per_run=at_whole * 1e3, bound=solo / at_whole,
                           overhead=grouped / at_whole)
            rows.append(row)
    return rows


def group_table(shapes: dict[str, list[str]] | None = None, sizes: Sequence[int] = (8, 16), device: str = "cpu",
                **kw) -> list[dict]:
    """The rows of every shape on ``device``; on a CPU with one torch thread (restored after)."""
    threads = torch.get_num_threads()
    if torch.device(device).type == "cpu":
        torch.set_num_threads(1)
    try:
        with kept_determinism():  # the loops set a run's (harness.devices.set_run_determinism)
            return [row for name, overrides in (shapes or SHAPES).items()
                    for row in shape_rows(name, overrides, sizes, device=device, **kw)]
    finally:
        torch.set_num_threads(threads)


def format_table(rows: list[dict]) -> str:
    bound = all("bound" in r for r in rows)
    clock = "/".join(sorted({r.get("clock", "cpu") for r in rows}))  # cpu: process time; wall: a GPU's
    head = f"| shape | G | solo {clock} ms/step | grouped {clock} ms/step per run | solo / grouped |"
    lines = [head + (" solo at G x batch, ms per run | bound | grouped / that |" if bound else ""),
             "|---|---|---|---|---|" + ("---|---|---|" if bound else "")]
    for r in rows:
        line = (f"| {r['shape']} | {r['group_size']} | {r['solo_ms_per_step']:.2f} | "
                f"{r['grouped_ms_per_step_per_run']:.2f} | {r['speedup']:.2f}x |")
        if bound:
            line += f" {r['solo_whole_batch_ms_per_run']:.2f} | {r['bound']:.2f}x | {r['overhead']:.2f} |"
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.bench.group", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--sizes", default="8,16", help="comma-separated group sizes")
    parser.add_argument("--shapes", default=None, help="comma-separated names of SHAPES (default: all)")
    parser.add_argument("--bound", action="store_true",
                        help="also time a solo run at the group's whole batch: what grouping can save at most")
    parser.add_argument("--device", default="cpu", help="cpu (CPU seconds, one thread) or cuda (wall seconds)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    shapes = SHAPES if args.shapes is None else {k: SHAPES[k] for k in args.shapes.split(",")}
    rows = group_table(shapes, [int(s) for s in args.sizes.split(",")], args.device, steps=args.steps,
                       warmup=args.warmup, bound=args.bound)
    print(format_table(rows))
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
