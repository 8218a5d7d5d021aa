"""A run's plan: its config validated once and everything derived from it, made before the
output directory exists.

`prepare(cfg)` validates every key (harness.config.validate, once), keeps what validation built
(the ModelConfig, the task module and its Config, the device), derives the lengths, and runs the
resource check of the run's mode, which also gives a training run its tokens per evaluation pass
(harness.train.memory). The RunPlan it returns is frozen: training, the probe and the cost mode
read it and derive nothing from the config again.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Optional

from omegaconf import DictConfig

if TYPE_CHECKING:
    import torch

    from harness.model import LanguageModel, ModelConfig


@dataclass(frozen=True)
class RunPlan:
    cfg: DictConfig                      # the composed config (written, hashed, logged as it is)
    mcfg: ModelConfig
    module: Any                          # the task module (harness.tasks)
    tcfg: Any                            # its Config
    device: torch.device
    max_len: int                         # the task's longest sequence (the model's positions)
    train_len: int                       # the training length (harness.tasks.train_length)
    flat: dict[str, Any]                 # the config flat (harness.outputs.results.flat_config)
    digest: str                          # its hash (config_hash): what a checkpoint belongs to
    eval_tokens: Optional[int] = None    # train: tokens per evaluation pass that fit the device
    core: Optional[tuple[str, int]] = None  # cost: the mixer's harness.ops core and key dimension

    @property
    def mode(self) -> str:
        return self.cfg.mode

    def build_model(self) -> LanguageModel:
        """The model for the task: its vocabulary, and positions for its longest sequence."""
        from harness.model import LanguageModel

        return LanguageModel(self.mcfg, vocab_size=self.tcfg.vocab_size, max_seq_len=self.max_len, checked=True)


def prepare(cfg: DictConfig) -> RunPlan:
    """cfg validated (ValueError, one line, at the first bad key), its derivations, and the
    resource check of its mode (ResourceError, one line, if the device cannot hold the run)."""
    from harness.config import validate
    from harness.outputs.results import config_hash, flat_config
    from harness.tasks import train_length

    checked = validate.validate_config(cfg)
    module, tcfg = checked.module, checked.tcfg
    plan = RunPlan(cfg=cfg, mcfg=checked.mcfg, module=module, tcfg=tcfg, device=checked.device,
                   max_len=module.max_seq_len(tcfg), train_len=train_length(module, tcfg),
                   flat=flat_config(cfg), digest=config_hash(cfg), core=checked.core)
    return replace(plan, eval_tokens=check_resources(plan))


def check_resources(plan: RunPlan) -> Optional[int]:
    """ResourceError (a ValueError: exit code 2) if the plan's run cannot fit on its device; for a
    training run the tokens per evaluation pass that fit (trainer.eval_tokens, or fewer)."""
    cfg = plan.cfg
    if cfg.mode == "train":
        from harness.train.memory import fit_training, shape_of

        return fit_training(shape_of(plan.mcfg, plan.module, plan.tcfg, cfg.trainer), cfg.trainer, plan.device)
    if cfg.mode == "probe":
        from harness.measure.probe import check_probe

        pr = cfg.probe
        check_probe([cfg.model.name], list(pr.d), list(pr.n) if pr.n is not None else None,
                    device=str(plan.device), candidates=pr.candidates, max_queries=pr.max_queries)
    return None


def as_plan(run: RunPlan | DictConfig) -> RunPlan:
    """A plan as it is; a config prepared (for a caller that holds a config, not a plan)."""
    return run if isinstance(run, RunPlan) else prepare(run)
