"""Reopen a finished run for analysis: its model with the trained weights, its config, its results.

    run = harness.load_run("outputs/recall-elu/2026-12-01_14-21-34")
    batch = run.batch(4)                                  # held-out examples of the run's task
    with harness.hooks.capture(run.model) as cache:       # every hook point, as in measurement
        logits = run.model(batch.inputs)

The weights load with torch.load(..., weights_only=True) (tensors and plain containers only) and
are verified against the checksum results.json records (harness.outputs.checkpoint.load_model);
the model is rebuilt from the config saved beside them, so it is the model that was trained.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from harness.config.build import build_model, task_config
from harness.model import LanguageModel
from harness.outputs.checkpoint import load_model
from harness.outputs.results import read_results


@dataclass
class Run:
    """A finished run: `model` (eval mode, on `device`), `config` (resolved), `results`
    (results.json as a dict), and its task (`task_module`, `task_config`)."""
    dir: Path
    model: LanguageModel
    config: DictConfig
    results: dict[str, Any]
    task_module: ModuleType
    task_config: Any

    def batch(self, batch_size: int = 1, *, setting: int = 0, seed: int = 0, split: str = "test"):
        """Examples of the run's task: its `setting`-th evaluation setting (harness.tasks)."""
        chosen = self.task_module.eval_settings(self.task_config)[setting]
        device = next(self.model.parameters()).device
        return self.task_module.make_batch(chosen, batch_size, seed=seed, device=device, split=split)


def load_run(run_dir: str | Path, *, device: str | torch.device = "cpu") -> Run:
    """The run in `run_dir` (a directory with model.pt and results.json); ValueError with one
    line if it is not a finished run with saved weights, or they are damaged."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"load_run: {run_dir} is not a directory")
    saved = load_model(run_dir)
    cfg = OmegaConf.create(saved["config"])
    model = build_model(cfg)
    model.load_state_dict(saved["model"])
    model.to(device).eval()
    module, tcfg = task_config(cfg.task)
    return Run(dir=run_dir, model=model, config=cfg, results=read_results(run_dir) or {},
               task_module=module, task_config=tcfg)
