"""The one gate before a saved config's code is imported.

A run directory is data from anywhere, and its config may name code outside the harness in
several places; building the run imports each of them, and an import runs the module:

  model.name        a dotted path package.module.Class (a built-in name imports nothing)
  model.layers[i]   each slot of a hybrid, a name or a mapping {name: ..., ...}
  model.attn        the attention slot of the short form (a name or a mapping)
  task.name         any task module that is not built in

`code_names(config)` lists them, reading the config as data (nothing is imported to answer), and
`check_trusted` refuses a config that names any unless the caller trusts it, as Hugging Face's
`trust_remote_code`. Every entry point that reopens a run passes through it before any import
(harness.load_run, a derived mode such as mode=ablate, the figures that reopen runs), and each
refusal names what to set where the user is: `trust_code=True` in Python, `--trust-code` for
`python -m analysis.figures`, `<mode>.trust_code=true` for a derived mode.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.config.digest import flat_config
from harness.layers import registry
from harness.tasks import is_outside

PYTHON = "trust_code=True"  # harness.load_run's own spelling: the default refusal names it


def _mixer_is_code(name: Any) -> bool:
    """A mixer name that building would import: a dotted path that is not a built-in name."""
    return registry.is_dotted(name) and name not in registry.builtin_names()


def _slot_name(spec: Any) -> Any:
    return spec.get("name") if isinstance(spec, Mapping) else spec


def code_names(config: Mapping) -> dict[str, str]:
    """{key: name} of every place ``config`` (nested as saved beside the weights, or flat as
    results.json records it) names code outside the harness; {} when it names none."""
    flat = flat_config(dict(config))
    out: dict[str, str] = {}
    if _mixer_is_code(flat.get("model.name")):
        out["model.name"] = flat["model.name"]
    attn = flat.get("model.attn", flat.get("model.attn.name"))
    if _mixer_is_code(_slot_name(attn)):
        out["model.attn"] = _slot_name(attn)
    layers = flat.get("model.layers")
    for i, spec in enumerate(layers if isinstance(layers, (list, tuple)) else []):
        if _mixer_is_code(_slot_name(spec)):
            out[f"model.layers[{i}]"] = _slot_name(spec)
    if is_outside(flat.get("task.name")):
        out["task.name"] = flat["task.name"]
    return out


def asked(flag: str) -> str:
    """How a refusal asks for trust at an entry point: its keyword argument, flag or key."""
    return f"pass {flag}" if flag == PYTHON else f"add {flag}"


class UntrustedCode(ValueError):
    """A config that names outside code, refused before anything of it is imported; its message
    is one line naming the keys and what to set (``flag``) at the entry point in use."""

    def __init__(self, where: object, names: dict[str, str], flag: str = PYTHON) -> None:
        self.where, self.names, self.flag = where, dict(names), flag
        what = ", ".join(f"{key}={name}" for key, name in names.items())
        super().__init__(f"{where} names code outside the harness ({what}); reopening it would import and "
                         f"run that code: if you trust it, {asked(flag)}")

    def asking(self, flag: str) -> "UntrustedCode":
        """The same refusal, naming what to set at another entry point."""
        return UntrustedCode(self.where, self.names, flag)


def check_trusted(config: Mapping, trust_code: bool, *, where: object, flag: str = PYTHON) -> None:
    """UntrustedCode unless ``config`` names no outside code or the caller trusts it."""
    names = code_names(config)
    if names and not trust_code:
        raise UntrustedCode(where, names, flag)
