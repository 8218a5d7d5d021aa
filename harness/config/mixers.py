"""Which mixers an experiment sweeps: the built-in mixers chosen by what they are.

An experiment file sweeps

    model: ${mixers:}                                   # every built-in mixer
    model: ${mixers:},deltanet_additive                 # plus a variant file of conf/model
    model: "${mixers:{where: {family: delta}}}"         # those whose class declares family delta
    model: "${mixers:{where: {tags: gated}}}"           # those that declare the tag `gated`
    model: "${mixers:{only: [softmax, elu], why: '<why these>'}}"  # a chosen few, with the reason
    model: "${mixers:{swa: '<why it cannot run here>'}}" # every built-in but swa, with the reason

`where` matches the attributes a mixer's class declares (harness.layers.protocol: family,
memory_kind, core, kernel, fixed_decays, tags, ...), a value or a list of values each; so a new
built-in mixer (one module under harness/layers that registers its name, and its
conf/model/<name>.yaml) joins every grid its nature belongs to without being listed anywhere,
and none that chose its mixers by name or budget (`only`). The resolver runs when Hydra builds
the sweeper (and wherever the grid is composed: analysis.figures, the smoke, the wandb sweep
files), so the grid is always the registry of the moment. The choice lives in the sweeper's
parameter, Hydra's part of the config, so a run's own config (its results, its hash, its
model.pt) holds nothing of it.
"""
from __future__ import annotations

from collections.abc import Mapping

from omegaconf import OmegaConf

from harness.conf import CONF_DIR
from harness.layers.registry import builtin_names, resolve

RESOLVER = "mixers"
SELECTORS = ("where", "only", "why")  # the mapping's keys that are not a mixer excluded by name


def _values(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def declares(name: str, attribute: str, wanted) -> bool:
    """Whether built-in mixer ``name``'s class declares ``attribute`` as one of ``wanted`` (a
    value or a list); for ``tags``, whether it declares any of them among its tags."""
    cls = resolve(name)
    if attribute == "tags":
        return bool(set(map(str, _values(wanted))) & set(cls.tags))
    have = getattr(cls, attribute)
    return any(have == want or str(have) == str(want) for want in _values(wanted))


def _where(names: list[str], where: Mapping) -> list[str]:
    classes = {resolve(name) for name in names}
    unknown = sorted(attr for attr in where if not all(hasattr(cls, attr) for cls in classes))
    if unknown:
        raise ValueError(f"${{mixers:{{where: ...}}}}: no built-in mixer declares {', '.join(unknown)} "
                         "(harness.layers.protocol lists what a mixer declares)")
    return [name for name in names if all(declares(name, attr, want) for attr, want in where.items())]


def model_choices(select: Mapping | None = None) -> list[str]:
    """The `model=` choices the selection ``select`` names, in the registry's (sorted) order:
    every built-in, narrowed by ``where`` ({attribute: value(s)}) and ``only`` ([names], with
    ``why``), less each other key ({name: reason}); ValueError (one line) for a name that is no
    built-in, an exclusion or `only` without its reason, a selection that keeps nothing, and a
    built-in without its conf/model file."""
    select = dict(select or {})
    where, only, why = (select.pop(key, None) for key in SELECTORS)
    where = where or {}
    names = builtin_names()
    unknown = sorted((set(select) | set(_values(only or []))) - set(names))
    if unknown:
        raise ValueError(f"${{mixers:...}} names no built-in mixer: {', '.join(unknown)}; "
                         f"built-ins: {', '.join(names)}")
    unexplained = sorted(name for name, reason in select.items() if not str(reason or "").strip())
    if unexplained:
        raise ValueError(f"${{mixers:...}}: give the reason each mixer cannot run here: {', '.join(unexplained)}")
    if only is not None and not str(why or "").strip():
        raise ValueError("${mixers:{only: [...]}}: say why these mixers (why: '...')")
    missing = [name for name in names if not (CONF_DIR / "model" / f"{name}.yaml").exists()]
    if missing:
        raise ValueError(f"built-in mixer(s) without a config file: "
                         f"{', '.join(f'harness/conf/model/{m}.yaml' for m in missing)}")
    chosen = _where(names, where)
    if only is not None:
        chosen = [name for name in chosen if name in set(_values(only))]
    chosen = [name for name in chosen if name not in select]
    if not chosen:
        raise ValueError(f"${{mixers:...}} keeps no built-in mixer: {dict(where=where, only=only, **select)}")
    return chosen


def _resolve(select: Mapping | None = None) -> str:
    """`${mixers:}` or `${mixers:{...}}`: the choices as one sweeper value, "a,b,c"."""
    return ",".join(model_choices(select))


def register_resolver() -> None:
    """Make `${mixers:...}` known to OmegaConf (idempotent)."""
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, _resolve)
