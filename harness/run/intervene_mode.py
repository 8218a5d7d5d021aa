"""`mode=intervene intervene.run=<run dir>`: interchange interventions on a trained run (the
queried pair's key or value corrupted, the clean hidden state restored at one layer, component
and position role at a time), a per-(layer, component, role) table printed, the rows and the
mechanism the rule names written to results.json (`intervene`, `mechanism`)."""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from harness.config.plan import RunPlan
from harness.outputs.results import RESULTS_FILE, base_results, env_info, write_json


def table_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Restored share per (corruption, layer, component) row and role column."""
    from harness.measure.intervene import ROLES

    lines = []
    for corrupt in dict.fromkeys(r["corrupt"] for r in rows):
        mine = [r for r in rows if r["corrupt"] == corrupt]
        lines.append(f"{corrupt} corrupted: share of the answer restored (clean p {mine[0]['clean_prob']:.3f}, "
                     f"corrupted p {mine[0]['corrupted_prob']:.3f})")
        lines.append(f"{'layer':>5} {'component':<9} " + " ".join(f"{role:>10}" for role in ROLES))
        cells = {(r["layer"], r["component"], r["role"]): r["restored_share"] for r in mine}
        for layer, component in dict.fromkeys((r["layer"], r["component"]) for r in mine):
            shares = (cells.get((layer, component, role), math.nan) for role in ROLES)
            lines.append(f"{layer:>5} {component:<9} " + " ".join(f"{v:>10.3f}" for v in shares))
    return lines


def intervene_mode(plan: RunPlan, out_dir: Path) -> dict[str, Any]:
    """harness.measure.intervene.intervene_run on the run `intervene.run` names (checked, and its
    identity in this run's, when the plan was made: harness.outputs.source), into out_dir."""
    from harness.measure.intervene import intervene_run
    from harness.measure.mechanism import evidence, mechanism_label
    from harness.outputs.source import open_source

    cfg, iv = plan.cfg, plan.cfg.intervene
    started = time.time()
    run = open_source(plan)
    found = intervene_run(run.model, run.config, examples=iv.examples, seed=iv.seed)
    label = mechanism_label(found["rows"])
    own = run.results.get("summary", {})
    results = base_results(cfg, plan.flat, plan.digest)
    results.update(model=run.results.get("model"), task=run.results.get("task"), intervene=found["rows"],
                   mechanism=label)
    results["measure"] = {"intervene": found["skipped"] or "ok"}
    results["summary"] = {"run": str(iv.run), "run_accuracy": own.get("accuracy"), "seq_len": found["seq_len"],
                          "examples": found["examples"], "rows": len(found["rows"]),
                          **{f"mechanism_{k}": v for k, v in evidence(found["rows"]).items()},
                          "wall_time_s": time.time() - started}
    results["env"] = env_info(str(plan.device))
    write_json(out_dir / RESULTS_FILE, results)
    print(f"[harness] intervene {results['model']} ({iv.run}): {found['examples']} examples at "
          f"T = {found['seq_len']}, one query each")
    for line in table_lines(found["rows"]):
        print(f"[harness] intervene: {line}")
    for what, why in found["skipped"].items():
        print(f"[harness] intervene: {what}: {why}")
    print(f"[harness] intervene: mechanism: {label}")
    print(f"[harness] results: {out_dir / RESULTS_FILE}")
    return results
