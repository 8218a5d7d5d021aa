"""Hydra callback that ends every multirun with a summary of what ran, skipped and failed."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from harness.outputs.results import RESULTS_FILE, read_results


def summarise(sweep_dir: Path) -> dict[str, list]:
    ok, failed = [], []
    for path in sorted(Path(sweep_dir).rglob(RESULTS_FILE)):
        res = read_results(path.parent) or {"status": "failed", "error": "unreadable results.json"}
        (ok if res.get("status") == "ok" else failed).append((path.parent, res.get("error")))
    return {"ok": ok, "failed": failed}


class SweepSummary(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        summary = summarise(sweep_dir)
        print(f"[harness] sweep {sweep_dir}: {len(summary['ok'])} ok, "
              f"{len(summary['failed'])} failed")
        for run_dir, error in summary["failed"]:
            print(f"[harness]   failed {run_dir}: {error}")
        if summary["failed"]:
            raise SystemExit(1)
