"""Resource checks before work: a run the device cannot hold is refused in one line, naming the
estimate and the limit, before anything large is allocated (harness.devices.check_fits).

  train  the training step (batch x length x width, the optimizer state, the data chunk) and the
         evaluation at each test length (harness.train.memory; evaluation streams in smaller
         pieces when a whole chunk would not fit)
  probe  every (d, N) row of the grid (harness.measure.probe.probe_row_bytes)
  cost   nothing up front: each measured call that would not fit is skipped and recorded so
         (harness.bench.run.measure_forms)

A run's plan makes the check once (harness.train.plan.prepare); this is the same check for a
caller that holds a plan, or a config it has not prepared.
"""
from __future__ import annotations

from omegaconf import DictConfig

from harness.train.plan import RunPlan, as_plan
from harness.train.plan import check_resources as check_plan


def check_resources(run: RunPlan | DictConfig) -> None:
    """ResourceError (a ValueError: exit code 2) if the run cannot fit on its device."""
    if isinstance(run, RunPlan):
        check_plan(run)
    else:
        as_plan(run)  # preparing a config checks its resources
