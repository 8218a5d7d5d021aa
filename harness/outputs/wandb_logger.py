"""wandb logging, offline unless the user configures otherwise.

The mode is also put in the environment before wandb is imported: the `mode` argument alone
still lets a telemetry probe reach the network at exit. An explicit WANDB_MODE in the user's
environment (tests set `disabled`) always wins.

wandb is an outside service: if it is unreachable or misconfigured, the run prints one warning
line and carries on without it; results.json and metrics.jsonl are written either way.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

# wandb's own defaults are 90 s for init and no limit at all for finish (against a server that
# went away, finish retries uploads for many minutes). Set through the environment so that a
# user's WANDB_INIT_TIMEOUT / WANDB_FINISH_TIMEOUT still win. A finish that times out leaves
# its data in the run's directory under <out_dir>/wandb for `wandb sync`.
INIT_TIMEOUT_S = 30
FINISH_TIMEOUT_S = 60


class NullLogger:
    run_id = None

    def log(self, metrics: dict[str, Any], step: int) -> None:
        pass

    def summary(self, metrics: dict[str, Any]) -> None:
        pass

    def finish(self, failed: bool = False) -> None:
        pass


class WandbLogger:
    """Forwards to a wandb run; the first exception from wandb turns it into a NullLogger."""

    def __init__(self, cfg, flat_config: dict[str, Any], out_dir: Path, name: str,
                 run_id: str | None = None):
        self.run = None
        self.run_id = run_id  # a resumed training run continues its wandb run
        self._out_dir = out_dir
        os.environ.setdefault("WANDB_MODE", cfg.mode)
        os.environ.setdefault("WANDB_SILENT", "true")
        os.environ.setdefault("WANDB_INIT_TIMEOUT", str(INIT_TIMEOUT_S))
        os.environ.setdefault("WANDB_FINISH_TIMEOUT", str(FINISH_TIMEOUT_S))
        try:
            import wandb

            self.run = wandb.init(
                project=cfg.project,
                entity=cfg.entity,
                group=cfg.group,
                tags=list(cfg.tags),
                name=name,
                dir=str(out_dir),
                config=flat_config,
                reinit="finish_previous",
                id=run_id,
                resume="allow" if run_id else None,
                # Otherwise a finish timeout is only a line in wandb's (silenced) output.
                settings=wandb.Settings(finish_timeout_raises=True),
            )
            self.run_id = getattr(self.run, "id", None) or run_id
        except Exception as exc:
            self._give_up("init", exc)

    def _give_up(self, stage: str, exc: Exception, hint: str = "") -> None:
        self.run = None
        lines = str(exc).strip().splitlines()
        cause = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
        print(f"[harness] warning: wandb {stage} failed ({cause[:300]}); wandb is off for this "
              f"run, results are still written locally to {self._out_dir}{hint}",
              file=sys.stderr, flush=True)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if self.run is None:
            return
        try:
            self.run.log(metrics, step=step)
        except Exception as exc:
            self._give_up("log", exc)

    def summary(self, metrics: dict[str, Any]) -> None:
        if self.run is None:
            return
        try:
            for key, value in metrics.items():
                self.run.summary[key] = value
        except Exception as exc:
            self._give_up("summary", exc)

    def finish(self, failed: bool = False) -> None:
        if self.run is None:
            return
        sync_dir = self.run.settings.sync_dir
        try:
            self.run.finish(exit_code=1 if failed else 0)
        except Exception as exc:
            # What did not reach the server is still in the run's directory.
            hint = f"; `wandb sync --include-online {sync_dir}` uploads the rest"
            self._give_up("finish", exc, hint)
        self.run = None


def make_logger(cfg, flat_config: dict[str, Any], out_dir: Path, name: str,
                run_id: str | None = None):
    """``run_id``: the wandb run of a checkpoint being resumed (None: a new run)."""
    # WANDB_MODE=disabled in the environment wins over the config (see above): then wandb is not
    # even imported, an import and an init the run would pay inside its timed set-up for nothing
    if cfg.name == "none" or cfg.mode == "disabled" or os.environ.get("WANDB_MODE") == "disabled":
        return NullLogger()
    return WandbLogger(cfg, flat_config, out_dir, name, run_id=run_id)
