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

from omegaconf import DictConfig


def check_resources(cfg: DictConfig) -> None:
    """ResourceError (a ValueError: exit code 2) if cfg's run cannot fit on its device."""
    if cfg.mode == "train":
        from harness.train.memory import check_training

        check_training(cfg)
    elif cfg.mode == "probe":
        check_probe_run(cfg)


def check_probe_run(cfg: DictConfig) -> None:
    from harness.devices import select_device
    from harness.measure.probe import check_probe

    pr = cfg.probe
    check_probe([cfg.model.name], list(pr.d), list(pr.n) if pr.n is not None else None,
                device=str(select_device(cfg.trainer.device)), candidates=pr.candidates,
                max_queries=pr.max_queries)
