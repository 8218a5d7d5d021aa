"""From a composed config to the objects it names: the task module and its Config, the
ModelConfig, and the language model sized for the task."""
from __future__ import annotations

import dataclasses

from omegaconf import DictConfig, OmegaConf

from harness.model import LanguageModel, ModelConfig


def task_config(task: DictConfig):
    """The task module and its own Config dataclass instance (without the group's `name`)."""
    from harness.tasks import get_task

    module = get_task(task.name)
    names = {f.name for f in dataclasses.fields(module.Config)}
    values = OmegaConf.to_container(task, resolve=True)
    return module, module.Config(**{k: v for k, v in values.items() if k in names})


def model_config(model: DictConfig) -> ModelConfig:
    return ModelConfig(**OmegaConf.to_container(model, resolve=True))


def build_model(cfg: DictConfig) -> LanguageModel:
    """cfg's model for cfg's task: its vocabulary, and positions for the task's longest
    sequence (task.max_seq_len over the training and evaluation settings)."""
    module, tcfg = task_config(cfg.task)
    return LanguageModel(model_config(cfg.model), vocab_size=tcfg.vocab_size,
                         max_seq_len=module.max_seq_len(tcfg))
