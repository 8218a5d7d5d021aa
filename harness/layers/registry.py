"""Which class `model.name` means, and how a mixer is constructed.

`model.name` is a built-in name (a module under harness/layers registers its classes with
:func:`register` when it is imported; every module there is imported on first use, so a new
built-in mixer is one file) or a dotted import path `package.module.Class` to any nn.Module.

A mixer is constructed with the keyword arguments its constructor names among those the
harness can supply (:func:`supplied`): `d_model` (or fla's `hidden_size`), `n_heads` (or
`num_heads`), `layer_idx`, `config` (the ModelConfig), and every entry of `model.options`.
An option the constructor does not take is an error, unless it takes **kwargs. A built-in mixer
is constructed with the config alone and reads its options through its typed `Options`
(harness.layers.options; :func:`check_options` checks them).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path
from typing import Any, Callable

from torch import nn

from harness.errors import first_line

_BUILTINS: dict[str, type] = {}
# The mixer a model is built with when it names none (conf/model's default too), and the one a
# hybrid's attention slots take when `model.attn` is not set.
DEFAULT_MIXER = "elu"
DEFAULT_ATTENTION = "softmax"
_NOT_MIXERS = ("options", "parts", "protocol", "registry")  # modules of this package that define no mixer
_discovered = False


def register(*names: str) -> Callable[[type], type]:
    """Class decorator: make `cls` the built-in mixer called each of `names`."""
    def deco(cls: type) -> type:
        for name in names:
            if name in _BUILTINS and _BUILTINS[name] is not cls:
                raise ValueError(f"mixer name {name!r} registered twice")
            _BUILTINS[name] = cls
        return cls

    return deco


def unregister(name: str) -> None:
    """Forget a built-in name (a notebook redefining a mixer, a test cleaning up)."""
    _BUILTINS.pop(name, None)


def _discover() -> None:
    """Import every mixer module of harness.layers once (registration happens on import)."""
    global _discovered
    if _discovered:
        return
    here = Path(__file__).resolve().parent  # harness/layers
    for info in pkgutil.iter_modules([str(here)]):
        if info.name not in _NOT_MIXERS:
            importlib.import_module(f"{__package__}.{info.name}")
    _discovered = True


def builtin_names() -> list[str]:
    """The built-in mixer names, sorted."""
    _discover()
    return sorted(_BUILTINS)


def definition_order() -> list[str]:
    """The built-in mixer names in the order the package defines them (its modules by name, each
    module's mixers top to bottom): the reading order figures draw a family's mixers in."""
    _discover()
    return list(_BUILTINS)


def is_dotted(name: str) -> bool:
    return isinstance(name, str) and "." in name


def keeps_keys(name: str) -> bool:
    """Whether the built-in mixer `name` keeps a key and a value per token it sees (its class's
    memory_kind: softmax, swa's window), so its work and memory grow with the keys. False for a
    dotted name, whose code is not imported to answer this."""
    _discover()
    return name in _BUILTINS and _BUILTINS[name].memory_kind == "kv_cache"


def resolve(name: str) -> type:
    """The class `model.name` names; ValueError (one line) if it names none."""
    _discover()
    if name in _BUILTINS:
        return _BUILTINS[name]
    if not is_dotted(name):
        raise ValueError(f"unknown model.name {name!r}; valid: {', '.join(builtin_names())}, "
                         "or a dotted path package.module.Class")
    return import_object(name, "model.name", nn.Module)


def import_object(path: str, key: str, base: type | None = None) -> Any:
    """`package.module.Name` imported; ValueError naming `key`, the path and the cause otherwise."""
    module_name, _, attr = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or the module itself failing on import
        raise ValueError(f"{key}={path}: cannot import module {module_name!r} "
                         f"({type(exc).__name__}: {first_line(exc)})") from None
    if not hasattr(module, attr):
        raise ValueError(f"{key}={path}: module {module_name!r} has no attribute {attr!r}")
    obj = getattr(module, attr)
    if base is not None and not (isinstance(obj, type) and issubclass(obj, base)):
        raise ValueError(f"{key}={path}: {attr!r} is not a subclass of {base.__module__}.{base.__name__}")
    return obj


def option_owners() -> dict[str, list[str]]:
    """Every option a built-in mixer declares -> the built-in names that declare it."""
    owners: dict[str, list[str]] = {}
    for name in builtin_names():
        for key in _BUILTINS[name].Options.names():
            owners.setdefault(key, []).append(name)
    return owners


def check_options(config) -> None:
    """model.options of a built-in mixer (a hybrid's slot): every key an option of some built-in
    (else a typo), each value in its domain (checked by a mixer that declares it), and no setting
    that only its owners take (a window, the additive rule) set on a mixer without it. A key the
    mixer does not declare is otherwise ignored, so that one sweep may set FAVOR+'s redraw for
    every mixer it lists. ValueError, one line."""
    from harness import checks

    cls, owners = resolve(config.name), option_owners()
    options = config.options or {}
    if not hasattr(options, "items"):
        checks.fail("model.options", "a mapping of settings (model.options.<name>=<value>)", options)
    for key, value in options.items():
        if key not in owners:
            raise ValueError(f"model.options.{key}: not an option of any built-in mixer (model.name="
                             f"{config.name} takes: {', '.join(cls.Options.names()) or 'none'})")
        owner = _BUILTINS[owners[key][0]].Options
        owner(**{key: value}).check()
        if key not in cls.Options.names() and key in owner.refused_elsewhere() and value != owner.default(key):
            default = "null" if owner.default(key) is None else owner.default(key)
            checks.fail(f"model.options.{key}", f"{default} for model.name={config.name} "
                        f"(it is an option of {' and '.join(owners[key])})", value)
    cls.options_of(config).check()


def supplied(config, layer_idx: int) -> dict[str, Any]:
    """Every keyword argument the harness can give a mixer's constructor."""
    return {"config": config, "d_model": config.d_model, "hidden_size": config.d_model,
            "n_heads": config.n_heads, "num_heads": config.n_heads, "layer_idx": layer_idx}


def constructor_kwargs(cls: type, config, layer_idx: int) -> dict[str, Any]:
    """The keyword arguments `cls(...)` receives: the supplied ones it names, and the options."""
    params = inspect.signature(cls.__init__).parameters
    named = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - {"self"}
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    options = dict(config.options or {}) if is_dotted(config.name) else {}  # a built-in reads its Options
    kwargs = {k: v for k, v in supplied(config, layer_idx).items() if k in named and k not in options}
    for key, value in options.items():
        if key not in named and not takes_any:
            raise ValueError(f"model.options.{key}: model.name={config.name} takes no argument "
                             f"{key!r} (it takes: {', '.join(sorted(named)) or 'none'})")
        kwargs[key] = value
    missing = [n for n, p in params.items() if n in named and p.default is p.empty and n not in kwargs]
    if missing:
        raise ValueError(f"model.name={config.name}: the constructor needs {missing[0]!r}, which the "
                         f"harness cannot supply; set it with model.options.{missing[0]}=...")
    return kwargs


# model.* keys that act inside a built-in mixer only: an outside mixer that is not handed the
# ModelConfig (a `config` argument) runs with its own settings for them.
MIXER_KEYS = ("short_conv", "conv_size", "rotary", "qk_dim", "chunk_size")


def not_applied(config, kwargs: dict[str, Any]) -> list[str]:
    """The model.* keys set away from their defaults (short_conv: when on) that a mixer built
    with `kwargs` never sees: [] for a built-in mixer or one handed the whole config."""
    if not is_dotted(config.name) or "config" in kwargs:
        return []
    defaults = type(config)()
    out = [k for k in MIXER_KEYS if getattr(config, k) != getattr(defaults, k) or (k == "short_conv" and config.short_conv)]
    if not {"n_heads", "num_heads"} & set(kwargs):
        out.append("n_heads")
    return out


def construction(config, kwargs: dict[str, Any]) -> dict[str, Any]:
    """What results.json records of how a mixer was built: its name, the keyword arguments the
    harness passed (the ModelConfig named, not copied) and the model.* keys that did not apply."""
    passed = {k: ("<ModelConfig>" if k == "config" else v) for k, v in kwargs.items()}
    return {"mixer": config.name, "kwargs": passed, "not_applied": not_applied(config, kwargs)}


def build(config, layer_idx: int) -> nn.Module:
    """The mixer of layer `layer_idx` for a ModelConfig (a hybrid's slot config for that layer).
    An outside class that fails to construct raises ValueError naming the path and the cause.
    How it was built is kept on the module (`built_with`: harness.layers.registry.construction)."""
    cls = resolve(config.name)
    kwargs = constructor_kwargs(cls, config, layer_idx)
    if not is_dotted(config.name):
        mixer = cls(**kwargs)
    else:
        try:
            mixer = cls(**kwargs)
        except Exception as exc:  # the whole message (pydantic's field list), and the options likely to set
            from harness.layers.preflight import describe, option_hints
            raise ValueError(f"model.name={config.name}: construction failed "
                             f"({describe(exc)}){option_hints(cls, kwargs)}") from None
    mixer.__dict__["_harness_built_with"] = construction(config, kwargs)
    return mixer


def built_with(mixer: nn.Module) -> dict[str, Any]:
    """registry.construction of a mixer built by `build` ({} for one built elsewhere)."""
    return dict(mixer.__dict__.get("_harness_built_with", {}))


def check_mixer(config, lengths=None) -> None:
    """The pre-flight of an outside mixer (harness.layers.preflight): built, and run forward and
    backward at batch 1 at every (T, what) of `lengths` (default: 8 tokens); a failure is a
    ValueError naming the path, the length and what is wrong, before any training. Built-in
    mixers are trusted (the tests hold them); their options were checked with the rest of the
    config (harness.model.validate, which every caller runs first)."""
    if not is_dotted(config.name):
        return
    from harness.layers.preflight import preflight

    cls = resolve(config.name)
    preflight(config, lengths or [(8, "8 tokens")], cls, constructor_kwargs(cls, config, 0), build(config, 0))
