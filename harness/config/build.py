"""From a composed config to the objects it names: the task module and its Config, and the
ModelConfig (the model itself is built by the run's plan, harness.config.plan)."""
from __future__ import annotations

import dataclasses

from omegaconf import DictConfig, OmegaConf

from harness.model import ModelConfig


def task_config(task: DictConfig):
    """The task module and its own Config dataclass instance (without the group's `name`)."""
    from harness.tasks import get_task

    module = get_task(task.name)
    names = {f.name for f in dataclasses.fields(module.Config)}
    values = OmegaConf.to_container(task, resolve=True)
    return module, module.Config(**{k: v for k, v in values.items() if k in names})


def model_config(model: DictConfig) -> ModelConfig:
    return ModelConfig(**OmegaConf.to_container(model, resolve=True))
