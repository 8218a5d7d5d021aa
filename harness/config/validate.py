"""Semantic checks on a composed config: the errors Hydra's types cannot express.

Every key a user can set is checked here (or, for `model.*` and `task.*`, by the model's and
the task's own validate) before any data is generated or model built. Each check raises
ValueError with one readable line naming the key, the value and what is allowed.
"""
from __future__ import annotations

import dataclasses
import re
from functools import partial
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from harness import checks
from harness.config.schema import (ABLATIONS, CORRUPTIONS, MODES, Config, CostConfig, LoggerConfig, ProbeConfig,
                                   SweepConfig, TrainerConfig, task_schema)
from harness.config.build import model_config, task_config
from harness.layers.preflight import run_lengths
from harness.ops.cores import CORE_FORMS
from harness.model import ModelConfig
from harness.model import Stack, check_mixers, is_hybrid, stack_of
from harness.model import validate as validate_model
from harness.ops.common.guards import FORMS

PRECISIONS = ("fp32", "bf16")
LOGGERS = ("wandb", "none")
WANDB_MODES = ("offline", "online", "disabled")
# wandb refuses these characters in a project name, and longer names or tags, but only at init.
WANDB_FORBIDDEN = "/\\#?%:"
WANDB_NAME_LEN, WANDB_TAG_LEN = 128, 64
SEED_MAX = 2**63 - 1  # torch.manual_seed and the task streams take a signed 64-bit seed


def _fields(schema: type) -> set[str]:
    return {f.name for f in dataclasses.fields(schema)}


def _check_keys(c: dict) -> None:
    """Exactly the schemas' keys, and every group chosen (the top level first: it has every group)."""
    task = c.get("task")
    task_fields = _fields(task_schema(task["name"])) if isinstance(task, dict) and "name" in task else set()
    schemas = {"": _fields(Config), "task": task_fields, "model": _fields(ModelConfig),
               "trainer": _fields(TrainerConfig), "logger": _fields(LoggerConfig), "probe": _fields(ProbeConfig),
               "cost": _fields(CostConfig), "sweep": _fields(SweepConfig)}
    for section, fields in schemas.items():
        checks.schema_keys(f"{section}." if section else "", c[section] if section else c, fields)


def _device_spelling(key: str, spec: object) -> None:
    if not (isinstance(spec, str) and re.fullmatch(r"auto|cpu|cuda(:[0-9]+)?", spec)):
        checks.fail(key, "auto, cpu, cuda or cuda:N", spec)


def _tags(key: str, tags: object) -> None:
    if not isinstance(tags, list):
        checks.fail(key, "a list of strings", tags)
    for tag in tags:
        checks.text(f"{key} entry", tag, max_len=WANDB_TAG_LEN)


def _ints(section: str, *names: str) -> tuple[tuple[str, Any], ...]:
    return tuple((f"{section}.{name}", checks.integer) for name in names)


# Every key outside model.* and task.* (those the model's and the task's own validate check) with
# its rule (harness.checks), in the order a config is read. trainer.resume is not here: only
# reading its run directory tells if it resumes (harness.outputs.rundir).
RULES: tuple[tuple[str, Any], ...] = (
    ("mode", partial(checks.choice, valid=MODES)),
    ("seed", partial(checks.integer, minimum=0, maximum=SEED_MAX)),
    *_ints("trainer", "max_steps", "batch_size", "eval_every", "eval_examples", "eval_tokens", "data_chunk",
           "log_every", "measure_examples"),
    ("trainer.warmup_steps", partial(checks.integer, minimum=0)),
    ("trainer.threads", partial(checks.integer, nullable=True)),
    ("trainer.ckpt_every", partial(checks.integer, nullable=True)),
    ("trainer.lr", partial(checks.number, interval="(0, inf)")),
    ("trainer.weight_decay", partial(checks.number, interval="[0, inf)")),
    ("trainer.min_lr_ratio", partial(checks.number, interval="[0, 1]")),
    ("trainer.grad_clip", partial(checks.number, interval="[0, inf)")),  # 0 turns clipping off
    ("trainer.target_accuracy", partial(checks.number, interval="(0, 1]", nullable=True)),
    ("trainer.patience", partial(checks.integer, nullable=True)),
    ("trainer.min_delta", partial(checks.number, interval="[0, inf)")),
    ("trainer.min_steps", partial(checks.integer, minimum=0)),
    ("trainer.init_jitter", partial(checks.number, interval="[0, 1)")),
    *((f"trainer.{key}", checks.boolean) for key in ("compile", "progress", "checkpoint", "measure", "intervene",
                                                      "ablate")),
    ("trainer.precision", partial(checks.choice, valid=PRECISIONS)),
    ("trainer.device", _device_spelling),
    ("logger.name", partial(checks.choice, valid=LOGGERS)),
    ("logger.mode", partial(checks.choice, valid=WANDB_MODES)),
    ("logger.project", partial(checks.text, max_len=WANDB_NAME_LEN, forbidden=WANDB_FORBIDDEN)),
    ("logger.entity", partial(checks.text, nullable=True)),
    ("logger.group", partial(checks.text, max_len=WANDB_NAME_LEN, nullable=True)),
    ("logger.tags", _tags),
    # The probe's read-out needs two sizes and two candidates to compare (harness.measure.probe.probe_row).
    ("probe.d", partial(checks.int_list, minimum=2)),
    ("probe.n", partial(checks.int_list, minimum=2, nullable=True)),
    ("probe.candidates", partial(checks.integer, minimum=2)),
    ("probe.max_queries", checks.integer),
    ("probe.seed", partial(checks.integer, minimum=0, maximum=SEED_MAX)),
    ("cost.seq_lens", checks.int_list),
    ("cost.forms", partial(checks.choice_list, valid=FORMS)),
    *_ints("cost", "batch_size", "n_heads", "head_dim", "repeats", "recurrent_max_len"),
    ("intervene.examples", checks.integer),
    ("intervene.seed", partial(checks.integer, minimum=0, maximum=SEED_MAX)),
    ("intervene.trust_code", checks.boolean),
    # mode=ablate, and a run's own ablation at its end (trainer.ablate)
    ("ablate.examples", partial(checks.integer, minimum=2)),  # resampling takes another example's output
    ("ablate.kinds", partial(checks.choice_list, valid=ABLATIONS)),
    ("ablate.corrupt", partial(checks.choice_list, valid=CORRUPTIONS)),
    ("ablate.path_corrupt", partial(checks.choice_list, valid=CORRUPTIONS, empty=True)),
    ("ablate.patch", checks.boolean),
    ("sweep.skip_completed", checks.boolean),
    ("sweep.fail_on_error", checks.boolean),
)


def mixer_core(cfg: DictConfig) -> tuple[str, int]:
    """(harness.ops core, key dimension) of cfg's mixer at the cost geometry (cost.n_heads heads
    of cost.head_dim; model.qk_dim kept), read off a mixer built for it; ValueError if it
    declares no core."""
    from dataclasses import replace

    from harness.layers import build

    mcfg = replace(model_config(cfg.model), d_model=cfg.cost.n_heads * cfg.cost.head_dim,
                   n_heads=cfg.cost.n_heads)
    mixer = build(mcfg, 0)
    core, d_key = getattr(mixer, "core", None), getattr(mixer, "d_key", None)
    checks.require(core in CORE_FORMS and d_key is not None,
                   f"mode=cost: model.name={cfg.model.name} declares no core of harness.ops "
                   f"({', '.join(CORE_FORMS)}) and key dimension (core, d_key); mode=cost times those")
    return core, int(d_key)


def _check_cost_family(cfg: DictConfig) -> tuple[str, int]:
    """mode=cost times only the forms the model's family has (softmax has no chunk form);
    returns mixer_core's (family, key dimension)."""

    family, d_key = mixer_core(cfg)
    forms = list(cfg.cost.forms)
    checks.require(any(f in CORE_FORMS[family] for f in forms),
                   f"cost.forms={forms} has no form of model={cfg.model.name} "
                   f"(the {family} family has {', '.join(CORE_FORMS[family])})")
    return family, d_key


def resolved(cfg: DictConfig) -> dict:
    """cfg as plain containers with every interpolation resolved; an interpolation that does not
    resolve (`${nope}`, `${oc.env:HOME}` in an integer) is a ValueError of one line naming the key."""
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "?"
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"bad value for '{key}': {detail}") from None


def _check_positions_extrapolate(mcfg: ModelConfig, stack: Stack, module, tcfg) -> None:
    """Learned absolute positions have no embedding past the training length: evaluating
    longer sequences is refused (rotary, or no positions with the short convolution, extrapolate)."""
    from harness.model import label
    from harness.tasks import train_length

    if not stack.learned_positions:
        return
    trained, longest = train_length(module, tcfg), module.max_seq_len(tcfg)
    what = f"the stack {label(mcfg)} (model.layers)" if is_hybrid(mcfg) else f"model={mcfg.name}"
    checks.require(longest <= trained,
                   f"{what} has learned absolute positions, trained at length {trained}: "
                   f"they cannot be evaluated at length {longest} (task.test_seq_len); for length "
                   f"experiments set model.rotary=true model.pos_emb=none, or model.pos_emb=none "
                   f"(no positions, with the short convolution)")


@dataclasses.dataclass(frozen=True)
class Checked:
    """What validation built on its way, so that no one builds it again: the ModelConfig, the
    task module and its Config, the device, and (mode=cost) the mixer's core and key dimension."""
    mcfg: ModelConfig
    module: Any
    tcfg: Any
    device: Any
    core: Optional[tuple[str, int]] = None


def validate_config(cfg: DictConfig) -> Checked:
    """Every check of every key (ValueError, one line, at the first that fails); what it built."""
    c = resolved(cfg)  # plain values: lists, not ListConfigs
    c.pop("hydra", None)
    return _validate(c, cfg)


def _validate(c: dict, cfg: DictConfig) -> Checked:
    from harness.devices import select_device

    _check_keys(c)
    for key, rule in RULES:
        section, _, name = key.rpartition(".")
        rule(key, c[section][name] if section else c[name])
    device = select_device(c["trainer"]["device"])  # a CUDA device asked for must be there

    mcfg = model_config(cfg.model)
    validate_model(mcfg)
    stack = stack_of(mcfg)
    checks.require(c["mode"] not in ("cost", "probe") or not is_hybrid(mcfg),
                   f"mode={c['mode']} measures one mixer; model.layers / model.attn_every describe a stack: "
                   "give one slot's mixer as model.name")
    module, tcfg = task_config(cfg.task)
    module.validate(tcfg)
    for setting in module.eval_settings(tcfg):
        module.validate(setting)
    check_mixers(stack, run_lengths(module, tcfg))  # the pre-flight at every length the run uses
    core = None
    if c["mode"] == "train":
        _check_positions_extrapolate(mcfg, stack, module, tcfg)
    if c["mode"] == "cost":
        core = _check_cost_family(cfg)
    if c["mode"] == "probe":
        checks.require(getattr(stack.mixers[0], "probe_memory", None) is not None,
                       f"probe: model {mcfg.name!r} declares no probe_memory(d, seed) "
                       "(harness.layers.protocol), so the probe cannot write random pairs into it")
    return Checked(mcfg, module, tcfg, device, core)
