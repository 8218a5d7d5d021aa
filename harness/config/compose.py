"""Composing a run's config with Hydra's compose API, every failure as one readable line.

Hydra reports composition errors over several lines and a stack-trace hint. A researcher who
misspelled `trainer.lr` wants one line that names the valid options, and wants it before a
model is built: `compose_config` composes exactly what a run would see, turns any error into a
ConfigError (a ValueError whose message is one line) and validates the result (unless the
caller prepares it: harness.config.plan).
"""
from __future__ import annotations

import re

from harness.conf import CONF_DIR  # harness/conf, shipped with the package

GROUPS = ("task", "model", "trainer", "logger", "experiment")


class ConfigError(ValueError):
    """A configuration the harness refuses to run; its message is one readable line."""


def group_options(group: str) -> list[str]:
    root = CONF_DIR / group
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))


def _one_line_compose_error(exc: BaseException, overrides: list[str]) -> str:
    text = str(exc)
    missing = re.search(r"Could not find '([\w/]+?)/([^']+)'", text)
    if missing:
        group, choice = missing.group(1), missing.group(2)
        if group in GROUPS:
            return f"unknown {group} '{choice}'; valid: {', '.join(group_options(group))}"
    bad = re.search(r"Could not override '([^']+)'", text) or re.search(
        r"Could not append to config\. An item is already at '([^']+)'", text
    )
    cause = exc.__cause__
    while cause is not None and cause.__cause__ is not None and "Error merging" in str(cause):
        cause = cause.__cause__
    detail = str(cause).splitlines()[0] if cause is not None else ""
    merging = re.search(r"Error merging override ([^=\s]+)=", text + " " + str(exc.__cause__ or ""))
    if not bad and merging:
        bad = merging
    if bad:
        key = bad.group(1)
        if "not in" in detail or "Key '" in detail and "not in" in text:
            return f"unknown key '{key}'; valid keys here: {', '.join(_sibling_keys(key, overrides))}"
        if "is not a ListConfig" in detail:  # a scalar where the schema has a list
            given = next((o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+") == key), "?")
            return f"bad value for '{key}': must be a list in brackets, e.g. {key}=[{given}], got {given}"
        return f"bad value for '{key}': {_readable_type_error(detail) or text.splitlines()[0]}"
    if "not in" in text and "Key '" in text:
        key = re.search(r"full_key: (\S+)", text)
        return f"unknown key '{key.group(1) if key else '?'}'"
    return text.strip().splitlines()[0]


# OmegaConf's wording of a value its node type refuses, and the words a user reads instead.
_TYPE_ERROR = re.compile(r"Value '(.*)' (?:of type '\w+' could not be converted to (\w+)"
                         r"|is not a valid (bool))")
_TYPE_WORDS = {"Integer": "an integer", "Float": "a number", "bool": "true or false"}


def _readable_type_error(detail: str) -> str:
    """OmegaConf's "Value 'abc' of type 'str' could not be converted to Integer" as
    "must be an integer, got 'abc'"; any other detail unchanged."""
    match = _TYPE_ERROR.match(detail)
    if not match:
        return detail
    wanted = match.group(2) or match.group(3)
    return f"must be {_TYPE_WORDS.get(wanted, wanted)}, got '{match.group(1)}'"


def _sibling_keys(key: str, overrides: list[str]) -> list[str]:
    """Valid keys beside a misspelled one, from the config composed without it."""
    from hydra import compose
    from omegaconf import DictConfig

    # compose_config has initialised Hydra for this process; a second initialize would raise.
    rest = [o for o in overrides if not o.split("=", 1)[0].lstrip("+~").startswith(key)]
    try:
        cfg = compose(config_name="config", overrides=rest)
    except Exception:
        return []
    node = cfg
    for part in key.split(".")[:-1]:
        node = node.get(part) if isinstance(node, DictConfig) else None
        if node is None:
            return []
    return sorted(node.keys()) if isinstance(node, DictConfig) else []


def rewrite_overrides(overrides: list[str]) -> list[str]:
    """Overrides as Hydra composes them. An outside task is a group choice:
    `task.name=package.module` becomes `task=package.module`, and every such module is
    registered as a choice of the task group (its own Config is then the schema of `task.*`); a
    module that is not a task is a ConfigError. A mixer setting by its old key
    (`model.window=16`) becomes the option it is now (`model.options.window=16`)."""
    from harness.config.schema import register_task
    from harness.layers.options import rewrite_override
    from harness.tasks import get_task, is_outside

    out = []
    for item in overrides:
        item = rewrite_override(item)
        key, eq, value = item.partition("=")
        if eq and key.lstrip("+") in ("task", "task.name") and any(is_outside(v) for v in value.split(",")):
            for name in value.split(","):
                if is_outside(name):
                    try:
                        get_task(name)
                    except ValueError as exc:
                        raise ConfigError(str(exc)) from None
                    register_task(name)
            item = f"task={value}"
        out.append(item)
    return out


def compose_config(overrides: list[str], validate: bool = True):
    """Compose (and validate) the config for `overrides` exactly as a run would see it.
    validate=False: composed only, for a caller that prepares it (harness.config.plan.prepare
    validates it once, with the rest of the run's plan)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from harness.config.schema import register
    from harness.config.validate import validate_config

    register()
    overrides = rewrite_overrides(overrides)
    if not GlobalHydra.instance().is_initialized():
        # Initialised once per process and kept: composing many configs (a sweep file's
        # commands, a notebook) then costs milliseconds each.
        initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3")
    try:
        cfg = compose(config_name="config", overrides=overrides)
    except Exception as exc:  # Hydra and OmegaConf raise several types; all become one line
        raise ConfigError(_one_line_compose_error(exc, overrides)) from exc
    if validate:
        validate_config(cfg)
    return cfg


def compose_experiment(name: str, overrides=()):
    """The experiment file `name` ("mqar", "paper/mqar") composed with Hydra's own config
    (return_hydra_config): what a multirun of it would see, its sweeper's grid included."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from harness.config.schema import register

    register()
    if not GlobalHydra.instance().is_initialized():
        initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3")
    return compose(config_name="config", overrides=[f"+experiment={name}", *overrides], return_hydra_config=True)


def experiment_grid(name: str) -> dict[str, list[str]]:
    """The grid of the experiment file `name`: each swept key and its values, as the sweeper reads them."""
    params = compose_experiment(name).hydra.sweeper.params or {}
    return {str(k): sweep_values(str(k), str(v)) for k, v in params.items()}


def sweep_values(key: str, value: str) -> list[str]:
    """One sweeper parameter's values as override strings: a plain list as written ("1e-3,3e-3"
    stays so, as result folders name it); choice(), range() and list values ("choice([a,b],[c])")
    through Hydra's own override grammar, which knows where a value ends."""
    if not any(c in value for c in "([{"):
        return [v.strip() for v in value.split(",")]
    from hydra.core.override_parser.overrides_parser import OverridesParser

    override = OverridesParser.create().parse_override(f"{key}={value}")
    if override.is_sweep_override():
        return list(override.sweep_string_iterator())
    return [override.get_value_element_as_str()]

