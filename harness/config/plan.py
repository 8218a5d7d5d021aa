"""A run's plan: its config validated once and everything derived from it, made before the
output directory exists.

`prepare(cfg)` validates every key (harness.config.validate, once), keeps what validation built
(the ModelConfig, the task module and its Config, the device), derives the lengths and the
config's identity (its flat form and hash, harness.config.digest). The RunPlan it returns is
frozen: training, the probe, the cost mode and the outputs read it and derive nothing from the
config again. The mode's `ready` (harness.config.schema.MODES; for training
harness.train.memory.fitted) adds what fits on the device (a training run's tokens per evaluation
pass). `reopen(cfg, device)` is the plan of a finished run, from the config saved beside its
weights (harness.outputs.load).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property
from typing import TYPE_CHECKING, Any, Optional

from omegaconf import DictConfig, OmegaConf

from harness.config.schema import TrainerConfig

if TYPE_CHECKING:
    import torch

    from harness.model import LanguageModel, ModelConfig, Stack


@dataclass(frozen=True)
class RunPlan:
    cfg: DictConfig                      # the composed config (written and logged as it is)
    mcfg: ModelConfig
    module: Any                          # the task module (harness.tasks)
    tcfg: Any                            # its Config
    device: torch.device
    max_len: int                         # the task's longest sequence (the model's positions)
    train_len: int                       # the training length (harness.tasks.train_length)
    flat: dict[str, Any]                 # the config flat (harness.config.digest.flat_config)
    digest: str                          # its hash: what a checkpoint or a finished run belongs to
    eval_tokens: Optional[int] = None    # train: tokens per evaluation pass that fit (harness.train.memory.fitted)
    core: Optional[tuple[str, int]] = None  # cost: the mixer's harness.ops core and key dimension
    source: Any = None                   # a derived mode (ablate): the run it reads (harness.outputs.source)
    checked: bool = True                 # the ModelConfig has passed validation (not a reopened run's)

    @property
    def mode(self) -> str:
        return self.cfg.mode

    # Derived once from the fields on first read, never stored beside them: a plan made by
    # dataclasses.replace with another config or model derives its own.
    @cached_property
    def trainer(self) -> TrainerConfig:
        """cfg.trainer as plain typed values: what the loops read."""
        return trainer_settings(self.cfg.get("trainer"))

    @cached_property
    def stack(self) -> Stack:
        """The model's layers' configs and mixer classes (harness.model.stack_of)."""
        from harness.model import stack_of

        return stack_of(self.mcfg)

    def build_model(self) -> LanguageModel:
        """The model for the task: its vocabulary, and positions for its longest sequence."""
        from harness.model import LanguageModel

        return LanguageModel(self.mcfg, vocab_size=self.tcfg.vocab_size, max_seq_len=self.max_len,
                             checked=self.checked)


def _plan(cfg: DictConfig, mcfg: ModelConfig, module: Any, tcfg: Any, device: torch.device,
          **rest: Any) -> RunPlan:
    from harness.config.digest import identify
    from harness.tasks import train_length

    flat, digest = identify(cfg)
    return RunPlan(cfg=cfg, mcfg=mcfg, module=module, tcfg=tcfg, device=device,
                   max_len=module.max_seq_len(tcfg), train_len=train_length(module, tcfg),
                   flat=flat, digest=digest, **rest)


def trainer_settings(node: DictConfig | None) -> TrainerConfig:
    """The trainer section as a TrainerConfig of plain values (a read of it costs what an attribute
    costs, not an OmegaConf lookup); keys a later harness dropped are left out, keys it added take
    their defaults, and a saved config without the section (a reopened run's, for its model) gets
    the defaults."""
    known = {f.name for f in fields(TrainerConfig)}
    values = OmegaConf.to_container(node, resolve=True) if node is not None else {}
    return TrainerConfig(**{k: v for k, v in values.items() if k in known})


def prepare(cfg: DictConfig) -> RunPlan:
    """cfg validated (ValueError, one line, at the first bad key) and its derivations."""
    from harness.config import validate

    checked = validate.validate_config(cfg)
    return _plan(cfg, checked.mcfg, checked.module, checked.tcfg, checked.device, core=checked.core)


def reopen(cfg: DictConfig, device: torch.device) -> RunPlan:
    """The plan of a finished run from its saved config, not validated again: it was when the run
    was made, and a later harness may have added keys (their defaults fill them)."""
    from harness.config.build import model_config, task_config

    module, tcfg = task_config(cfg.task)
    return _plan(cfg, model_config(cfg.model), module, tcfg, device, checked=False)
