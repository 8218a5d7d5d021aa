"""After a run's last step: the final evaluations, the summary, the end-of-run measurements
(sharpness and SNR, the out-of-sample law, interchange interventions, head ablations), model.pt and
results.json, and the lines a run prints at its end. A solo run (harness.train.loop) and a group's
member (harness.train.group.runs) both end here.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import OmegaConf

from harness.devices import format_bytes
from harness.layers.parts import qk_width
from harness.outputs.results import RESULTS_FILE, env_info, write_json
from harness.train.evaluate import EvalSet, evaluate, periodic_sets, with_val_accuracy

if TYPE_CHECKING:
    from harness.train.state import Run


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


def finish(r: Run, reason: str) -> dict[str, Any]:
    """After the last step: the final validation (unless this step had it), the test split's
    evaluation (every setting, the longer ones too, with each one's peak memory), the summary,
    the measurements, then model.pt and results.json. Returns the test evaluation."""
    if r.bar is not None:  # a group's member has none (harness.train.group.runs)
        r.bar.close()
    r.watch.check()
    loop, tr, model = r.loop, r.plan.trainer, r.model
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
    """The end-of-run measurements (harness.train.finish._measure) and the out-of-sample law: the
    statistics at the training setting (validation data), then every test setting predicted from
    its layout alone (harness.measure.out_of_sample), into the summary and results."""
    from harness.measure.trained_theory import add_out_of_sample

    plan, tr = r.plan, r.plan.trainer
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
    found = intervene(r.model, test.batch, seed=r.plan.cfg.seed, max_examples=r.plan.trainer.measure_examples)
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
    if r.plan.trainer.checkpoint:
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
