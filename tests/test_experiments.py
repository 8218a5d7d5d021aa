"""Every built-in mixer is in every experiment of both profiles, unless the experiment excludes it
with its reason.

An experiment file sweeps `model: ${mixers:${sweep.exclude}}` (harness.config.mixers), optionally
followed by variant files of harness/conf/model (`,deltanet_additive`): the resolver expands to
every registered built-in but those named in `sweep.exclude` ({mixer: reason}; a paper file
inherits its quick file's). The checks run on the grid as Hydra composes it, so what they see is
what `python -m harness -m +experiment=<name>` runs.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.conf import CONF_DIR
from harness.config.compose import compose_experiment, experiment_grid
from harness.config.mixers import model_choices
from harness.layers.registry import builtin_names

EXPERIMENTS = CONF_DIR / "experiment"
MODELS = CONF_DIR / "model"
PROFILES = {"quick": EXPERIMENTS, "paper": EXPERIMENTS / "paper"}


def _files(profile: str) -> list[Path]:
    return sorted(PROFILES[profile].glob("*.yaml"))


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def _name(profile: str, stem: str) -> str:
    return stem if profile == "quick" else f"{profile}/{stem}"


def mixer_of(choice: str) -> str:
    """The built-in mixer a model choice names (following a variant file's defaults)."""
    path = MODELS / f"{choice}.yaml"
    assert path.exists(), f"model choice {choice!r} has no file {path}"
    data = _load(path)
    if "name" in data:
        return data["name"]
    bases = [d for d in data.get("defaults") or [] if isinstance(d, str) and d != "model_schema"]
    assert bases, f"{path} names no mixer and extends none"
    return mixer_of(bases[0])


CASES = [(profile, path) for profile in PROFILES for path in _files(profile)]


def test_every_experiment_is_checked():
    assert {p.stem for p in _files("quick")} == {p.stem for p in _files("paper")}
    assert len(CASES) >= 20


@pytest.mark.parametrize("profile,path", CASES, ids=[f"{p}/{f.stem}" for p, f in CASES])
def test_every_builtin_not_excluded_is_swept(profile, path):
    name = _name(profile, path.stem)
    excluded = dict(compose_experiment(name).sweep.exclude)
    choices = experiment_grid(name)["model"]
    swept = {mixer_of(choice) for choice in choices}
    assert swept == set(builtin_names()) - set(excluded), f"{name}: sweeps {sorted(swept)}, excludes {excluded}"
    assert len(choices) == len(set(choices)), f"{name}: a model choice swept twice: {choices}"
    # the list comes from the registry, never written out: a new built-in needs no edit here
    own = ((_load(path).get("hydra") or {}).get("sweeper") or {}).get("params") or {}
    assert "model" not in own or str(own["model"]).startswith("${mixers:${sweep.exclude}}"), path


def test_an_exclusion_names_a_builtin_and_gives_its_reason():
    assert "swa" not in model_choices({"swa": "its window covers the whole task"})
    assert model_choices() == builtin_names()
    with pytest.raises(ValueError, match="names no built-in mixer: nosuch"):
        model_choices({"nosuch": "a reason"})
    with pytest.raises(ValueError, match="give the reason each mixer cannot run here: swa"):
        model_choices({"swa": " "})


def test_cost_excludes_the_window_with_its_reason():
    for profile in PROFILES:
        excluded = compose_experiment(_name(profile, "cost")).sweep.exclude
        assert set(excluded) == {"swa"} and "harness.bench" in excluded["swa"]


@pytest.mark.parametrize("name", ["capacity", "forgetting", "frontier"])
@pytest.mark.parametrize("profile", list(PROFILES))
def test_the_delta_rule_control_runs_where_it_is_asked(profile, name):
    choices = experiment_grid(_name(profile, name))["model"]
    assert "deltanet_additive" in choices and _load(MODELS / "deltanet_additive.yaml")["rule"] == "additive"


def test_paper_capacity_has_the_anchor_variants():
    choices = experiment_grid("paper/capacity")["model"]
    nus = {_load(MODELS / f"{c}.yaml").get("dpfp_nu", 1) for c in choices if mixer_of(c) == "dpfp"}
    features = {_load(MODELS / f"{c}.yaml").get("favor_features") for c in choices if mixer_of(c) == "favor"}
    assert nus == {1, 2, 3} and {64, 128, 512} <= features
