"""Training loop: a run's plan -> task batches -> model -> metrics -> results.json.

`train` runs three phases: `start` (the seed, evaluation sets, model, optimiser, a resumed
checkpoint, the logger), `steps` (the step loop with its evaluations and checkpoints) and
`finish` (the final evaluations, the summary, the measurements, model.pt and results.json).
Evaluation itself is harness.train.evaluate.

AdamW with warmup and cosine decay, gradient clipping, evaluation on the validation split
every `trainer.eval_every` steps and at the end (metrics.jsonl; early stop once every
evaluation setting reaches `trainer.target_accuracy`, or after `trainer.patience` evaluations
without improvement: the summary's `stop_reason`), and on the test split once at the end
(the accuracy results.json reports; `val_accuracy` beside it is what a sweep selects on).
Training batches are generated on the device, `data_chunk` steps at a time in one vectorised
call; the loss is read back to the host only when the progress bar refreshes, so the hot loop
has no other host-device sync.
"""
from __future__ import annotations

import dataclasses
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from tqdm.auto import tqdm

from harness.config.plan import RunPlan
from harness.errors import OutOfMemory, RunError, first_line, is_out_of_memory
from harness.layers.parts import qk_width
from harness.model import label
from harness.outputs.results import METRICS_FILE, RESULTS_FILE, MetricsLog, base_results, env_info, write_json
from harness.devices import format_bytes
from harness.tasks import IGNORE, label_positions
from harness.train.evaluate import (EvalSet, evaluate, make_eval_sets, periodic_sets, setting_names,
                                    with_val_accuracy)


def build_optimizer(model: torch.nn.Module, tr) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices only (not on norms, biases, gains or decay rates), and
    never on a parameter its module marks `_no_weight_decay` (Mamba-2's dt_bias, A_log, D)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        decays = p.dim() >= 2 and "embed" not in name and not getattr(p, "_no_weight_decay", False)
        (decay if decays else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": tr.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=tr.lr, betas=(0.9, 0.98), eps=1e-8)


def lr_schedule(tr) -> Callable[[int], float]:
    """The learning-rate factor of each step: linear warmup, then cosine from 1 down to
    `min_lr_ratio` at `max_steps`. The settings are read once, as plain numbers: the scheduler
    calls this every step, and reading an OmegaConf node costs more than the arithmetic."""
    warmup, max_steps, floor = int(tr.warmup_steps), int(tr.max_steps), float(tr.min_lr_ratio)
    span = max(1, max_steps - warmup)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / span)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    return factor


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the labelled entries; logits (B, K, V) and targets (B, K), K the
    positions the head ran at (all T, or the labelled ones: harness.tasks.label_positions)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE)


def train_batches(module, tcfg, tr, seed: int, device: torch.device, start: int = 0) -> Iterator[Any]:
    """Endless training batches (inputs (B, T), positions (B, K), targets (B, K)) from batch
    ``start`` on, `data_chunk` of them per vectorised generator call. positions are the labelled
    positions (the head and the loss run there only); finding them costs one host sync per
    generator call. Batch i depends on (seed, i) alone, so a resumed run gets the same data."""
    chunk, skip = divmod(start, tr.data_chunk)
    while True:
        big = module.make_batch(tcfg, tr.batch_size * tr.data_chunk,
                                seed=seed * 1_000_003 + chunk, device=device, split="train")
        positions, targets = label_positions(big.targets)
        for i in range(skip, tr.data_chunk):
            sl = slice(i * tr.batch_size, (i + 1) * tr.batch_size)
            yield big.inputs[sl], positions[sl], targets[sl]
        chunk, skip = chunk + 1, 0


def autocast_factory(device: torch.device, precision: str):
    enabled = precision == "bf16"

    def ctx():
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=enabled)

    return ctx


def _measure(model, eval_sets: list[EvalSet], examples: int, train_len: int) -> dict[str, Any]:
    """Sharpness and SNR on the first `examples` examples of every evaluation set no longer than
    the training length (the summary from the first); `measure_examples` in the summary is the
    count actually used. Then the crosstalk law from the model's own statistics
    (harness.measure.trained_theory) on the same examples, added to each heads row and, for the
    summary's retrieval head, to the summary. Longer sets are evaluated, not measured: the
    effective weights cost O(T^2) per read, and what carries to those lengths is the
    out-of-sample law (_measure_into)."""
    from harness.measure.trained import measure_model
    from harness.measure.trained_theory import measure_trained_theory, merge_rows

    heads, summary, status = [], {}, {}
    measured_sets = [es for es in eval_sets if es.seq_len <= train_len] or eval_sets[:1]
    for i, es in enumerate(measured_sets):
        out = measure_model(model, es.batch, max_examples=examples)
        found_summary = out["summary"]
        retrieval = (found_summary.get("retrieval_layer"), found_summary.get("retrieval_head"))
        found = measure_trained_theory(model, es.batch, max_examples=examples,
                                       retrieval=retrieval if None not in retrieval else None)
        heads.extend(merge_rows(out["heads"], found))
        status = status or {**out["measure"], "trained_theory": found["status"]}
        if i == 0:
            summary = {**found_summary, **found["summary"]}
    return {"summary": summary, "heads": heads, "measure": status}


def state_summary(model, task_seq_len: int) -> dict[str, Any]:
    """Decoding memory at this length in float32 bytes, by its two parts (LanguageModel.memory):
    the fixed recurrent state and the attention layers' KV cache, beside what a softmax KV cache
    of the model's geometry would hold. Per layer and per head only where every layer agrees (a
    hybrid's layers differ: results.json "memory" has each layer's row); a layer that declares
    no state_size leaves the totals out."""
    from harness.ops import kv_cache_elements

    cfg, bytes_per = model.cfg, 4
    mem = model.memory(task_seq_len)
    kv = kv_cache_elements(task_seq_len, qk_width(cfg), cfg.d_model // cfg.n_heads)  # softmax's, per head
    out: dict[str, Any] = {"d_key": model.d_key, "d_head": model.d_head,
                           "kv_cache_bytes": kv * cfg.n_heads * cfg.n_layers * bytes_per}
    rows = mem["layers"]
    if mem["unknown_layers"] or any(r["elements"] is None for r in rows):
        return out
    state, cache = mem["state_elements"] or 0, mem["kv_cache_elements"] or 0
    out.update(state_bytes=(state + cache) * bytes_per, recurrent_state_bytes=state * bytes_per,
               attention_kv_cache_bytes=cache * bytes_per)
    for key, column in (("state_elements_per_layer", "elements"), ("state_elements_per_head", "elements_per_head")):
        values = {r[column] for r in rows}
        if len(values) == 1 and None not in values:
            out[key] = values.pop()
    return out


def memory_lines(memory: dict[str, Any]) -> list[str]:
    """The printed account of LanguageModel.memory: each kind's layers and elements per head."""
    lines = []
    for kind, what in (("state", "recurrent state"), ("kv_cache", "KV cache")):
        rows = [r for r in memory["layers"] if r["kind"] == kind]
        if not rows:
            continue
        per = ", ".join(f"{r['layer']}: {r['elements_per_head']:,}/head x {r['n_heads']}"
                        if r["elements_per_head"] is not None else f"{r['layer']}: {r['elements']:,}" for r in rows)
        total = memory[f"{kind}_elements"]
        grows = " (grows with length)" if any(r.get("grows") for r in rows) else ""
        lines.append(f"{what} {total:,} elements{grows} "
                     f"(layer {per})")
    return lines


class StepClock:
    """The loop's on_step callback, timing each step: from the loop's start (or the previous
    step's end) to the end of its optimizer step. The median drops the intervals that also hold
    an evaluation or a checkpoint; a single step is timed whole (its first-call set-up included)."""

    def __init__(self, then: Callable[[int], None] | None = None) -> None:
        self.then, self.last, self.intervals = then, time.perf_counter(), []

    def __call__(self, step: int) -> None:
        now = time.perf_counter()
        self.intervals.append(now - self.last)
        self.last = now
        if self.then is not None:
            self.then(step)

    def seconds_per_step(self) -> float | None:
        if not self.intervals:
            return None
        ordered = sorted(self.intervals)
        return ordered[len(ordered) // 2]


# A validation loss this far below the best (in nats, absolute) is an improvement. Absolute, not
# relative: at chance the loss sits near ln(values) and a relative 0.1 % is about as strict, but a
# run that has converged keeps halving a loss near zero, so a relative rule never stops it.
LOSS_DELTA = 0.01


def stop_reason(loop: "LoopState", last_eval: dict[str, Any], step: int, target_accuracy: float | None,
                patience: int | None, min_steps: int) -> str | None:
    """Why the run stops after this evaluation, or None to go on: "target_accuracy" once every
    setting reaches it, "plateau" after `patience` evaluations without improvement (from step
    `min_steps` on)."""
    if target_accuracy is not None and last_eval["min_accuracy"] >= target_accuracy:
        return "target_accuracy"
    if patience is not None and loop.since_best >= patience and step >= min_steps:
        return "plateau"
    return None


@dataclass
class LoopState:
    """What the training loop carries from step to step besides the model and optimiser."""
    step: int = 0
    running: Optional[torch.Tensor] = None   # summed loss since the last progress refresh
    last_loss: float = float("nan")
    last_eval: dict[str, Any] = field(default_factory=dict)
    eval_step: int = -1
    elapsed_s: float = 0.0                   # wall time before this process (a resumed run)
    # the plateau stop's state (in the checkpoint, so a resumed run stops at the same step)
    best_accuracy: Optional[float] = None    # the best validation accuracy so far
    best_step: Optional[int] = None          # the step it was first reached at
    best_loss: Optional[float] = None        # the lowest validation loss so far
    since_best: int = 0                      # evaluations in a row without improvement

    def record_eval(self, step: int, accuracy: float, loss: float, min_delta: float) -> None:
        """Update the plateau state with one validation evaluation. It improves when the accuracy
        beats the best by more than `min_delta`, or the loss falls below the best by more than
        LOSS_DELTA nats: every mixer sits near zero accuracy for a few hundred steps before it
        escapes, and only the loss moves there."""
        improved = (self.best_accuracy is None or accuracy > self.best_accuracy + min_delta
                    or loss < self.best_loss - LOSS_DELTA)
        if self.best_accuracy is None or accuracy > self.best_accuracy:
            self.best_accuracy, self.best_step = accuracy, step
        self.best_loss = loss if self.best_loss is None else min(self.best_loss, loss)
        self.since_best = 0 if improved else self.since_best + 1

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _checkpoint_payload(plan: RunPlan, model, opt, sched, loop: LoopState, logger) -> dict[str, Any]:
    from harness.outputs import checkpoint

    return {"format": checkpoint.FORMAT, "step": loop.step, "config_hash": plan.digest,
            "config": plan.flat, "model": model.state_dict(), "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(), "rng": checkpoint.rng_state(), "loop": loop.as_dict(),
            "logger_id": logger.run_id}


def _restore(saved: dict[str, Any], model, opt, sched) -> LoopState:
    from harness.outputs import checkpoint

    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["optimizer"])  # moves the moments onto the parameters' device
    sched.load_state_dict(saved["scheduler"])
    checkpoint.set_rng_state(saved["rng"])
    loop = LoopState(**saved["loop"])
    loop.running = loop.running.to(next(model.parameters()).device)
    return loop


@dataclass
class Run:
    """A training run under way: its plan, the model and optimiser, the evaluation sets, the loop's
    state and where it writes (what the phases start, steps and finish pass on)."""
    plan: RunPlan
    out_dir: Path
    model: Any
    step_model: Any                  # the model the step calls (compiled with trainer.compile)
    watch: Any                       # harness.train.faults.FaultWatch
    opt: Any
    sched: Any
    autocast: Callable[[], Any]
    loop: LoopState
    eval_sets: list[EvalSet]         # the test split: reported at the end
    periodic: list[EvalSet]          # the validation split, evaluated every eval_every steps
    logger: Any
    metrics: MetricsLog
    terminate: Any                   # harness.train.faults.StopRequest
    results: dict[str, Any]
    started: float                   # wall-clock start (earlier by a resumed run's elapsed time)
    cpu_started: float
    ckpt_path: Optional[Path] = None
    ckpt_step: Optional[int] = None
    batches: Any = None
    bar: Any = None
    clock: Optional[StepClock] = None
    eval_lines: bool = False         # one line per evaluation (a non-terminal log) instead of the bar
    setup_s: float = 0.0             # this process's seconds before its first step
    memory_lines: Optional[list] = None  # the printed account of the model's memory (memory_lines)

    @property
    def checkpoint_record(self) -> dict[str, Any] | None:
        return {"path": str(self.ckpt_path), "step": self.ckpt_step} if self.ckpt_step is not None else None


def train(plan: RunPlan, out_dir: Path, on_step: Callable[[int], None] | None = None,
          resume: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train the plan's model on its task (its resources checked: harness.run.resources); write
    metrics and results into out_dir.

    A checkpoint (`checkpoint-<step>-<digest>.pt`) is written every `trainer.ckpt_every` steps.
    ``resume``: the checkpoint of this configuration the run continues from (found and loaded when
    its directory was claimed: harness.outputs.rundir), which makes it end exactly as an
    uninterrupted run would; None starts afresh. ``on_step(step)`` is called after each optimizer
    step (and the loop's logging), before any evaluation: the loop benchmark times steps with it.
    """
    from harness.train.faults import NumericalFault

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
    from harness.outputs import checkpoint
    from harness.outputs.wandb_logger import make_logger
    from harness.train.faults import FaultWatch, StopRequest

    started, t0, cpu_started = time.time(), time.perf_counter(), time.process_time()
    cfg, tr, device = plan.cfg, plan.cfg.trainer, plan.device
    if plan.eval_tokens < tr.eval_tokens:
        print(f"[harness] evaluation in pieces of {plan.eval_tokens:,} tokens (trainer.eval_tokens="
              f"{tr.eval_tokens:,} at once would not fit)")
    torch.manual_seed(cfg.seed)
    if device.type == "cpu":
        torch.use_deterministic_algorithms(True, warn_only=True)
    module, tcfg = plan.module, plan.tcfg
    eval_sets = make_eval_sets(module, tcfg, tr, cfg.seed, device)  # test: reported at the end
    # validation at the training length, every eval_every steps: what early stopping watches
    # and what a sweep chooses learning rates on (val_accuracy in the summary). The longer
    # settings' validation batches are never read: not kept, so they are freed at once.
    periodic = periodic_sets(make_eval_sets(module, tcfg, tr, cfg.seed, device, split="val"), plan.train_len)
    model = plan.build_model().to(device)
    if tr.init_jitter and resume is None:
        jitter_weights(model, tr.init_jitter, cfg.seed)
    watch = FaultWatch(model, plan.mcfg.name)  # hooks first, so a compiled model keeps them
    step_model = torch.compile(model) if tr.compile else model
    opt = build_optimizer(model, tr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_schedule(tr))
    loop = LoopState(running=torch.zeros((), device=device))
    if resume is not None:
        loop = _restore(resume, model, opt, sched)
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


JITTER_STREAM = 104_729  # the perturbation's generator: seed * this + 1, apart from every other stream


@torch.no_grad()
def jitter_weights(model: torch.nn.Module, size: float, seed: int) -> None:
    """w <- w (1 + size z) for every parameter, z ~ N(0, 1) drawn on the CPU in float64 from the
    run's own stream (trainer.init_jitter): the same perturbation on every machine."""
    gen = torch.Generator().manual_seed(seed * JITTER_STREAM + 1)
    for param in model.parameters():
        z = torch.randn(param.shape, generator=gen, dtype=torch.float64)
        param.mul_((1.0 + size * z).to(device=param.device, dtype=param.dtype))


def steps(r: Run) -> str:
    """The step loop, from the run's step on, until trainer.max_steps or an early stop (evaluated
    every eval_every steps, checkpointed every ckpt_every): why it stopped (the summary's
    stop_reason)."""
    tr = r.plan.cfg.trainer
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
    stops after it (harness.train.loop.stop_reason), or None."""
    loop, tr = r.loop, r.plan.cfg.trainer
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
    kept = checkpoint.save_checkpoint(r.out_dir, step, _checkpoint_payload(
        r.plan, r.model, r.opt, r.sched, r.loop, r.logger))
    if kept is not None:  # None: a directory holds its name (warned); the last one stands
        r.ckpt_path, r.ckpt_step = kept, step
    if r.terminate.requested:
        raise r.terminate.stopped(step, r.ckpt_path)


def finish(r: Run, reason: str) -> dict[str, Any]:
    """After the last step: the final validation (unless this step had it), the test split's
    evaluation (every setting, the longer ones too, with each one's peak memory), the summary,
    the measurements, then model.pt and results.json. Returns the test evaluation."""
    if r.bar is not None:  # a group's member has none (harness.train.group.runs)
        r.bar.close()
    r.watch.check()
    loop, tr, model = r.loop, r.plan.cfg.trainer, r.model
    step, val_eval = loop.step, loop.last_eval
    if loop.eval_step != step:
        val_eval = evaluate(model, r.periodic, r.autocast, tokens=r.plan.eval_tokens)
        loop.record_eval(step, val_eval["accuracy"], val_eval["loss"], float(tr.min_delta))
    last_eval = evaluate(model, r.eval_sets, r.autocast, tokens=r.plan.eval_tokens, memory=True)
    summary: dict[str, Any] = {
        "accuracy": last_eval["accuracy"], "loss": last_eval["loss"],
        "val_accuracy": val_eval["accuracy"], "val_loss": val_eval["loss"], "steps": step,
        "stopped_early": reason != "max_steps", "stop_reason": reason, "steps_run": step,
        "best_val_accuracy": loop.best_accuracy, "best_val_step": loop.best_step,
        "params": sum(p.numel() for p in model.parameters()), "step_time_s": r.clock.seconds_per_step(),
        **state_summary(model, r.plan.max_len),
    }
    for p in last_eval["settings"]:
        summary[f"accuracy/{p['name']}"] = p["accuracy"]
    for p in val_eval["settings"]:
        summary[f"val_accuracy/{p['name']}"] = p["accuracy"]
    results = r.results
    results["layers"] = model.construction()  # each layer's mixer, its constructor arguments, what did not apply
    memory = model.memory(r.plan.max_len)
    r.memory_lines = [f"T = {memory['sequence_length']:,}", *memory_lines(memory)]
    # one row per layer (a table for the loader); the totals of each kind are in the summary
    results["memory"] = [{**row, "seq_len": memory["sequence_length"]} for row in memory["layers"]]
    results["slices"] = with_val_accuracy(last_eval["slices"], val_eval["slices"])
    results["settings"] = last_eval["settings"]
    summary["eval_peak_mem_bytes"] = max(p["peak_mem_bytes"] for p in last_eval["settings"])
    if tr.measure:
        _measure_into(r, summary)
    if tr.intervene:
        _intervene_into(r, summary)
    if tr.ablate:
        _ablate_into(r, summary)
    summary["setup_time_s"] = r.setup_s  # this process's, before its first step
    summary["wall_time_s"] = time.time() - r.started
    # CPU seconds of this process (this start only): with trainer.threads=1 about the wall
    # time the run takes on an idle core, whatever else the machine is doing.
    summary["cpu_time_s"] = time.process_time() - r.cpu_started
    results["summary"] = summary
    results["env"] = env_info(str(r.plan.device))
    _save(r, summary)
    return last_eval


def _measure_into(r: Run, summary: dict[str, Any]) -> None:
    """The end-of-run measurements (harness.train.loop._measure) and the out-of-sample law: the
    statistics at the training setting (validation data), then every test setting predicted from
    its layout alone (harness.measure.out_of_sample), into the summary and results."""
    from harness.measure.trained_theory import add_out_of_sample

    plan, tr = r.plan, r.plan.cfg.trainer
    measure_t0 = time.perf_counter()
    measured = _measure(r.model, r.eval_sets, tr.measure_examples, plan.train_len)
    summary.update(add_out_of_sample(r.results, r.model, plan.module, plan.tcfg, r.eval_sets,
                                     examples=tr.eval_examples, max_examples=tr.measure_examples,
                                     seed=plan.cfg.seed))
    summary["measure_time_s"] = time.perf_counter() - measure_t0
    summary.update({k: v for k, v in measured["summary"].items() if k not in summary})
    r.results["heads"] = measured["heads"]
    r.results["measure"] = measured["measure"]


def _intervene_into(r: Run, summary: dict[str, Any]) -> None:
    """Interchange interventions (harness.measure.intervene) on the first measure_examples examples
    of the test split at the training length, what mode=intervene computes from model.pt: the rows
    (results' intervene), the mechanism the rule names (mechanism) and the numbers it read (the
    summary's mechanism_*), so a figure redraws from results.json alone."""
    from harness.measure.intervene import intervene
    from harness.measure.mechanism import evidence, mechanism_label

    started = time.perf_counter()
    test = periodic_sets(r.eval_sets, r.plan.train_len)[0]
    found = intervene(r.model, test.batch, seed=r.plan.cfg.seed, max_examples=r.plan.cfg.trainer.measure_examples)
    r.results["intervene"] = found["rows"]
    r.results["mechanism"] = mechanism_label(found["rows"])
    r.results.setdefault("measure", {})["intervene"] = found["skipped"] or "ok"
    summary.update({f"mechanism_{k}": v for k, v in evidence(found["rows"]).items()})
    summary["intervene_time_s"] = time.perf_counter() - started


def _ablate_into(r: Run, summary: dict[str, Any]) -> None:
    """The run's own ablation (trainer.ablate): what `mode=ablate ablate.run=<this run>` computes
    with the same ablate.* settings (harness.measure.ablate.ablate_run), its rows into
    results.json's ablate table, so a figure needs no model.pt to read them."""
    from harness.measure.ablate import ablate_run, settings

    started = time.perf_counter()
    found = ablate_run(r.model, r.plan.cfg, **settings(r.plan.cfg.ablate))
    summary["ablate_time_s"] = time.perf_counter() - started
    r.results["ablate"] = found["rows"]
    r.results.setdefault("measure", {})["ablate"] = found["skipped"] or "ok"


def _save(r: Run, summary: dict[str, Any]) -> None:
    """model.pt (its checksum into results.json: checkpoint.load_model verifies it), results.json,
    the checkpoints removed (the run is finished), the logger's summary."""
    from harness.outputs import checkpoint

    cfg, results = r.plan.cfg, r.results
    if cfg.trainer.checkpoint:
        results["files"] = {checkpoint.MODEL_FILE: checkpoint.save_model(
            r.out_dir, {"model": r.model.state_dict(), "config": OmegaConf.to_container(cfg, resolve=True)})}
    write_json(r.out_dir / RESULTS_FILE, results)
    checkpoint.remove_checkpoints(r.out_dir)  # finished: model.pt and results.json replace them
    r.logger.summary({k: v for k, v in summary.items() if isinstance(v, (int, float, bool))})


def report(cfg, summary: dict[str, Any], last_eval: dict[str, Any], out_dir: Path, memory: list[str],
            name: str, mechanism: str | None = None) -> None:
    per = ", ".join(f"{p['name']}: {p['accuracy']:.3f}" for p in last_eval["settings"])
    print(f"[harness] {cfg.task.name}/{name}: accuracy {summary['accuracy']:.3f} "
          f"({per}) after {summary['steps']} steps, {summary['wall_time_s']:.0f} s")
    if "state_bytes" in summary:
        print(f"[harness] memory at {memory[0]}: {'; '.join(memory[1:])}; "
              f"{format_bytes(summary['state_bytes'])} in all (a softmax KV cache at this length: "
              f"{format_bytes(summary['kv_cache_bytes'])})")
    if summary.get("target_weight") is not None and "snr_measured" in summary:
        print(f"[harness] retrieval head: weight on the correct key {summary['target_weight']:.3f}, "
              f"SNR measured {summary.get('snr_measured', float('nan')):.2f} "
              f"vs predicted {summary.get('snr_predicted', float('nan')):.2f}")
    elif summary.get("target_weight") is not None:  # harness.measure.jacobian, for a mixer without weights
        print(f"[harness] retrieval layer ({summary.get('weights')}): weight on the correct key "
              f"{summary['target_weight']:.3f}")
    if mechanism is not None:
        print(f"[harness] mechanism (interchange interventions): {mechanism}")
    print(f"[harness] results: {out_dir / RESULTS_FILE}")
