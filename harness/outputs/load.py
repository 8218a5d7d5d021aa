"""Reopen a finished run for analysis: its model with the trained weights, its config, its results.

    run = harness.load_run("outputs/recall-elu/2026-12-01_14-21-34")
    batch = run.batch(4)                                  # held-out examples of its task
    with harness.hooks.capture(run.model) as cache:       # every hook point, as in measurement
        logits = run.model(batch.inputs)

A run directory is data that may come from anywhere (a colleague, a cluster, a download), so
nothing in it is taken on trust:

- the weights load with torch.load(..., weights_only=True) (tensors and plain containers, never
  pickled code) and are verified against the checksum results.json records
  (harness.outputs.checkpoint.load_model; none recorded is a warning, a malformed record a refusal);
- the model is rebuilt from the config saved beside the weights, which must be the config
  results.json describes (the files of two runs mixed are refused, naming the keys that differ),
  and the weights must fit the model that config builds, key for key and shape for shape;
- a config that names code outside the harness (a dotted model.name, a hybrid's slot or
  model.attn, a task module), which building it would import and run, is refused before anything
  is imported unless ``trust_code=True`` (harness.outputs.trust, as Hugging Face's
  ``trust_remote_code``); the built-in mixers and tasks load freely;
- results.json's recorded config must hash to its config_hash (harness.outputs.results), so an
  edited file cannot describe another model than the one it was written for.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from harness.config.digest import config_differences, flat_config, flat_hash, hashed_items
from harness.config.plan import reopen
from harness.errors import DamagedFile
from harness.model import LanguageModel
from harness.outputs.checkpoint import MODEL_FILE, load_model
from harness.outputs.results import CONFIG_FILE, RESULTS_FILE, parse_results
from harness.outputs.trust import PYTHON, check_trusted


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


def load_run(run_dir: str | Path, *, device: str | torch.device = "cpu", trust_code: bool = False,
             flag: str = PYTHON) -> Run:
    """The run in `run_dir` (a directory with model.pt and results.json); ValueError with one
    line if it is not a finished run with saved weights, if they are damaged or do not belong
    to its config, or if its config names outside code and `trust_code` is not set (the refusal,
    harness.outputs.trust.UntrustedCode, names `flag`: what to set at the caller's entry point)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"load_run: {run_dir} is not a directory")
    results = parse_results(run_dir)  # DamagedFile naming the file if it is not a run's results
    if results is None and not any((run_dir / name).exists() for name in (MODEL_FILE, CONFIG_FILE)):
        raise ValueError(f"load_run: {run_dir} is not a run: it holds no {RESULTS_FILE}, {MODEL_FILE} or "
                         f"{CONFIG_FILE} (a sweep keeps each run in a numbered directory inside it)")
    saved = load_model(run_dir, results=results)
    weights = run_dir / MODEL_FILE
    # before anything is built: every key of either file that names code (nothing imported yet)
    recorded = (results or {}).get("config")
    for config in (saved["config"], recorded if isinstance(recorded, dict) else {}):
        check_trusted(config, trust_code, where=run_dir, flag=flag)
    try:
        cfg = OmegaConf.create(saved["config"])
        name = cfg.model.name
    except Exception as exc:  # a config that is not one (edited, or from another program)
        raise DamagedFile(f"{weights} is damaged: its config is not a run's config ({type(exc).__name__})") from None
    if results is not None:
        _check_same_run(weights, saved["config"], results)
    plan = reopen(cfg, torch.device(device))
    model = plan.build_model()
    _load_weights(model, saved["model"], weights, name)
    model.to(device).eval()
    return Run(dir=run_dir, model=model, config=cfg, results=results or {},
               task_module=plan.module, task_config=plan.tcfg)


def _check_same_run(weights: Path, saved_config: dict[str, Any], results: dict[str, Any]) -> None:
    """model.pt's config must be the one results.json records: otherwise the two files come from
    two runs, and the results would be read against the wrong model."""
    recorded = results.get("config")
    digest = results.get("config_hash")
    if digest is None and not isinstance(recorded, dict):
        return  # nothing recorded to compare with
    saved_flat = flat_config(saved_config)
    if digest is not None and flat_hash(saved_flat) == digest:
        return
    if digest is None and hashed_items(saved_flat) == hashed_items(recorded):
        return
    diff = config_differences(hashed_items(saved_flat),
                              hashed_items(recorded) if isinstance(recorded, dict) else {})
    raise DamagedFile(f"{weights} was saved under another config than {weights.parent / RESULTS_FILE} "
                      f"records (model.pt -> results.json: {diff or 'config_hash differs'}): "
                      "the files of two runs are mixed")


def _load_weights(model: torch.nn.Module, state: dict[str, Any], weights: Path, name: str) -> None:
    """Load a state dict that must fit the model key for key and shape for shape; DamagedFile
    naming what differs (torch's own message is many lines) otherwise."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    found = {k: tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__ for k, v in state.items()}
    problems = []
    for label, keys in (("missing", [k for k in expected if k not in found]),
                        ("unexpected", [k for k in found if k not in expected])):
        if keys:
            problems.append(f"{label} {', '.join(map(str, keys[:3]))}" + (f" and {len(keys) - 3} more"
                                                                        if len(keys) > 3 else ""))
    shapes = [k for k in expected if k in found and found[k] != expected[k]]
    if shapes:
        problems.append("; ".join(f"{k}: {found[k]} saved, {expected[k]} built" for k in shapes[:3])
                        + (f" and {len(shapes) - 3} more" if len(shapes) > 3 else ""))
    if problems:
        raise DamagedFile(f"{weights} does not fit the model its config builds (model.name={name}): "
                          + "; ".join(problems))
    model.load_state_dict(state)
