"""Resource checks before work: a run the device cannot hold is refused in one line, naming the
estimate and the limit, before anything large is allocated (harness.devices.check_fits).

  train  the training step (batch x length x width, the optimizer state, the data chunk) and the
         evaluation at each test length (harness.train.memory; evaluation streams in smaller
         pieces when a whole chunk would not fit)
  probe  every (d, N) row of the grid (harness.measure.probe.probe_row_bytes)
  cost   nothing up front: each measured call that would not fit is skipped and recorded so
         (harness.bench.run.measure_forms)
"""
from __future__ import annotations

from harness.config.plan import RunPlan


def check_resources(plan: RunPlan) -> RunPlan:
    """ResourceError (a ValueError: exit code 2) if the plan's run cannot fit on its device; else
    the plan, a training run's with the tokens per evaluation pass that fit (trainer.eval_tokens,
    or fewer)."""
    cfg = plan.cfg
    if plan.mode == "train":
        from harness.train.memory import fitted

        return fitted(plan)
    if plan.mode == "probe":
        from harness.measure.probe import check_probe

        pr = cfg.probe
        check_probe([plan.mcfg.name], list(pr.d), list(pr.n) if pr.n is not None else None,
                    device=str(plan.device), candidates=pr.candidates, max_queries=pr.max_queries)
    return plan
