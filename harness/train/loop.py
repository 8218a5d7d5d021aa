"""Training loop: config -> task batches -> model -> metrics -> results.json.

AdamW with warmup and cosine decay, gradient clipping, evaluation on the validation split
every `trainer.eval_every` steps and at the end (metrics.jsonl; early stop once every
evaluation setting reaches `trainer.target_accuracy`, or after `trainer.patience` evaluations
without improvement: the summary's `stop_reason`), and on the test split once at the end
(the accuracy results.json reports; `val_accuracy` beside it is what a sweep selects on).
Training batches are generated on the device, `data_chunk` steps at a time in one vectorised call; the loss is read back to the host only when the progress
bar refreshes, so the hot loop has no other host-device sync.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from harness.errors import OutOfMemory, RunError, first_line, is_out_of_memory
from harness.layers.parts import qk_width
from harness.outputs.results import (METRICS_FILE, RESULTS_FILE, MetricsLog, base_results, env_info,
                             flat_config, write_json)
from harness.config.build import build_model, model_config, task_config
from harness.devices import select_device
from harness.tasks import label_positions, train_length
from harness.train.memory import examples_per_pass

IGNORE = -100


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


@dataclass
class EvalSet:
    """A held-out batch for one evaluation setting (fixed for the whole run)."""
    name: str
    batch: Any
    seq_len: int


def setting_names(settings: list) -> list[str]:
    """A name per evaluation setting from the fields in which the settings differ, in the order
    of the task's Config ("num_pairs=8", "seq_len=1024,num_pairs=8", "seq_len=4096,depth=0.5");
    a single setting is named by its num_pairs where it has one, else "set0"."""
    rows = [dataclasses.asdict(s) if dataclasses.is_dataclass(s) else dict(vars(s)) for s in settings]
    fields = [f for f in rows[0] if len({repr(r.get(f)) for r in rows}) > 1] if rows else []
    if not fields and rows and "num_pairs" in rows[0]:
        fields = ["num_pairs"]
    if not fields:
        return [f"set{i}" for i in range(len(rows))]
    return [",".join(f"{f}={r[f]:g}" if isinstance(r[f], float) else f"{f}={r[f]}" for f in fields) for r in rows]


def make_eval_sets(module, tcfg, tr, seed: int, device: torch.device, split: str = "test") -> list[EvalSet]:
    """One held-out batch of `trainer.eval_examples` examples per evaluation setting of the task
    (its eval_settings: test N x test lengths, say), from the `split` stream: "val" is evaluated
    during training (early stop, and the split a sweep chooses learning rates on), "test" once
    at the end (the reported numbers). A task that trains on other settings than it tests (the
    recall task's mixture) names its validation settings with `val_settings`."""
    settings = module.eval_settings(tcfg)
    if split == "val" and hasattr(module, "val_settings"):
        settings = module.val_settings(tcfg)
    sets = []
    for i, (setting, name) in enumerate(zip(settings, setting_names(settings))):
        batch = module.make_batch(setting, tr.eval_examples, seed=seed * 7919 + i,
                                  device=device, split=split)
        sets.append(EvalSet(name=name, batch=batch, seq_len=batch.inputs.shape[1]))
    return sets


def periodic_sets(eval_sets: list[EvalSet], train_len: int) -> list[EvalSet]:
    """The sets evaluated every `trainer.eval_every` steps (and that early stopping watches):
    those no longer than the training length. Longer ones measure extrapolation, not training
    progress, and are evaluated once, at the end; when every set is longer (the run asks for
    nothing else), all are periodic."""
    return [es for es in eval_sets if es.seq_len <= train_len] or list(eval_sets)


EVAL_FORM = "chunk"  # evaluation runs the linear families in the chunk form: memory linear in T


def _eval_pass(model, inputs: torch.Tensor, targets: torch.Tensor, autocast):
    """One forward pass with the head at the labelled positions: (logits (B, K, V), targets (B, K),
    positions (B, K))."""
    positions, tgt = label_positions(targets)
    with autocast():
        logits = model(inputs, positions)
    return logits, tgt, positions


def _evaluate_set(model, es: EvalSet, autocast, per_pass: int) -> tuple[dict, list[dict]]:
    b = es.batch
    slices = b.slices() if hasattr(b, "slices") else [(b.slice_name, b.slice_value)]
    correct, loss_sum, seen = [], 0.0, {name: [] for name, _ in slices}
    for s in range(0, b.inputs.shape[0], per_pass):
        part = slice(s, s + per_pass)
        logits, tgt, positions = _eval_pass(model, b.inputs[part], b.targets[part], autocast)
        mask = tgt != IGNORE  # (B, K)
        loss_sum += F.cross_entropy(logits[mask].float(), tgt[mask], reduction="sum").item()
        correct.append((logits.argmax(-1) == tgt)[mask])
        for name, value in slices:
            seen[name].append(value[part].gather(1, positions)[mask])
    hits = torch.cat(correct).float()
    n = hits.numel()
    setting = {"name": es.name, "accuracy": hits.mean().item(), "loss": loss_sum / n, "count": n,
               "seq_len": es.seq_len}
    rows = []
    for name, parts in seen.items():
        values = torch.cat(parts)
        for v in torch.unique(values).tolist():
            sel = values == v
            rows.append({"slice": name, "value": int(v), "seq_len": es.seq_len,
                         "accuracy": hits[sel].mean().item(), "count": int(sel.sum())})
    return setting, rows


def _eval_memory(model, es: EvalSet, autocast, per_pass: int) -> int:
    """Peak bytes of one evaluation pass at this setting's length (the streamed evaluation holds
    one pass at a time, so this is its peak), beyond the parameters and the held-out batch.
    CUDA: torch.cuda.max_memory_allocated. CPU: the live-memory tracker (harness.memory), with
    the fused CPU chunk kernels off for the pass, as the tracker cannot see inside them (the
    batched forms they stand for hold at least as much)."""
    from harness.memory import peak_memory
    from harness.ops import fused_cpu_enabled, set_fused_cpu

    device = es.batch.inputs.device
    inputs, targets = es.batch.inputs[:per_pass], es.batch.targets[:per_pass]
    existing = [*model.parameters(), *model.buffers(), es.batch.inputs, es.batch.targets]
    fused = fused_cpu_enabled()
    set_fused_cpu(fused and device.type != "cpu")
    try:
        return peak_memory(lambda: _eval_pass(model, inputs, targets, autocast), device, existing)
    finally:
        set_fused_cpu(fused)


@torch.no_grad()
def evaluate(model, eval_sets: list[EvalSet], autocast, *, tokens: int = 1 << 14,
             memory: bool = False) -> dict[str, Any]:
    """Accuracy and loss per setting and per slice value (N, distance, ...; each row with its
    length), streamed: passes of about `tokens` tokens (at least one example each), the head
    at the labelled positions only, the linear families in the chunk form whatever the
    training form (the forms agree; memory stays linear in T). memory=True adds each setting's
    peak memory of one pass (peak_mem_bytes) and the examples per pass."""
    model.eval()
    form = getattr(model.cfg, "form", None)
    if form is not None and form != EVAL_FORM:
        model.set_form(EVAL_FORM)
    per_set, slices = [], []
    try:
        for es in eval_sets:
            per_pass = examples_per_pass(es.seq_len, tokens)
            started = time.perf_counter()
            setting, rows = _evaluate_set(model, es, autocast, per_pass)
            setting["time_s"] = time.perf_counter() - started
            if memory:
                setting.update(peak_mem_bytes=_eval_memory(model, es, autocast, per_pass),
                               examples_per_pass=min(per_pass, es.batch.inputs.shape[0]), form=EVAL_FORM)
            per_set.append(setting)
            slices.extend(rows)
    finally:
        if form is not None and form != EVAL_FORM:
            model.set_form(form)
        model.train()
    accuracy = sum(p["accuracy"] for p in per_set) / len(per_set)
    loss = sum(p["loss"] for p in per_set) / len(per_set)
    return {"accuracy": accuracy, "loss": loss, "min_accuracy": min(p["accuracy"] for p in per_set),
            "settings": per_set, "slices": slices}


def with_val_accuracy(test_slices: list[dict], val_slices: list[dict]) -> list[dict]:
    """Test slice rows with the validation accuracy of the same (slice, value, seq_len) beside
    them (`val_accuracy`, NaN where the validation batch has no such slice value)."""
    val = {(r["slice"], r["value"], r["seq_len"]): r["accuracy"] for r in val_slices}
    return [{**r, "val_accuracy": val.get((r["slice"], r["value"], r["seq_len"]), math.nan)}
            for r in test_slices]


def autocast_factory(device: torch.device, precision: str):
    enabled = precision == "bf16"

    def ctx():
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=enabled)

    return ctx


def _measure(model, eval_sets: list[EvalSet], examples: int) -> dict[str, Any]:
    """Sharpness and SNR on the first `examples` examples of every evaluation set (the summary
    from the first); `measure_examples` in the summary is the count actually used. Then the
    crosstalk law from the model's own statistics (harness.measure.trained_theory) on the same
    examples, added to each heads row and, for the summary's retrieval head, to the summary."""
    from harness.measure.trained import measure_model
    from harness.measure.trained_theory import measure_trained_theory, merge_rows

    heads, summary, status = [], {}, {}
    for i, es in enumerate(eval_sets):
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
    """State size per head and in bytes (float32), beside what a KV cache holds at this length.
    A mixer that declares no state_size leaves the state keys out."""
    from harness.ops import kv_cache_elements

    cfg = model.cfg
    d_head = cfg.d_model // cfg.n_heads
    heads, bytes_per = cfg.n_heads * cfg.n_layers, 4
    kv = kv_cache_elements(task_seq_len, qk_width(cfg), d_head)  # what softmax would cache per head
    out: dict[str, Any] = {"d_key": model.d_key, "d_head": d_head, "kv_cache_bytes": kv * heads * bytes_per}
    state = model.state_size(task_seq_len)
    if state is not None:
        out.update(state_elements_per_head=state // heads, state_elements_per_layer=state // cfg.n_layers,
                   state_bytes=state * bytes_per)
    return out


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


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


LOSS_GAIN = 1e-3  # a validation loss this much below the best (relative) is an improvement


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
        LOSS_GAIN (relative): every mixer sits near zero accuracy for a few hundred steps before
        it escapes, and only the loss moves there."""
        improved = (self.best_accuracy is None or accuracy > self.best_accuracy + min_delta
                    or loss < self.best_loss * (1 - LOSS_GAIN))
        if self.best_accuracy is None or accuracy > self.best_accuracy:
            self.best_accuracy, self.best_step = accuracy, step
        self.best_loss = loss if self.best_loss is None else min(self.best_loss, loss)
        self.since_best = 0 if improved else self.since_best + 1

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _checkpoint_payload(cfg, model, opt, sched, loop: LoopState, logger) -> dict[str, Any]:
    from harness.outputs import checkpoint
    from harness.outputs.results import config_hash

    return {"format": checkpoint.FORMAT, "step": loop.step, "config_hash": config_hash(cfg),
            "config": flat_config(cfg), "model": model.state_dict(), "optimizer": opt.state_dict(),
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


def train(cfg: DictConfig, out_dir: Path, on_step: Callable[[int], None] | None = None,
          resume: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train cfg's model on its task; write metrics and results into out_dir.

    A checkpoint (`checkpoint.pt`) is written every `trainer.ckpt_every` steps; if out_dir
    already holds one of this configuration, training continues from it and ends exactly as
    an uninterrupted run would. ``on_step(step)`` is called after each optimizer step (and the
    loop's logging), before any evaluation: the loop benchmark times steps with it.
    ``resume``: that checkpoint, when the caller has loaded it already (harness.run.job does).
    """
    from harness.outputs import checkpoint
    from harness.train.faults import FaultWatch, NumericalFault
    from harness.train.memory import check_training

    started, t0, cpu_started = time.time(), time.perf_counter(), time.process_time()
    tr = cfg.trainer
    eval_tokens = check_training(cfg)  # before any allocation: refused, or evaluation in pieces that fit
    if eval_tokens < tr.eval_tokens:
        print(f"[harness] evaluation in pieces of {eval_tokens:,} tokens (trainer.eval_tokens="
              f"{tr.eval_tokens:,} at once would not fit)")
    device = select_device(tr.device)
    torch.manual_seed(cfg.seed)
    if device.type == "cpu":
        torch.use_deterministic_algorithms(True, warn_only=True)
    module, tcfg = task_config(cfg.task)
    mcfg = model_config(cfg.model)
    saved = resume if resume is not None else checkpoint.find_resume(cfg, out_dir)
    eval_sets = make_eval_sets(module, tcfg, tr, cfg.seed, device)  # test: reported at the end
    max_len = max(es.seq_len for es in eval_sets)
    # validation at the training length, every eval_every steps: what early stopping watches
    # and what a sweep chooses learning rates on (val_accuracy in the summary). The longer
    # settings' validation batches are never read: not kept, so they are freed at once.
    periodic = periodic_sets(make_eval_sets(module, tcfg, tr, cfg.seed, device, split="val"),
                             train_length(module, tcfg))
    model = build_model(cfg).to(device)
    watch = FaultWatch(model, mcfg.name)  # hooks first, so a compiled model keeps them
    step_model = torch.compile(model) if tr.compile else model
    opt = build_optimizer(model, tr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_schedule(tr))
    autocast = autocast_factory(device, tr.precision)
    loop = LoopState(running=torch.zeros((), device=device))
    if saved is not None:
        loop = _restore(saved, model, opt, sched)
        started -= loop.elapsed_s
        print(f"[harness] resuming from {saved['path']} at step {loop.step}")
    ckpt_path = Path(saved["path"]) if saved is not None else None
    ckpt_step = loop.step if saved is not None else None

    from harness.outputs.wandb_logger import make_logger

    flat = flat_config(cfg)
    logger = make_logger(cfg.logger, flat, out_dir, name=f"{cfg.task.name}-{mcfg.name}",
                         run_id=saved.get("logger_id") if saved else None)
    metrics = MetricsLog(out_dir / METRICS_FILE, resume_step=ckpt_step)
    results = base_results(cfg, "train")
    failed = True
    terminate = checkpoint.TerminationRequest()  # a pre-empted job saves its step, then stops
    try:
        batches = train_batches(module, tcfg, tr, cfg.seed, device, start=loop.step)
        bar = tqdm(total=tr.max_steps, initial=loop.step, desc=f"{cfg.task.name}/{mcfg.name}",
                   disable=not tr.progress, dynamic_ncols=True, leave=True)
        reason = "max_steps"
        on_step = clock = StepClock(on_step)  # times the steps alone (the paper smoke's cost estimate)
        setup_s = clock.last - t0
        # the settings each step reads, as plain values: an OmegaConf read costs microseconds
        max_steps, log_every, eval_every, ckpt_every = tr.max_steps, tr.log_every, tr.eval_every, tr.ckpt_every
        grad_clip, target_accuracy = float(tr.grad_clip), tr.target_accuracy
        patience, min_delta, min_steps = tr.patience, float(tr.min_delta), int(tr.min_steps)
        while loop.step < max_steps:
            inputs, positions, targets = next(batches)
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
                watch.check()  # reads the loss back anyway: the fault check rides on that sync
                loop.last_loss = (loop.running / (step % log_every or log_every)).item()
                loop.running.zero_()
                bar.set_postfix(loss=f"{loop.last_loss:.3f}", acc=f"{loop.last_eval.get('accuracy', 0):.3f}")
                logger.log({"train/loss": loop.last_loss, "train/lr": sched.get_last_lr()[0]}, step=step)
            bar.update(1)
            if on_step is not None:
                on_step(step)
            if step % eval_every == 0 or step == max_steps:
                watch.check()
                loop.last_eval = evaluate(model, periodic, autocast, tokens=eval_tokens)
                loop.eval_step = step
                row = {"step": step, "time_s": time.time() - started, "split": "val",
                       "accuracy": loop.last_eval["accuracy"], "loss": loop.last_eval["loss"],
                       **{f"accuracy/{p['name']}": p["accuracy"] for p in loop.last_eval["settings"]}}
                metrics.write(row)
                logger.log({f"eval/{k}": v for k, v in row.items() if k != "step"}, step=step)
                bar.set_postfix(loss=f"{loop.last_loss:.3f}", acc=f"{loop.last_eval['accuracy']:.3f}")
                loop.record_eval(step, loop.last_eval["accuracy"], loop.last_eval["loss"], min_delta)
                why = stop_reason(loop, loop.last_eval, step, target_accuracy, patience, min_steps)
                if why is not None:
                    reason = why if step < max_steps else reason
                    break
            due = ckpt_every and step % ckpt_every == 0
            if (due or terminate.requested) and step < max_steps:
                watch.check()  # only a clean state is saved: the last checkpoint is always good
                loop.elapsed_s = time.time() - started
                kept = checkpoint.save_checkpoint(out_dir, step, _checkpoint_payload(
                    cfg, model, opt, sched, loop, logger))
                if kept is not None:  # None: a directory holds its name (warned); the last one stands
                    ckpt_path, ckpt_step = kept, step
                if terminate.requested:
                    raise RunError(f"stopped by SIGTERM after step {step}; the checkpoint "
                                   f"{ckpt_path} holds it: rerun the same command to resume")
        bar.close()
        watch.check()
        step, val_eval = loop.step, loop.last_eval
        if loop.eval_step != step:
            val_eval = evaluate(model, periodic, autocast, tokens=eval_tokens)
            loop.record_eval(step, val_eval["accuracy"], val_eval["loss"], float(tr.min_delta))
        # the test split, every setting, the longer ones too, and each one's peak memory: what
        # the run reports
        last_eval = evaluate(model, eval_sets, autocast, tokens=eval_tokens, memory=True)
        summary: dict[str, Any] = {
            "accuracy": last_eval["accuracy"], "loss": last_eval["loss"],
            "val_accuracy": val_eval["accuracy"], "val_loss": val_eval["loss"], "steps": step,
            "stopped_early": reason != "max_steps", "stop_reason": reason, "steps_run": step,
            "best_val_accuracy": loop.best_accuracy, "best_val_step": loop.best_step, "params": sum(p.numel() for p in model.parameters()),
            "step_time_s": clock.seconds_per_step(),
            **state_summary(model, max_len),
        }
        for p in last_eval["settings"]:
            summary[f"accuracy/{p['name']}"] = p["accuracy"]
        for p in val_eval["settings"]:
            summary[f"val_accuracy/{p['name']}"] = p["accuracy"]
        results["slices"] = with_val_accuracy(last_eval["slices"], val_eval["slices"])
        results["settings"] = last_eval["settings"]
        summary["eval_peak_mem_bytes"] = max(p["peak_mem_bytes"] for p in last_eval["settings"])
        if tr.measure:
            measure_t0 = time.perf_counter()
            measured = _measure(model, eval_sets, tr.measure_examples)
            # the out-of-sample law: statistics at the training setting (validation data), then
            # every test setting predicted from its layout alone (harness.measure.out_of_sample)
            from harness.measure.trained_theory import add_out_of_sample
            summary.update(add_out_of_sample(results, model, module, tcfg, eval_sets, examples=tr.eval_examples,
                                             max_examples=tr.measure_examples, seed=cfg.seed))
            summary["measure_time_s"] = time.perf_counter() - measure_t0
            summary.update({k: v for k, v in measured["summary"].items() if k not in summary})
            results["heads"] = measured["heads"]
            results["measure"] = measured["measure"]
        summary["setup_time_s"] = setup_s  # this process's, before its first step
        summary["wall_time_s"] = time.time() - started
        # CPU seconds of this process (this start only): with trainer.threads=1 about the wall
        # time the run takes on an idle core, whatever else the machine is doing.
        summary["cpu_time_s"] = time.process_time() - cpu_started
        results["summary"] = summary
        results["env"] = env_info(str(device))
        if tr.checkpoint:  # its checksum goes into results.json (checkpoint.load_model verifies it)
            results["files"] = {checkpoint.MODEL_FILE: checkpoint.save_model(
                out_dir, {"model": model.state_dict(), "config": OmegaConf.to_container(cfg, resolve=True)})}
        write_json(out_dir / RESULTS_FILE, results)
        checkpoint.remove_checkpoints(out_dir)  # finished: model.pt and results.json replace them
        logger.summary({k: v for k, v in summary.items() if isinstance(v, (int, float, bool))})
        failed = False
    except NumericalFault as fault:
        fault.record["checkpoint"] = ({"path": str(ckpt_path), "step": ckpt_step}
                                      if ckpt_step is not None else None)
        raise
    except Exception as exc:  # an allocation that failed although the estimate fitted
        if not is_out_of_memory(exc):
            raise
        raise OutOfMemory(f"out of memory at step {loop.step} of training ({first_line(exc)}); "
                          f"lower trainer.batch_size or trainer.eval_examples, or use a larger device",
                          oom={"step": loop.step, "error": first_line(exc, 500)},
                          checkpoint={"path": str(ckpt_path), "step": ckpt_step} if ckpt_step is not None
                          else None) from None
    finally:
        terminate.restore()
        metrics.close()
        logger.finish(failed=failed)
    _report(cfg, summary, last_eval, out_dir)
    return results


def _report(cfg, summary: dict[str, Any], last_eval: dict[str, Any], out_dir: Path) -> None:
    per = ", ".join(f"{p['name']}: {p['accuracy']:.3f}" for p in last_eval["settings"])
    print(f"[harness] {cfg.task.name}/{cfg.model.name}: accuracy {summary['accuracy']:.3f} "
          f"({per}) after {summary['steps']} steps, {summary['wall_time_s']:.0f} s")
    if "state_bytes" in summary:
        print(f"[harness] state {summary['state_elements_per_head']:,} elements/head "
              f"({_fmt_bytes(summary['state_bytes'])} in all; a KV cache at this length: "
              f"{_fmt_bytes(summary['kv_cache_bytes'])})")
    if summary.get("target_weight") is not None and "snr_measured" in summary:
        print(f"[harness] retrieval head: weight on the correct key {summary['target_weight']:.3f}, "
              f"SNR measured {summary.get('snr_measured', float('nan')):.2f} "
              f"vs predicted {summary.get('snr_predicted', float('nan')):.2f}")
    print(f"[harness] results: {out_dir / RESULTS_FILE}")
