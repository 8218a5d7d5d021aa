"""A config's identity: its flat form and the hash of what it computes.

The flat form ({'model.d_model': 64, ...}) is what results.json, a checkpoint and the logger
record; the hash covers the keys that change what a run computes, so a checkpoint, a finished
run and a sweep's skip check know which config they belong to. A run's plan holds both
(harness.config.plan); reading a run written earlier compares against them.
"""
from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from omegaconf import DictConfig, OmegaConf

from harness.layers.options import at_default, legacy_flat
from harness.layers.registry import is_dotted

# Keys that say where or how loudly a run happens, not what it computes: they do not enter
# the config hash, so a rerun of a sweep with another output folder still finds its results.
_HASH_EXCLUDE = ("out_dir", "trainer.progress", "trainer.log_every", "trainer.ckpt_every",
                 "trainer.resume", "logger.", "sweep.",
                 # predictions written into an experiment before its later runs (analysis.preregister):
                 # they change no run, and its earlier runs keep their hash when they are written
                 "analysis.law_predictions")
# Keys added after results were first written, with the default they were added with: at it they
# stay out of the hash, so existing results keep their hash and a rerun of their sweep still finds them.
_HASH_IF_SET = {"model.decay": None, "model.window": None, "model.layers": None, "model.attn_every": None,
                "trainer.intervene": False, "trainer.ablate": False,
                "task.key_regime": "shared", "task.num_keys": None,
                "model.favor_signs": "positive", "model.favor_per_dim": None, "trainer.init_jitter": 0.0}
# Keys that matter only beside another: a hybrid's attention slot only where model.attn_every
# places one; the ablation's settings only in mode=ablate or a run that ablates itself at its end
# (trainer.ablate), the intervention's only in mode=intervene (a training run computes nothing of them).
_HASH_ONLY_WITH = {"model.attn": lambda flat: flat.get("model.attn_every") is not None,
                   "ablate.": lambda flat: flat.get("mode") == "ablate" or flat.get("trainer.ablate") is True,
                   "intervene.": lambda flat: flat.get("mode") == "intervene"}


def flat_config(cfg: DictConfig | dict) -> dict[str, Any]:
    """{'model.d_model': 64, ...}: flat, so wandb sweep parameters cannot clobber a subtree. A
    built-in mixer's options read as the model.* keys they were before mixers owned them
    (harness.layers.options.legacy_flat), so every recorded config and hash keeps its form."""
    tree = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
    out: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            out[prefix[:-1]] = node

    walk({k: v for k, v in tree.items() if k != "hydra"}, "")
    model = tree.get("model")
    if not (isinstance(model, dict) and "options" in model):
        return out  # a recorded form (flat, or nested from one): its keys are kept as they are
    return legacy_flat(out, builtin=not is_dotted(out.get("model.name")))


def hashed_items(flat: dict[str, Any]) -> dict[str, Any]:
    """The flat config entries that say what a run computes (those the hash covers)."""
    def applies(key: str) -> bool:
        return all(when(flat) for prefix, when in _HASH_ONLY_WITH.items() if key == prefix or key.startswith(prefix))

    return {k: v for k, v in flat.items()
            if not any(k == e or k.startswith(e) for e in _HASH_EXCLUDE)
            and not (k in _HASH_IF_SET and at_default(v, _HASH_IF_SET[k])) and applies(k)}


def _as_recorded(value: Any) -> Any:
    """A value as results.json keeps it (JSON has no NaN or infinity: they are written as null),
    so a config hashes the same before it is written and after it is read back."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _as_recorded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_recorded(v) for v in value]
    return value


def flat_hash(flat: dict[str, Any]) -> str:
    """The hash of a flat config (its hashed_items)."""
    blob = json.dumps(_as_recorded(hashed_items(flat)), sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def config_hash(cfg: DictConfig | dict) -> str:
    return flat_hash(flat_config(cfg))


def config_differences(saved: dict[str, Any], now: dict[str, Any], limit: int = 3) -> str:
    """The keys whose values differ between two flat configs, as `key: saved -> now, ...`."""
    keys = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
    listed = ", ".join(f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in keys[:limit])
    return listed + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def identify(cfg: DictConfig | dict) -> tuple[dict[str, Any], str]:
    """cfg's flat form and hash (what a run's plan holds: harness.config.plan)."""
    flat = flat_config(cfg)
    return flat, flat_hash(flat)
