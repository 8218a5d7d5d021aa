"""A built-in mixer's own settings: a typed options class on the mixer, filled from `model.options`.

Each built-in mixer declares `Options`, a dataclass of the settings only it reads (FAVOR+'s
feature count, retnet's decay heads, swa's window), with their defaults and a `check()` that
raises one line naming `model.options.<key>`. `ModelConfig` keeps what every model has; a new
mixer with a hyperparameter adds a field to its own Options and touches nothing else.

Before mixers owned them, these settings were fields of the model config (`model.window=16`).
:data:`LEGACY_KEYS` is the one mapping from those keys to options (with the defaults they had
there): a ModelConfig built from an old mapping, an old command-line override, and a config's
flat form (what results.json, checkpoints and the config hash read) all go through it, so old
configs, hashes and checkpoints keep working.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from harness import checks

# The model.* keys that became options, with the default each had as a model field. The flat
# form of a built-in model's config lists each as model.<key> (from its options, else this
# default), as every results.json and config hash before the move did.
LEGACY_KEYS: dict[str, Any] = {
    "eps": 1e-6, "normalize": None, "favor_features": None, "favor_redraw": "never",
    "favor_signs": "positive", "favor_per_dim": None, "gate": "scalar", "mamba_heads": 4,
    "retnet_heads": 4, "dpfp_nu": 1, "rule": "delta", "decay": None, "window": None,
}


# Those of the old keys that were float fields: the schema made an integer given for one a float
# (model.decay=1 was 1.0), and the recorded form still does.
LEGACY_FLOATS = ("eps", "decay")


def only_here(default: Any) -> Any:
    """A dataclass field of a setting that, set away from its default, is refused on a mixer that
    does not declare it (a window on elu: a silent no-op would read as a finding). The other
    settings of a built-in are ignored by the mixers without them, so that one sweep may set
    FAVOR+'s redraw for every mixer it lists."""
    return field(default=default, metadata={"only_here": True})


@dataclass(frozen=True)
class Options:
    """A mixer with no settings of its own."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def refused_elsewhere(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("only_here"))

    @classmethod
    def default(cls, name: str) -> Any:
        return next(f.default for f in dataclasses.fields(cls) if f.name == name)

    @classmethod
    def of(cls, options: Optional[Mapping]) -> "Options":
        """The typed options from a `model.options` mapping: its entries this class declares."""
        own = cls.names()
        return cls(**{k: v for k, v in dict(options or {}).items() if k in own})

    def check(self) -> None:
        """Raise ValueError (one line, naming model.options.<key>) for a value out of its domain."""


@dataclass(frozen=True)
class KernelOptions(Options):
    eps: float = 1e-6  # denominator floor of normalised kernel attention
    normalize: Optional[bool] = None  # divide by phi(q).z; None: the mixer's default (linear: no)

    def check(self) -> None:
        checks.boolean("model.options.normalize", self.normalize, nullable=True)
        checks.number("model.options.eps", self.eps, "(0, inf)")


def lift(model: Mapping) -> dict:
    """A model mapping with its legacy keys (model.window, ...) moved into its `options`, those
    at their old default dropped (an old config lists every one; a built-in's option has that
    default, and an outside mixer was never handed them); a key set both ways to different
    values is an error (one line)."""
    out = dict(model)
    moved = {k: out.pop(k) for k in list(out) if k in LEGACY_KEYS}
    moved = {k: v for k, v in moved.items() if not at_default(v, LEGACY_KEYS[k])}
    if not moved:
        return out
    options = dict(out.get("options") or {})
    for key, value in moved.items():
        if key in options and options[key] != value:
            raise ValueError(f"model.{key}={value!r} and model.options.{key}={options[key]!r}: "
                             f"set one (model.{key} is the old name of model.options.{key})")
        options[key] = value
    out["options"] = options
    return out


def at_default(value: Any, default: Any) -> bool:
    """Whether a setting holds the default it had: by identity for None and booleans (a 0 is
    not False), by value and type otherwise (a string, 0.0)."""
    if default is None or isinstance(default, bool):
        return value is default
    return type(value) is type(default) and value == default


def rewrite_override(item: str) -> str:
    """A command-line override with an old key (`model.window=16`, `+model.rule=additive`) as
    the option it became (`model.options.window=16`); any other override unchanged."""
    key, eq, value = item.partition("=")
    bare = key.lstrip("+~")
    prefix = key[: len(key) - len(bare)]
    if bare.startswith("model.") and bare[len("model."):] in LEGACY_KEYS:
        return f"{prefix}model.options.{bare[len('model.'):]}{eq}{value}"
    return item


def legacy_flat(flat: dict[str, Any], builtin: bool) -> dict[str, Any]:
    """A flat config ({'model.options.window': 16, ...}) in the form results were recorded in
    before the move: every legacy key as model.<key>, from the options of a built-in model (or
    a hybrid of them), else its old default. An outside mixer's options stay under
    model.options, as they always were."""
    out = {}
    for key, value in flat.items():
        name = key[len("model.options."):] if key.startswith("model.options.") else None
        if builtin and name in LEGACY_KEYS:
            continue
        out[key] = value
    for name, default in LEGACY_KEYS.items():
        recorded = flat.get(f"model.{name}", default)  # a flat form already in the old keys
        value = flat.get(f"model.options.{name}", recorded) if builtin else recorded
        if name in LEGACY_FLOATS and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        out[f"model.{name}"] = value
    return out
