"""Synthetic recall tasks, one module each: `recall` (MQAR), `induction`, `interference`.

Every task module has a `Config` dataclass, `validate(cfg)`, `eval_settings(cfg)`,
`max_seq_len(cfg)` and `make_batch(cfg, batch_size, *, seed, device="cpu", split="train")`
returning a `tasks.base.Batch`.
"""
from __future__ import annotations

from types import ModuleType

from harness.tasks import induction, interference, recall
from harness.tasks.base import IGNORE, PAD, Batch

TASKS: dict[str, ModuleType] = {m.NAME: m for m in (induction, interference, recall)}


def get_task(name: str) -> ModuleType:
    """The task module called `name`; ValueError naming the valid ones otherwise."""
    try:
        return TASKS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown task {name!r}; valid: {', '.join(sorted(TASKS))}") from None


__all__ = ["TASKS", "get_task", "Batch", "IGNORE", "PAD"]
