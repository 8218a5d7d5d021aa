"""`mode=ablate ablate.run=<run dir>`: recall of a trained run with each layer and each head
removed (zero, mean and resample ablation), each head patched from clean into corrupted
examples (the query, or the queried pair's key or value, changed), each head's clean output
patched along its path into each later head, and the weights each head puts where gathering and
aggregating look: one row per (layer, head, kind), printed and written to results.json."""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from harness.outputs.results import RESULTS_FILE, base_results, env_info, write_json
from harness.config.plan import RunPlan


def _row_line(r: dict[str, Any]) -> str:
    head = "all" if r["head"] is None else r["head"]
    where = f"{r['layer']:>5} {head:>4} {r['kind']:>8}"
    if r["kind"] == "patch":
        return f"{where}   restores {r['restored']:.3f} of the clean logit difference ({r['corrupt']} corrupted)"
    if r["kind"] == "path":
        return (f"{where}   from layer {r['sender_layer']} head {r['sender_head']}: restores {r['restored']:.3f} "
                f"through this head alone ({r['corrupt']} corrupted)")
    if r["kind"] == "weights":
        return (f"{where}   weight at the value on its key {r['value_on_key']:.3f}, "
                f"at the query on the answer {r['query_on_answer']:.3f}")
    return f"{where}   recall {r['accuracy']:.3f} (own {r['base_accuracy']:.3f}, chance {r['chance']:.3f})"


def ablate_mode(plan: RunPlan, out_dir: Path) -> dict[str, Any]:
    """harness.measure.ablate.ablate_run on the run `ablate.run` names (checked, and its identity
    in this run's, when the plan was made: harness.outputs.source), into out_dir."""
    from harness.measure.ablate import ablate_run, settings
    from harness.outputs.source import open_source

    cfg, ab = plan.cfg, plan.cfg.ablate
    started = time.time()
    run = open_source(plan)
    found = ablate_run(run.model, run.config, **settings(ab))
    own = run.results.get("summary", {})
    results = base_results(cfg, plan.flat, plan.digest)
    results.update(model=run.results.get("model"), task=run.results.get("task"), ablate=found["rows"])
    results["measure"] = {"ablate": found["skipped"] or "ok"}
    results["summary"] = {"run": str(ab.run), "accuracy": found["accuracy"], "run_accuracy": own.get("accuracy"),
                          "retrieval_layer": own.get("retrieval_layer"), "retrieval_head": own.get("retrieval_head"),
                          "seq_len": found["seq_len"], "examples": found["examples"], "rows": len(found["rows"]),
                          "wall_time_s": time.time() - started}
    results["env"] = env_info(str(plan.device))
    write_json(out_dir / RESULTS_FILE, results)
    acc = own.get("accuracy")
    print(f"[harness] ablate {results['model']} ({ab.run}): recall {found['accuracy']:.3f} on "
          f"{found['examples']} examples at T = {found['seq_len']} (the run's own test recall "
          f"{acc if acc is None or math.isnan(acc) else format(acc, '.3f')})")
    print(f"[harness] ablate: {'layer':>5} {'head':>4} {'kind':>8}")
    for r in found["rows"]:
        print(f"[harness] ablate: {_row_line(r)}")
    for what, why in found["skipped"].items():
        print(f"[harness] ablate: {what}: {why}")
    print(f"[harness] results: {out_dir / RESULTS_FILE}")
    return results
