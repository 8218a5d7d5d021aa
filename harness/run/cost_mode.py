"""`mode=cost`: measured time and peak memory of the forms of one model's mixer family.

`python -m harness mode=cost model=<name>` times the core of the model's family (harness.ops,
through harness.bench) for every form in `cost.forms` and length in `cost.seq_lens`, forward
and forward + backward, and writes a "cost" table into results.json:

    {"family", "form", "seq_len", "pass": "fwd" | "fwdbwd", "time_s", "peak_mem_bytes", "model",
     "limit_ratio", "chunk_size", "d_key", "status", ...}

family: the harness.ops core the model's mixer declares (its `core`, harness.layers.protocol):
softmax; linear (linear, elu, favor, taylor; the key dimension is the feature map's m);
decay_scalar (retnet with its constant decays, mamba); decay_per_dim (mamba with
model.options.gate=per_dim). limit_ratio is the time over the essential 4 Dk Dv flops per token
and head (x3 with the backward pass) at the rate of a 1024^3 float32 GEMM measured in the same
run. Calls that cannot fit in memory, or recurrent forms beyond `cost.recurrent_max_len`, are
recorded with a "skipped: ..." status and no time.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from harness.outputs.results import RESULTS_FILE, base_results, env_info, write_json
from harness.config.plan import RunPlan

MAX_CALL_S = 2.0  # a call predicted (from the previous length) to take longer is skipped


def cost_run(plan: RunPlan, out_dir: Path) -> dict[str, Any]:
    """The plan's cost tables (its mixer's core found when the plan was made) into out_dir."""
    from harness.bench import cases
    from harness.bench.report import crossovers, format_tables, limit_ratios, memory_exponents
    from harness.bench.run import BenchConfig, measure_forms
    from harness.bench.timing import median
    from harness.layers import registry

    started = time.time()
    cfg, device = plan.cfg, plan.device
    cc = cfg.cost
    family, d_key = plan.core
    forms = [f for f in cc.forms if f in cases.FORMS[family]]
    bench = BenchConfig(device=str(device), bf16=cfg.trainer.precision == "bf16", batch=cc.batch_size,
                        heads=cc.n_heads, head_dim=cc.head_dim, seq_lens=list(cc.seq_lens), families=[family],
                        forms=forms, repeats=cc.repeats, recurrent_max_len=cc.recurrent_max_len,
                        chunk_sizes=[cfg.model.chunk_size], max_call_s=MAX_CALL_S)
    say = (lambda s: print(s, flush=True)) if cfg.trainer.progress else (lambda s: None)
    rows, rates = measure_forms(bench, device, torch.float32, d_key=d_key, log=say,
                                retnet=bool(getattr(registry.resolve(cfg.model.name), "fixed_decays", False)))
    for row in rows:
        row["model"] = cfg.model.name
        row.pop("samples", None)
    gemm = median(rates)
    top = max(cc.seq_lens)
    results = base_results(cfg, plan.flat, plan.digest)
    results["cost"] = rows
    results["summary"] = {
        "rows": len(rows), "wall_time_s": time.time() - started, "family": family, "d_key": d_key,
        "gemm_flops_per_s": gemm, "limit_seq_len": top,
        "limit_ratio": limit_ratios(rows, top).get(family, {}),
        "crossover": crossovers(rows).get(family, {}),
        "memory_exponent": memory_exponents(rows).get(family, {}),
    }
    results["env"] = env_info(str(device))
    write_json(out_dir / RESULTS_FILE, results)
    print(f"[harness] cost {cfg.model.name} ({family}, Dk={d_key}, batch {cc.batch_size}, {cc.n_heads} heads):")
    print(format_tables(rows, gemm))
    print(f"[harness] results: {out_dir / RESULTS_FILE}")
    return results
