"""Which mixers an experiment sweeps: every built-in mixer, less those it excludes with a reason.

An experiment file sweeps

    model: ${mixers:}                                   # every built-in mixer
    model: ${mixers:},deltanet_additive                 # plus a variant file of conf/model
    model: "${mixers:{swa: '<why it cannot run here>'}}" # every built-in but swa, with the reason

so a built-in mixer (one module under harness/layers that registers its name, and its
conf/model/<name>.yaml) joins every experiment without being listed anywhere. The resolver
runs when Hydra builds the sweeper (and wherever the grid is composed: analysis.figures, the
smoke, the wandb sweep files), so the grid is always the registry of the moment. The
exclusions live in the sweeper's parameter, Hydra's part of the config, so a run's own config
(its results, its hash, its model.pt) holds nothing of them.
"""
from __future__ import annotations

from collections.abc import Mapping

from omegaconf import OmegaConf

from harness.conf import CONF_DIR
from harness.layers.registry import builtin_names

RESOLVER = "mixers"


def model_choices(exclude: Mapping[str, str] | None = None) -> list[str]:
    """The `model=` choices of every built-in mixer but those in ``exclude`` ({name: reason}),
    sorted; ValueError (one line) for an exclusion that names no built-in or gives no reason,
    and for a built-in without its conf/model file."""
    exclude = dict(exclude or {})
    names = builtin_names()
    unknown = sorted(set(exclude) - set(names))
    if unknown:
        raise ValueError(f"${{mixers:...}} excludes no built-in mixer: {', '.join(unknown)}; "
                         f"built-ins: {', '.join(names)}")
    unexplained = sorted(name for name, reason in exclude.items() if not str(reason or "").strip())
    if unexplained:
        raise ValueError(f"${{mixers:...}}: give the reason each mixer cannot run here: {', '.join(unexplained)}")
    missing = [name for name in names if not (CONF_DIR / "model" / f"{name}.yaml").exists()]
    if missing:
        raise ValueError(f"built-in mixer(s) without a config file: "
                         f"{', '.join(f'harness/conf/model/{m}.yaml' for m in missing)}")
    return [name for name in names if name not in exclude]


def _resolve(exclude: Mapping[str, str] | None = None) -> str:
    """`${mixers:}` or `${mixers:{name: reason, ...}}`: the choices as one sweeper value, "a,b,c"."""
    return ",".join(model_choices(exclude))


def register_resolver() -> None:
    """Make `${mixers:...}` known to OmegaConf (idempotent)."""
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, _resolve)
