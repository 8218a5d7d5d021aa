"""Semantic checks on a composed config: the errors Hydra's types cannot express.

Each check raises ValueError with one readable line, before any model is built.
"""
from __future__ import annotations

import dataclasses

from omegaconf import DictConfig, OmegaConf

from harness.config import MODES

PRECISIONS = ("fp32", "bf16")
LOGGERS = ("wandb", "none")
WANDB_MODES = ("offline", "online", "disabled")


def task_config(task: DictConfig):
    """The task's own Config dataclass instance (without the group's `name`)."""
    from tasks import get_task

    module = get_task(task.name)
    names = {f.name for f in dataclasses.fields(module.Config)}
    values = OmegaConf.to_container(task, resolve=True)
    return module, module.Config(**{k: v for k, v in values.items() if k in names})


def model_config(model: DictConfig):
    from harness.model import ModelConfig

    return ModelConfig(**OmegaConf.to_container(model, resolve=True))


def _positive(section: str, node: DictConfig, keys: tuple[str, ...]) -> None:
    for key in keys:
        value = node.get(key)
        if value is not None and value <= 0:
            raise ValueError(f"{section}.{key} must be positive, got {value}")


def validate_config(cfg: DictConfig) -> None:
    if cfg.mode not in MODES:
        raise ValueError(f"unknown mode '{cfg.mode}'; valid: {', '.join(MODES)}")
    tr = cfg.trainer
    _positive("trainer", tr, ("max_steps", "lr", "batch_size", "eval_every", "eval_examples",
                              "data_chunk", "log_every", "measure_examples", "threads"))
    if tr.warmup_steps < 0:
        raise ValueError(f"trainer.warmup_steps must be >= 0, got {tr.warmup_steps}")
    if tr.precision not in PRECISIONS:
        raise ValueError(f"unknown trainer.precision '{tr.precision}'; valid: {', '.join(PRECISIONS)}")
    if tr.target_accuracy is not None and not 0 < tr.target_accuracy <= 1:
        raise ValueError(f"trainer.target_accuracy must be in (0, 1], got {tr.target_accuracy}")
    if cfg.logger.name not in LOGGERS:
        raise ValueError(f"unknown logger.name '{cfg.logger.name}'; valid: {', '.join(LOGGERS)}")
    if cfg.logger.mode not in WANDB_MODES:
        raise ValueError(f"unknown logger.mode '{cfg.logger.mode}'; valid: {', '.join(WANDB_MODES)}")
    _positive("probe", cfg.probe, ("candidates", "max_queries"))
    for key in ("d", "n"):
        if key == "n" and cfg.probe.n is None:
            continue
        if not cfg.probe[key] or min(cfg.probe[key]) <= 0:
            raise ValueError(f"probe.{key} must be a non-empty list of positive sizes")
    from harness.model import validate as validate_model

    validate_model(model_config(cfg.model))
    module, tcfg = task_config(cfg.task)
    module.validate(tcfg)
    for setting in module.eval_settings(tcfg):
        module.validate(setting)
