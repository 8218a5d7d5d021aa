"""`mode=probe`: the untrained probe of one mixer over `probe.d` x `probe.n` into results.json."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from harness.outputs.results import RESULTS_FILE, base_results, env_info, write_json
from harness.config.plan import RunPlan


def fits(plan: RunPlan) -> RunPlan:
    """The plan, once every (d, N) row of its grid fits on the device
    (harness.measure.probe.check_probe: ResourceError, one line, otherwise)."""
    from harness.measure.probe import check_probe

    pr = plan.cfg.probe
    check_probe([plan.mcfg.name], list(pr.d), list(pr.n) if pr.n is not None else None,
                device=str(plan.device), candidates=pr.candidates, max_queries=pr.max_queries)
    return plan


def probe_options(model: DictConfig) -> dict[str, Any]:
    """What a mixer's probe_memory may take by name: the model.* settings and the mixer's
    options (a built-in's, such as model.options.dpfp_nu or retnet_heads; an outside mixer's
    constructor arguments), which win."""
    fields = {k: v for k, v in model.items() if k not in ("name", "options")}
    return {**fields, **dict(model.options or {})}


def probe_run(plan: RunPlan, out_dir: Path) -> dict[str, Any]:
    """The plan's probe (its rows checked to fit when the plan was made) into out_dir."""
    from harness.measure.probe import run_probe

    started = time.time()
    cfg, device = plan.cfg, plan.device
    results = base_results(cfg, plan.flat, plan.digest)
    options = probe_options(cfg.model)
    rows = run_probe([plan.mcfg.name], list(cfg.probe.d), list(cfg.probe.n) if cfg.probe.n is not None else None,
                     seed=cfg.probe.seed, candidates=cfg.probe.candidates, max_queries=cfg.probe.max_queries,
                     device=str(device), progress=cfg.trainer.progress, options=options)
    results["probe"] = rows
    results["summary"] = {"rows": len(rows), "wall_time_s": time.time() - started}
    results["env"] = env_info(str(device))
    write_json(out_dir / RESULTS_FILE, results)
    print(f"[harness] probe {cfg.model.name}: {'d':>5} {'N':>7} {'SNR meas':>9} {'SNR pred':>9} "
          f"{'acc meas':>9} {'acc pred':>9}")
    for r in rows:
        print(f"[harness] probe {cfg.model.name}: {r['d']:>5} {r['n']:>7} {r['snr_measured']:>9.3f} "
              f"{r['snr_predicted']:>9.3f} {r['acc_measured']:>9.3f} {r['acc_predicted']:>9.3f}")
    print(f"[harness] results: {out_dir / RESULTS_FILE}")
    return results
