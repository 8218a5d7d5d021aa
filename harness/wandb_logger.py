"""wandb logging, offline unless the user configures otherwise.

The mode is also put in the environment before wandb is imported: the `mode` argument alone
still lets a telemetry probe reach the network at exit. An explicit WANDB_MODE in the user's
environment (tests set `disabled`) always wins.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any


class NullLogger:
    def log(self, metrics: dict[str, Any], step: int) -> None:
        pass

    def summary(self, metrics: dict[str, Any]) -> None:
        pass

    def finish(self, failed: bool = False) -> None:
        pass


class WandbLogger:
    def __init__(self, cfg, flat_config: dict[str, Any], out_dir: Path, name: str):
        os.environ.setdefault("WANDB_MODE", cfg.mode)
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        self._wandb = wandb
        self.run = wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            group=cfg.group,
            tags=list(cfg.tags),
            name=name,
            dir=str(out_dir),
            config=flat_config,
            reinit="finish_previous",
        )

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self.run.log(metrics, step=step)

    def summary(self, metrics: dict[str, Any]) -> None:
        for key, value in metrics.items():
            self.run.summary[key] = value

    def finish(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


def make_logger(cfg, flat_config: dict[str, Any], out_dir: Path, name: str):
    if cfg.name == "none" or cfg.mode == "disabled":
        return NullLogger()
    return WandbLogger(cfg, flat_config, out_dir, name)
