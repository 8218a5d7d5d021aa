"""Loop efficiency: training steps per second of the real loop over those of a bare loop.

The real loop is harness.train.loop.train itself, run on a composed configuration (the default
recall configuration unless told otherwise) with its progress bar, logging and metrics in
place; only the evaluation is moved to the end (trainer.eval_every = max_steps) and the
end-of-run measurements and checkpoint are off, as they are not training steps. Its steps
are timed from inside: train() calls its on_step callback at the end of each step, which
records the time. On CUDA a recorded time is only
trusted right after the loop's own host sync (every trainer.log_every steps), so the window
runs from one logging step to a later one.

The bare loop runs the same model configuration, optimizer (build_optimizer), precision,
gradient clipping and batch size with no data generation, metrics or logging: zero_grad,
forward, loss, backward, clip, step on one fixed batch.

Extras ratio: what a default step pays for what the harness adds to a plain model. The real
loop (as above) against a plain loop over the same data, optimizer, schedule and loss sync:
the same model with model.short_conv=false, no fault watch (no output, denominator, loss and
per-layer gradient checks) and no gradient clipping (so no per-layer norms either).
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from harness.bench.timing import median, sync
from harness.config.plan import RunPlan
from harness.devices import kept_determinism


def _loop_overrides(overrides: list[str], steps: int, device: str, out_dir: Path) -> list[str]:
    fixed = ["logger=none", "trainer.progress=false", "trainer.measure=false", "trainer.checkpoint=false",
             f"trainer.max_steps={steps}", f"trainer.eval_every={steps}", "trainer.target_accuracy=null",
             f"trainer.device={device}", f"out_dir={out_dir}"]
    return [*overrides, *fixed]


def loop_config(overrides: list[str], steps: int, device: str, out_dir: Path):
    """The timed loop's config, composed and validated."""
    from harness.config.compose import compose_config

    return compose_config(_loop_overrides(overrides, steps, device, out_dir))


def loop_plan(overrides: list[str], steps: int, device: str, out_dir: Path) -> RunPlan:
    """The timed loop's plan: its config validated once, its evaluation fitted to the device."""
    from harness.config.compose import compose_config
    from harness.config.plan import prepare
    from harness.train.memory import fitted

    return fitted(prepare(compose_config(_loop_overrides(overrides, steps, device, out_dir), validate=False)))


def _window(stamps: list[float], log_every: int, data_chunk: int, device: torch.device, skip: int) -> tuple[int, float]:
    """(steps, seconds) between two trusted step ends, skipping the first `skip` steps."""
    n = len(stamps)
    if device.type == "cuda":  # trusted only right after the loop's sync at a logging step
        ends = [s for s in range(log_every, n + 1, log_every) if s > skip]
    else:  # every stamp is exact; keep whole data chunks so that generation is counted fairly
        ends = [s for s in range(skip + data_chunk, n + 1, data_chunk)]
        ends = [skip] + ends if skip > 0 else ends
    if len(ends) < 2:
        raise ValueError(f"loop too short to time: {n} steps (log_every={log_every}, data_chunk={data_chunk})")
    first, last = ends[0], ends[-1]
    return last - first, stamps[last - 1] - stamps[first - 1]


def time_train_loop(plan: RunPlan) -> float:
    """Steps per second of harness.train.loop.train on the plan (its step loop only)."""
    from harness.train.loop import train

    stamps: list[float] = []
    with contextlib.redirect_stdout(io.StringIO()):  # train() reports its run
        train(plan, Path(plan.cfg.out_dir), on_step=lambda step: stamps.append(time.perf_counter()))
    tr = plan.trainer
    skip = max(tr.data_chunk, min(tr.log_every, tr.max_steps // 4))  # first steps allocate and warm up
    steps, seconds = _window(stamps, tr.log_every, tr.data_chunk, plan.device, skip)
    return steps / seconds


def time_bare_loop(plan: RunPlan, steps: int, warmup: int = 3) -> float:
    """Steps per second of forward + backward + optimizer alone on the plan's model and batch size."""
    from harness.tasks import label_positions
    from harness.train.optim import autocast_factory, build_optimizer, lm_loss

    tr, device = plan.trainer, plan.device
    batch = plan.module.make_batch(plan.tcfg, tr.batch_size, seed=0, device=device, split="train")
    positions, targets = label_positions(batch.targets)  # the head at the labels, as train() does
    torch.manual_seed(plan.cfg.seed)
    model = plan.build_model().to(device)
    step_model = torch.compile(model) if tr.compile else model
    opt = build_optimizer(model, tr)
    autocast = autocast_factory(device, tr.precision)

    def step() -> None:
        with autocast():
            loss = lm_loss(step_model(batch.inputs, positions), targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if tr.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), tr.grad_clip)
        opt.step()

    for _ in range(warmup):
        step()
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    return steps / (time.perf_counter() - start)


def time_plain_loop(plan: RunPlan, steps: int) -> float:
    """Steps per second of train()'s step loop without the harness's extras (see the module
    docstring): the plan's data, optimizer, schedule and loss sync every trainer.log_every steps,
    on its model with model.short_conv=false, no fault watch and no clipping."""
    from dataclasses import replace

    from harness.train.optim import autocast_factory, build_optimizer, lm_loss, lr_schedule, train_batches

    cfg, tr, device = plan.cfg, plan.trainer, plan.device
    module, tcfg = plan.module, plan.tcfg
    plain = replace(plan, mcfg=replace(plan.mcfg, short_conv=False), checked=False)  # validated as it is built
    torch.manual_seed(cfg.seed)
    model = plain.build_model().to(device)
    opt = build_optimizer(model, tr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_schedule(tr))
    autocast = autocast_factory(device, tr.precision)
    batches = train_batches(module, tcfg, tr, cfg.seed, device)
    running = torch.zeros((), device=device)
    stamps: list[float] = []
    for step in range(1, steps + 1):
        inputs, positions, targets = next(batches)
        with autocast():
            loss = lm_loss(model(inputs, positions), targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        running += loss.detach()
        if step % tr.log_every == 0 or step == steps:
            running.item()  # the loop's one host sync, as train() reads its running loss
            running.zero_()
        stamps.append(time.perf_counter())
    skip = max(tr.data_chunk, min(tr.log_every, steps // 4))
    n, seconds = _window(stamps, tr.log_every, tr.data_chunk, device, skip)
    return n / seconds


def extras_ratio(overrides: list[str] | None = None, *, steps: int = 200, rounds: int = 3,
                 device: str = "cpu") -> dict[str, Any]:
    """Plain-loop steps/s over real-loop steps/s (>= 1: what the extras cost), medians of
    `rounds` alternating runs of each."""
    overrides = list(overrides or [])
    loop_rates, plain_rates = [], []
    with kept_determinism(), tempfile.TemporaryDirectory(prefix="harness-bench-loop-") as tmp:
        plan = loop_plan(overrides, steps, device, Path(tmp))
        for _ in range(rounds):
            loop_rates.append(time_train_loop(plan))
            plain_rates.append(time_plain_loop(plan, steps))
    loop, plain = median(loop_rates), median(plain_rates)
    return {"ratio": plain / loop, "loop_steps_per_s": loop, "plain_steps_per_s": plain,
            "loop_samples": loop_rates, "plain_samples": plain_rates, "steps": steps, "rounds": rounds,
            "overrides": overrides, "model": plan.mcfg.name, "task": plan.cfg.task.name,
            "plain": "model.short_conv=false, no fault watch, no gradient clipping"}


def loop_efficiency(overrides: list[str] | None = None, *, steps: int = 200, rounds: int = 3,
                    device: str = "cpu") -> dict[str, Any]:
    """Real-loop steps/s over bare steps/s, medians of `rounds` alternating runs of each."""
    overrides = list(overrides or [])
    loop_rates, bare_rates = [], []
    with kept_determinism(), tempfile.TemporaryDirectory(prefix="harness-bench-loop-") as tmp:
        plan = loop_plan(overrides, steps, device, Path(tmp))
        for _ in range(rounds):
            loop_rates.append(time_train_loop(plan))  # train() sets its own determinism flags,
            bare_rates.append(time_bare_loop(plan, steps))  # which the bare loop then shares
    loop, bare = median(loop_rates), median(bare_rates)
    return {"efficiency": loop / bare, "loop_steps_per_s": loop, "bare_steps_per_s": bare,
            "loop_samples": loop_rates, "bare_samples": bare_rates, "steps": steps, "rounds": rounds,
            "overrides": overrides,
            "model": plan.mcfg.name, "task": plan.cfg.task.name, "batch_size": plan.trainer.batch_size}
