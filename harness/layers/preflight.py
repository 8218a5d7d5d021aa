"""The pre-flight of an outside mixer: everything that can go wrong with it, found before any work.

Before the first step the harness builds layer 0's mixer and, at batch 1, runs it forward and
backward once at every length the run will use (the training length and each test length), so
a length limit (a Hyena's `l_max`, a table sized at construction) is one line and exit code 2,
not a traceback after training:

    harness: error: model.name=pkg.Hyena: forward fails at T = 128 (a test length) (RuntimeError: ...)

It then calls every protocol member once, by keyword and guarded (:func:`call_state_size`): a
member that raises or returns the wrong type is skipped with its reason (results.json
"measure": {"state_size": "skipped: TypeError: ..."}) and draws one warning line, here, before
training, and never ends a run. Options an outside constructor taking **kwargs never stored are
warned about, naming the closest accepted name. Built-in mixers are trusted (the tests hold them).
"""
from __future__ import annotations

import difflib
import inspect
from typing import Any, Optional

import torch
from torch import nn

from harness.errors import warn

# Protocol attributes and the types they must have (harness.layers.protocol); bool is not an int here.
ATTRIBUTE_TYPES = {"family": str, "core": str, "kernel": str, "d_key": int, "d_head": int, "n_heads": int,
                   "positive_denominator": bool, "monotone_in_score": bool, "heads_per_readout": int,
                   "wants_learned_positions": bool, "memory_kind": str}


def _qualname(obj: Any) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def skip(mixer: nn.Module, member: str, reason: str) -> None:
    """Record that `member` of `mixer` is skipped (results.json "measure"), warning once per class."""
    skipped = mixer.__dict__.setdefault("_protocol_skipped", {})
    skipped[member] = f"skipped: {reason}"
    warn(f"{_qualname(mixer)}.{member}: skipped: {reason}", once=(_qualname(mixer), member))


def skipped(mixer: nn.Module, sequence_length: int = 64) -> dict[str, str]:
    """The protocol members of `mixer` skipped, with their reasons ({} when none); its members are
    checked first if they have not been (a warning is printed once per class in a process)."""
    if not mixer.__dict__.get("_protocol_checked"):
        mixer.__dict__["_protocol_checked"] = True
        check_members(mixer, sequence_length)
    return dict(mixer.__dict__.get("_protocol_skipped", {}))


def _message(exc: BaseException, lines: int = 1) -> str:
    from harness.errors import shown

    text = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return shown(f"{type(exc).__name__}: {'; '.join(text[:lines])}" + ("; ..." if len(text) > lines else ""))


def call_state_size(mixer: nn.Module, sequence_length: int) -> Optional[int]:
    """mixer.state_size called by keyword: `sequence_length=T`, and `batch_size=1` when its
    signature has one (Zoology's and fla's conventions both). None when the mixer declares none,
    or when the call raises or returns no int (then skipped with the reason, warned once)."""
    fn = getattr(mixer, "state_size", None)
    if fn is None:
        return None
    if "state_size" in mixer.__dict__.get("_protocol_skipped", {}):
        return None
    if not callable(fn):
        skip(mixer, "state_size", f"TypeError: state_size is a {type(fn).__name__}, not a method")
        return None
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # no signature to read (a builtin): call it and see
        params = None
    any_kw = params is None or any(p.kind is p.VAR_KEYWORD for p in params.values())
    kwargs: dict[str, Any] = {"sequence_length": int(sequence_length)}
    if not any_kw and "sequence_length" not in params:
        skip(mixer, "state_size", f"TypeError: {type(mixer).__name__}.state_size() takes no argument "
                                  "'sequence_length'")
        return None
    if params is not None and "batch_size" in params:
        kwargs["batch_size"] = 1
    try:
        value = fn(**kwargs)
    except Exception as exc:  # a member a mixer gets wrong is skipped, never the end of a run
        skip(mixer, "state_size", _message(exc))
        return None
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, float) and value.is_integer() and value >= 0:  # Based's 9945.0: a count all the same
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        skip(mixer, "state_size", f"TypeError: returned {value!r} ({type(value).__name__}), "
                                  "expected an int >= 0 (elements per layer)")
        return None
    return value


PREFIX = "harness_"  # `harness_kernel = "elu1"` declares a member whose plain name the mixer uses itself


def _of_kind(value: Any, kind: type) -> bool:
    return isinstance(value, kind) and (kind is bool or not isinstance(value, bool))


def is_own_attribute(value: Any) -> bool:
    """A value no protocol attribute can be: a module, a tensor, a parameter or a function. An
    attribute holding one (H3's `kernel`, its SSM kernel) is the mixer's own, not a declaration."""
    return isinstance(value, (nn.Module, torch.Tensor)) or callable(value)


def member(mixer: nn.Module, name: str) -> Any:
    """A protocol attribute of `mixer` (ATTRIBUTE_TYPES): `harness_<name>` when declared, else
    `<name>`; None when absent or of the wrong kind (so a colliding attribute is never read)."""
    kind = ATTRIBUTE_TYPES[name]
    for attr in (PREFIX + name, name):
        value = getattr(mixer, attr, None)
        if value is not None:
            return value if _of_kind(value, kind) else None
    return None


def check_members(mixer: nn.Module, sequence_length: int) -> None:
    """Every protocol member once: attributes of the wrong type and members that fail are
    skipped with their reason (and one warning each). An attribute that is plainly the mixer's
    own (is_own_attribute) is ignored without a warning: it is recorded under "ignored"."""
    for name, kind in ATTRIBUTE_TYPES.items():
        attr = PREFIX + name if getattr(mixer, PREFIX + name, None) is not None else name
        value = getattr(mixer, attr, None)
        if value is None or _of_kind(value, kind):
            continue
        if is_own_attribute(value):
            mixer.__dict__.setdefault("_protocol_ignored", {})[name] = (
                f"ignored: {attr} is the mixer's own {type(value).__name__}, not a protocol {kind.__name__} "
                f"(declare {PREFIX}{name} to set the member)")
            continue
        skip(mixer, name, f"TypeError: {attr} is {value!r} ({type(value).__name__}), expected {kind.__name__}")
    call_state_size(mixer, sequence_length)


def ignored(mixer: nn.Module) -> dict[str, str]:
    """The attributes check_members ignored as the mixer's own, with why ({} when none); its
    members are checked first if they have not been (as `skipped`)."""
    skipped(mixer)
    return dict(mixer.__dict__.get("_protocol_ignored", {}))


# --------------------------------------------------------------------------------------------
# Errors that say what to set.


def option_hints(cls: type, kwargs: dict) -> str:
    """The constructor's keyword arguments the harness did not set whose names suggest a shape
    (head, dim, l_max), with their defaults: the likely model.options to set ("" when none)."""
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return ""
    found = [f"{n}={p.default!r}" for n, p in params.items()
             if n not in kwargs and n != "self" and p.default is not p.empty
             and any(s in n.lower() for s in ("head", "dim", "l_max"))]
    return f"; likely model.options to set: {', '.join(found)}" if found else ""


def describe(exc: BaseException) -> str:
    """An exception's message, its first few lines joined (pydantic's field list included)."""
    return _message(exc, lines=6)


# --------------------------------------------------------------------------------------------
# Unused options of a **kwargs constructor.


def _names_held(mixer: nn.Module) -> set[str]:
    names: set[str] = set()
    for module in mixer.modules():
        names.update(module.__dict__)
        names.update(module._parameters, module._buffers, module._modules)
        for value in module.__dict__.values():
            if isinstance(value, dict):
                names.update(k for k in value if isinstance(k, str))
            elif hasattr(value, "__dict__") and not isinstance(value, (nn.Module, type)):
                try:
                    names.update(vars(value))
                except TypeError:
                    pass
    return names


def warn_unused_options(config, cls: type, mixer: nn.Module) -> list[str]:
    """For a constructor taking **kwargs: each model.options key it neither names nor stored on
    the built module draws one warning naming the closest accepted name. Returns the keys."""
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return []
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return []
    named = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - {"self"}
    held = _names_held(mixer)
    unused = [k for k in dict(config.options or {}) if k not in named and k not in held]
    accepted = sorted(named | {n for n in held if not n.startswith("_")})
    for key in unused:
        close = difflib.get_close_matches(key, accepted, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        warn(f"model.options.{key}: model.name={config.name} takes **kwargs but never stored or read "
             f"{key!r}, so it has no effect{hint}")
    return unused


# --------------------------------------------------------------------------------------------
# The pre-flight.


def run_lengths(task_module, task_cfg) -> list[tuple[int, str]]:
    """(T, what) of every length a run uses: the training length(s), then each test length."""
    out: list[tuple[int, str]] = []
    seen: set[int] = set()

    def add(t, what):
        if isinstance(t, int) and t > 0 and t not in seen:
            seen.add(t)
            out.append((t, what))

    add(getattr(task_cfg, "seq_len", None), "the training length")
    if getattr(task_cfg, "mixture", None) and hasattr(task_module, "mixture_settings"):
        for s in task_module.mixture_settings(task_cfg):
            add(getattr(s, "seq_len", None), "the training length")
    for s in task_module.eval_settings(task_cfg):
        add(getattr(s, "seq_len", None), "a test length")
    if not out:
        add(int(task_module.max_seq_len(task_cfg)), "the longest length")
    return out


# Constructor arguments that bound the sequence length a mixer accepts (Hyena's l_max, a table
# of positions sized at construction).
LENGTH_OPTIONS = ("l_max", "max_len", "max_seq_len", "max_length", "seq_len", "max_position_embeddings")


def length_limit(cls: type, kwargs: dict) -> Optional[tuple[str, int, bool]]:
    """(option, value, set by the user) of the first length-bounding constructor argument, from
    the kwargs passed or its default; None when the constructor has none with an int value."""
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return None
    for name in LENGTH_OPTIONS:
        if name in kwargs:
            value, given = kwargs[name], True
        elif name in params and params[name].default is not inspect.Parameter.empty:
            value, given = params[name].default, False
        else:
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            return name, value, given
    return None


def length_cause(cls: type, kwargs: dict, T: int) -> str:
    """Where a forward pass fails at length T and a length-bounding option is below T: that
    option, its value and the length, first in the message (before the mixer's own exception,
    which may blame something else: Zoology's Hyena raises AttributeError 'max_l'); "" otherwise."""
    limit = length_limit(cls, kwargs)
    if limit is None or limit[1] >= T:
        return ""
    name, value, given = limit
    return (f": model.options.{name}={value} ({'set' if given else 'its default'}) < T = {T}; "
            f"set model.options.{name}={T} or more")


def preflight(config, lengths: list[tuple[int, str]], cls: type, kwargs: dict, mixer: nn.Module) -> nn.Module:
    """Run layer 0's mixer (built by harness.layers.registry.check_mixer from `cls` and the
    constructor `kwargs`) forward and backward at batch 1 at each length; a failure is a
    ValueError (one line) naming the length and the options likely to set. Then check every
    protocol member once (warnings, never errors) and the unused options. Returns the mixer."""
    hints = option_hints(cls, kwargs)
    for T, what in lengths:
        x = torch.randn(1, T, config.d_model, requires_grad=True)
        step = "forward"
        try:
            out = mixer(x)
            out = out[0] if isinstance(out, tuple) and out else out
            if not isinstance(out, torch.Tensor) or out.shape != x.shape:
                got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                raise ValueError(f"model.name={config.name}: forward returned {got}, expected (B, T, C) = "
                                 f"{tuple(x.shape)} (a tensor, or a tuple whose first element is one)")
            step = "backward"
            if out.requires_grad:
                out.float().square().mean().backward()
        except ValueError as exc:
            if str(exc).startswith(f"model.name={config.name}: forward returned"):
                raise
            raise ValueError(f"model.name={config.name}: {step} fails at T = {T} ({what}) "
                             f"({describe(exc)}){hints}") from None
        except Exception as exc:
            raise ValueError(f"model.name={config.name}: {step} fails at T = {T} ({what})"
                             f"{length_cause(cls, kwargs, T)} ({describe(exc)}){hints}") from None
        mixer.zero_grad(set_to_none=True)
    check_members(mixer, max(t for t, _ in lengths))
    warn_unused_options(config, cls, mixer)
    if getattr(config, "short_conv", False) and "config" not in kwargs:  # like for like: said plainly, not silently assumed
        print(f"[harness] note: model.short_conv applies inside the built-in mixers only; model.name="
              f"{config.name} runs with whatever short convolution it has itself (model.pos_emb, the "
              "model's embedding, applies to it)", flush=True)
    return mixer
