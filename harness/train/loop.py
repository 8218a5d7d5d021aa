"""Training loop: a run's plan -> task batches -> model -> metrics -> results.json.

`train` runs three phases: `start` (the seed, evaluation sets, model, optimiser, a resumed
checkpoint, the logger), `steps` (the step loop, evaluating on the validation split every
`trainer.eval_every` steps into metrics.jsonl, checkpointing every `trainer.ckpt_every`, stopping
early by harness.train.state.stop_reason) and `finish` (harness.train.finish: the test split, the
summary, the measurements, model.pt and results.json). The step's arithmetic (data stream, loss,
AdamW, schedule, precision) is harness.train.optim. Batches are made on the device `data_chunk`
steps at a time; the loss is read back to the host only when the progress bar refreshes, so the
hot loop has no other host-device sync.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm.auto import tqdm

from harness.config.plan import RunPlan
from harness.devices import set_run_determinism
from harness.errors import OutOfMemory, first_line, is_out_of_memory
from harness.model import label
from harness.outputs.results import METRICS_FILE, MetricsLog, base_results
from harness.train.evaluate import evaluate, make_eval_sets, periodic_sets
from harness.train.faults import FaultWatch, NumericalFault, StopRequest
from harness.train.finish import finish, report
from harness.train.optim import (autocast_factory, build_optimizer, initial_model, lm_loss, lr_schedule,
                                 train_batches)
from harness.train.state import LoopState, Run, StepClock, checkpoint_payload, restore_checkpoint, stop_reason


def train(plan: RunPlan, out_dir: Path, on_step: Callable[[int], None] | None = None,
          resume: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train the plan's model on its task (its resources checked: harness.train.memory.fitted); write
    metrics and results into out_dir.

    A checkpoint (`checkpoint-<step>-<digest>.pt`) is written every `trainer.ckpt_every` steps.
    ``resume``: the checkpoint of this configuration the run continues from (found and loaded when
    its directory was claimed: harness.outputs.rundir), which makes it end exactly as an
    uninterrupted run would; None starts afresh. ``on_step(step)`` is called after each optimizer
    step (and the loop's logging), before any evaluation: the loop benchmark times steps with it.
    """
    r = start(plan, out_dir, resume, on_step)
    failed = True
    try:
        reason = steps(r)
        last_eval = finish(r, reason)
        failed = False
    except NumericalFault as fault:
        fault.record["checkpoint"] = r.checkpoint_record
        raise
    except Exception as exc:  # an allocation that failed although the estimate fitted
        if not is_out_of_memory(exc):
            raise
        raise OutOfMemory(f"out of memory at step {r.loop.step} of training ({first_line(exc)}); "
                          f"lower trainer.batch_size or trainer.eval_examples, or use a larger device",
                          oom={"step": r.loop.step, "error": first_line(exc, 500)},
                          checkpoint=r.checkpoint_record) from None
    finally:
        r.terminate.restore()
        r.metrics.close()
        r.logger.finish(failed=failed)
    report(r.plan.cfg, r.results["summary"], last_eval, out_dir, r.memory_lines, label(r.plan.mcfg),
            r.results.get("mechanism"))
    return r.results


def start(plan: RunPlan, out_dir: Path, resume: dict[str, Any] | None = None,
          on_step: Callable[[int], None] | None = None) -> Run:
    """Everything before the first step: the seed, the evaluation sets, the model and optimiser
    (restored from ``resume``), the logger, the metrics file, the data
    stream and the progress display."""
    from harness.outputs.wandb_logger import make_logger

    started, t0, cpu_started = time.time(), time.perf_counter(), time.process_time()
    cfg, tr, device = plan.cfg, plan.trainer, plan.device
    if plan.eval_tokens < tr.eval_tokens:
        print(f"[harness] evaluation in pieces of {plan.eval_tokens:,} tokens (trainer.eval_tokens="
              f"{tr.eval_tokens:,} at once would not fit)")
    torch.manual_seed(cfg.seed)
    set_run_determinism(device)
    module, tcfg = plan.module, plan.tcfg
    eval_sets = make_eval_sets(module, tcfg, tr, cfg.seed, device)  # test: reported at the end
    # validation at the training length, every eval_every steps: what early stopping watches
    # and what a sweep chooses learning rates on (val_accuracy in the summary). The longer
    # settings' validation batches are never read: not kept, so they are freed at once.
    periodic = periodic_sets(make_eval_sets(module, tcfg, tr, cfg.seed, device, split="val"), plan.train_len)
    model = initial_model(plan)  # a resumed run's weights are restored below
    watch = FaultWatch(model, plan.mcfg.name)  # hooks first, so a compiled model keeps them
    step_model = torch.compile(model) if tr.compile else model
    opt = build_optimizer(model, tr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_schedule(tr))
    loop = LoopState(running=torch.zeros((), device=device))
    if resume is not None:
        loop = restore_checkpoint(resume, model, opt, sched)
        started -= loop.elapsed_s
        print(f"[harness] resuming from {resume['path']} at step {loop.step}")
    logger = make_logger(cfg.logger, dict(plan.flat), out_dir, name=f"{cfg.task.name}-{plan.mcfg.name}",
                         run_id=resume.get("logger_id") if resume else None)
    ckpt_step = loop.step if resume is not None else None
    r = Run(plan, out_dir, model, step_model, watch, opt, sched, autocast_factory(device, tr.precision), loop,
            eval_sets, periodic, logger, MetricsLog(out_dir / METRICS_FILE, resume_step=ckpt_step), None,
            base_results(cfg, plan.flat, plan.digest), started, cpu_started,
            ckpt_path=Path(resume["path"]) if resume is not None else None, ckpt_step=ckpt_step)
    r.terminate = StopRequest()  # a pre-empted job, or Ctrl-C, saves its step, then stops
    r.batches = train_batches(module, tcfg, tr, cfg.seed, device, start=loop.step)
    # a progress bar on a terminal; in a log file (a cluster job) one line per evaluation
    # instead of a carriage-return update at every refresh
    bar_on = bool(tr.progress) and sys.stderr.isatty()  # the stream tqdm writes to
    r.eval_lines = bool(tr.progress) and not bar_on
    r.bar = tqdm(total=tr.max_steps, initial=loop.step, desc=f"{cfg.task.name}/{plan.mcfg.name}",
                 disable=not bar_on, dynamic_ncols=True, leave=True)
    r.clock = StepClock(on_step)  # times the steps alone (the paper smoke's cost estimate)
    r.setup_s = r.clock.last - t0
    return r


def steps(r: Run) -> str:
    """The step loop, from the run's step on, until trainer.max_steps or an early stop (evaluated
    every eval_every steps, checkpointed every ckpt_every): why it stopped (the summary's
    stop_reason)."""
    tr = r.plan.trainer
    # the settings each step reads, as plain values: an OmegaConf read costs microseconds
    max_steps, log_every, eval_every, ckpt_every = tr.max_steps, tr.log_every, tr.eval_every, tr.ckpt_every
    grad_clip = float(tr.grad_clip)
    loop, watch, opt, sched, step_model, autocast = r.loop, r.watch, r.opt, r.sched, r.step_model, r.autocast
    while loop.step < max_steps:
        inputs, positions, targets = next(r.batches)
        with watch.forward_pass(), autocast():
            loss = lm_loss(step_model(inputs, positions), targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        loop.step += 1
        step = loop.step
        watch.clip_and_record(step, loss, grad_clip)
        opt.step()
        sched.step()
        loop.running += loss.detach()
        if step % log_every == 0 or step == max_steps:
            _log_loss(r, step, log_every)
        r.bar.update(1)
        r.clock(step)
        if step % eval_every == 0 or step == max_steps:
            why = _evaluate_val(r, step)
            if why is not None:
                return why if step < max_steps else "max_steps"
        due = ckpt_every and step % ckpt_every == 0
        if (due or r.terminate.requested) and step < max_steps:
            _checkpoint(r, step)
    return "max_steps"


def _log_loss(r: Run, step: int, log_every: int) -> None:
    """The mean training loss since the last refresh: read back (the loop's one host sync, which
    the fault check rides on), shown and logged."""
    loop = r.loop
    r.watch.check()
    loop.last_loss = (loop.running / (step % log_every or log_every)).item()
    loop.running.zero_()
    r.bar.set_postfix(loss=f"{loop.last_loss:.3f}", acc=f"{loop.last_eval.get('accuracy', 0):.3f}")
    r.logger.log({"train/loss": loop.last_loss, "train/lr": r.sched.get_last_lr()[0]}, step=step)


def _evaluate_val(r: Run, step: int) -> str | None:
    """The validation evaluation of this step, written to metrics.jsonl and the logger; why the run
    stops after it (harness.train.state.stop_reason), or None."""
    loop, tr = r.loop, r.plan.trainer
    r.watch.check()
    loop.last_eval = evaluate(r.model, r.periodic, r.autocast, tokens=r.plan.eval_tokens)
    loop.eval_step = step
    row = {"step": step, "time_s": time.time() - r.started, "split": "val",
           "accuracy": loop.last_eval["accuracy"], "loss": loop.last_eval["loss"],
           **{f"accuracy/{p['name']}": p["accuracy"] for p in loop.last_eval["settings"]}}
    r.metrics.write(row)
    if r.eval_lines:
        # the train loss is a mean over trainer.log_every steps: none yet before the first of them
        train = "" if math.isnan(loop.last_loss) else f"train loss {loop.last_loss:.3f}, "
        print(f"[harness] step {step}/{tr.max_steps}: {train}val accuracy {row['accuracy']:.3f}, "
              f"val loss {row['loss']:.3f}", flush=True)
    r.logger.log({f"eval/{k}": v for k, v in row.items() if k != "step"}, step=step)
    r.bar.set_postfix(loss=f"{loop.last_loss:.3f}", acc=f"{loop.last_eval['accuracy']:.3f}")
    loop.record_eval(step, loop.last_eval["accuracy"], loop.last_eval["loss"], float(tr.min_delta))
    return stop_reason(loop, loop.last_eval, step, tr.target_accuracy, tr.patience, int(tr.min_steps))


def _checkpoint(r: Run, step: int) -> None:
    """A resumable checkpoint of this step; after a termination request, the run stops here."""
    from harness.outputs import checkpoint

    r.watch.check()  # only a clean state is saved: the last checkpoint is always good
    r.loop.elapsed_s = time.time() - r.started
    kept = checkpoint.save_checkpoint(r.out_dir, step, checkpoint_payload(
        r.plan, r.model, r.opt, r.sched, r.loop, r.logger))
    if kept is not None:  # None: a directory holds its name (warned); the last one stands
        r.ckpt_path, r.ckpt_step = kept, step
    if r.terminate.requested:
        raise r.terminate.stopped(step, r.ckpt_path)
