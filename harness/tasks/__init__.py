"""Synthetic recall tasks, one module each (`recall` (MQAR), `induction`, `interference`,
`forgetting`, `needle`, ...).

The task protocol: a task is a module with

  Config                 a dataclass of its settings (the `task.*` keys)
  validate(cfg)          raise ValueError with one line if a setting is impossible
  eval_settings(cfg)     the evaluation settings, each a Config (one per test N, say)
  max_seq_len(cfg)       the longest sequence of the training and evaluation settings
  make_batch(cfg, batch_size, *, seed, device="cpu", split="train")
                         a harness.tasks.base.Batch, deterministic in (seed, split)

and a `NAME` for the built-ins. Optional: `val_settings(cfg)`, the settings validated on during
training (default eval_settings; the recall task's training mixture validates on its own
settings). Every module of this package that has a NAME is a built-in
task (adding one is one file, plus its YAML in harness/conf/task); `task=package.module` (or
`task.name=package.module`) names a task module anywhere else.

The built-ins evaluate at a list of lengths (`task.test_seq_len`, every other evaluation
variable at each length) and label only where an answer is due: the model's head and the loss
run at those positions alone (harness.tasks.base.label_positions). A Batch carries the
variable its accuracy is sliced by (slice_name / slice_value) and, where a task has more than
one, the others in other_slices (forgetting: overwritten and age).
"""
from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from harness.tasks.base import IGNORE, PAD, Batch, label_positions

PROTOCOL = ("Config", "validate", "eval_settings", "max_seq_len", "make_batch")


def _discover() -> dict[str, ModuleType]:
    found = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "NAME"):
            found[module.NAME] = module
    return dict(sorted(found.items()))


TASKS: dict[str, ModuleType] = _discover()


def is_outside(name: object) -> bool:
    """Whether `name` is meant as a module path rather than a built-in task."""
    return isinstance(name, str) and name not in TASKS and name != ""


def get_task(name: str) -> ModuleType:
    """The task module called `name`: a built-in, or an importable module (a path such as
    `package.module`) that has every member of the task protocol. ValueError (one line) otherwise."""
    if name in TASKS:
        return TASKS[name]
    unknown = (f"unknown task {name!r}; valid: {', '.join(TASKS)}, or a module path "
               "package.module with the task protocol (harness.tasks)")
    if not isinstance(name, str) or not name:
        raise ValueError(unknown)
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name.split(".")[0] and "." not in name:
            raise ValueError(unknown) from None  # a misspelt built-in, most likely
        raise ValueError(f"task.name={name}: cannot import module {name!r} (ModuleNotFoundError: {exc})") from None
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ValueError(f"task.name={name}: cannot import module {name!r} ({type(exc).__name__}: {first})") from None
    missing = [m for m in PROTOCOL if not hasattr(module, m)]
    if missing:
        raise ValueError(f"task.name={name}: the module lacks {', '.join(missing)} of the task protocol "
                         f"({', '.join(PROTOCOL)}; see harness.tasks)")
    return module


def train_length(module: ModuleType, cfg) -> int:
    """The sequence length of a task config's examples, from the config alone when the task
    has `seq_len(cfg)` (every built-in one: a billion-token vocabulary or a length of 10^8 is
    sized without generating anything); an outside task without it is read off one generated
    example. Tasks derive it differently: interference from N when seq_len is null."""
    if hasattr(module, "seq_len"):
        return int(module.seq_len(cfg))
    return int(module.make_batch(cfg, 1, seed=0, device="cpu").inputs.shape[1])


__all__ = ["TASKS", "train_length", "PROTOCOL", "get_task", "is_outside", "Batch", "IGNORE", "PAD", "label_positions"]
