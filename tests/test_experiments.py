"""Every built-in mixer is in every experiment of both profiles, or listed as inapplicable there
with its reason.

An experiment file names its mixers in hydra.sweeper.params.model (a paper file inherits its
quick file's list unless it sets its own); an entry is a file of harness/conf/model, whose mixer
is its `name` (a variant file such as deltanet_additive names its base through its defaults).
A mixer an experiment cannot run is listed in a comment line of the file:

    # inapplicable: <mixer>: <reason>; <mixer>: <reason>
    # inapplicable: (none)

and the test fails for a built-in that is neither swept nor listed, for a listed name that is
no built-in, and for a listing without a reason.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from harness.config.compose import CONF_DIR
from harness.layers.registry import builtin_names

EXPERIMENTS = CONF_DIR / "experiment"
MODELS = CONF_DIR / "model"
PROFILES = {"quick": EXPERIMENTS, "paper": EXPERIMENTS / "paper"}


def _files(profile: str) -> list[Path]:
    return sorted(PROFILES[profile].glob("*.yaml"))


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def _parent(path: Path) -> Path | None:
    """The experiment file a paper file extends (its `- /experiment/<name>` default)."""
    for entry in _load(path).get("defaults") or []:
        if isinstance(entry, str) and entry.startswith("/experiment/"):
            return EXPERIMENTS / f"{entry[len('/experiment/'):]}.yaml"
    return None


def swept_models(path: Path) -> list[str]:
    """The `model` choices the file sweeps (its own, else its parent's)."""
    params = (((_load(path).get("hydra") or {}).get("sweeper") or {}).get("params") or {})
    if "model" in params:
        return [m.strip() for m in str(params["model"]).split(",") if m.strip()]
    parent = _parent(path)
    return swept_models(parent) if parent else []


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


def inapplicable(path: Path) -> dict[str, str]:
    """{mixer: reason} from the file's `# inapplicable:` lines (and its parent's)."""
    found = {}
    parent = _parent(path)
    if parent:
        found.update(inapplicable(parent))
    for line in path.read_text().splitlines():
        match = re.match(r"\s*#\s*inapplicable:\s*(.*)$", line)
        if not match or match.group(1).strip() == "(none)":
            continue
        for item in match.group(1).split(";"):
            name, _, reason = item.partition(":")
            found[name.strip()] = reason.strip()
    return found


CASES = [(profile, path) for profile in PROFILES for path in _files(profile)]


def test_every_experiment_is_checked():
    assert {p.stem for p in _files("quick")} == {p.stem for p in _files("paper")}
    assert len(CASES) >= 20


@pytest.mark.parametrize("profile,path", CASES, ids=[f"{p}/{f.stem}" for p, f in CASES])
def test_mixer_list_is_complete(profile, path):
    builtins = set(builtin_names())
    swept = {mixer_of(choice) for choice in swept_models(path)}
    excused = inapplicable(path)
    assert set(excused) <= builtins, f"{path.name}: inapplicable names no built-in: {set(excused) - builtins}"
    assert all(excused.values()), f"{path.name}: an inapplicable mixer without its reason: {excused}"
    assert not swept & set(excused), f"{path.name}: swept and listed inapplicable: {swept & set(excused)}"
    missing = builtins - swept - set(excused)
    assert not missing, (f"{profile} experiment {path.stem} lacks {sorted(missing)}: sweep them or list them as "
                         "'# inapplicable: <mixer>: <reason>'")
    assert swept - builtins == set(), f"{path.name}: sweeps a mixer that is no built-in: {swept - builtins}"


def test_the_check_fails_for_a_missing_mixer(tmp_path):
    """The check reads what it claims: a file without gated_deltanet, unexcused, is incomplete."""
    path = tmp_path / "x.yaml"
    path.write_text("hydra:\n  sweeper:\n    params:\n      model: softmax,deltanet_additive\n"
                    "# inapplicable: swa: needs a window longer than the task\n")
    swept = {mixer_of(c) for c in swept_models(path)}
    assert swept == {"softmax", "deltanet"}
    assert inapplicable(path) == {"swa": "needs a window longer than the task"}
    assert "gated_deltanet" in set(builtin_names()) - swept - set(inapplicable(path))


@pytest.mark.parametrize("name", ["reassignment", "forgetting", "frontier"])
@pytest.mark.parametrize("profile", list(PROFILES))
def test_the_delta_rule_control_runs_where_it_is_asked(profile, name):
    choices = swept_models(PROFILES[profile] / f"{name}.yaml")
    assert "deltanet_additive" in choices and _load(MODELS / "deltanet_additive.yaml")["rule"] == "additive"


def test_paper_capacity_has_the_anchor_variants():
    choices = swept_models(PROFILES["paper"] / "capacity.yaml")
    nus = {_load(MODELS / f"{c}.yaml").get("dpfp_nu", 1) for c in choices if mixer_of(c) == "dpfp"}
    features = {_load(MODELS / f"{c}.yaml").get("favor_features") for c in choices if mixer_of(c) == "favor"}
    assert nus == {1, 2, 3} and {64, 128, 512} <= features

