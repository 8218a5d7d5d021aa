"""Every experiment chooses its mixers from the registry: every built-in, those of a nature, or a
chosen few with the reason, never a list written out.

An experiment file sweeps `model: ${mixers:}` (harness.config.mixers), `${mixers:{where: {family:
delta}}}` for those whose class declares it, `${mixers:{only: [...], why: '...'}}` for a chosen
few, or `${mixers:{<mixer>: '<reason>'}}` to exclude one, optionally followed by variant files of
harness/conf/model (`,deltanet_additive`): the resolver expands to the registered built-ins it
selects (a paper file inherits its quick file's line unless it sets its own). The checks run on the grid as Hydra composes it, so what they see is
what `python -m harness -m +experiment=<name>` runs.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from harness.conf import CONF_DIR
from harness.config.compose import compose_experiment, experiment_grid
from harness.config.mixers import SELECTORS, model_choices
from harness.layers.registry import builtin_names

EXPERIMENTS = CONF_DIR / "experiment"
MODELS = CONF_DIR / "model"
PROFILES = {"quick": EXPERIMENTS, "paper": EXPERIMENTS / "paper", "findings": EXPERIMENTS / "findings"}
FULL_PROFILES = ("quick", "paper")  # each holds every experiment


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
    assert _files("findings")  # the designs the quick hour cannot hold: only the figures that need them
    assert len(CASES) >= 20


def _model_line(name: str) -> str:
    """The experiment's `model` sweep value as written (composed, not resolved)."""
    params = compose_experiment(name).hydra.sweeper.params
    return str(OmegaConf.to_container(params, resolve=False)["model"])


def _stacks(name: str) -> list[list[str]] | None:
    """The stacks an experiment sweeps over `model.layers` instead of `model` (hybrid, anatomy),
    each a list of mixer names; None for an experiment that sweeps `model`."""
    params = OmegaConf.to_container(compose_experiment(name).hydra.sweeper.params, resolve=False)
    if "model" in params or "model.layers" not in params:
        return None
    from hydra.core.override_parser.overrides_parser import OverridesParser

    override = OverridesParser.create().parse_override(f"model.layers={params['model.layers']}")
    # a slot is a mixer's name, or a mapping that names it and sets its own keys
    return [[slot["name"] if isinstance(slot, dict) else slot for slot in stack] for stack in override.sweep_iterator()]


@pytest.mark.parametrize("profile,path", CASES, ids=[f"{p}/{f.stem}" for p, f in CASES])
def test_every_builtin_not_excluded_is_swept(profile, path):
    name = _name(profile, path.stem)
    stacks = _stacks(name)
    if stacks is not None:
        # Exempt: its variable is the stack (which mixers, in which slots), chosen for the question
        # it answers, not the mixer; every slot of every stack is still a registered built-in.
        assert stacks and all(set(s) <= set(builtin_names()) for s in stacks), stacks
        return
    line = _model_line(name)
    composed = compose_experiment(name)
    if composed.mode == "train" and composed.trainer.patience is None:
        # a budget check (no plateau stop: tests/test_sweeps.py) of named mixers' cells of another
        # experiment (findings/mechanism_budget), not a comparison of mixers: its header says
        # which cells and why
        assert set(line.split(",")) <= set(builtin_names()), line
        return
    # the list comes from the registry, never written out: a new built-in needs no edit here
    assert line.startswith("${mixers:"), f"{name}: model is {line!r}, not the registry's mixers"
    choices = experiment_grid(name)["model"]
    swept = {mixer_of(choice) for choice in choices}
    assert swept <= set(builtin_names()) and len(choices) == len(set(choices)), choices
    if line.startswith("${mixers:}"):  # no exclusion: every built-in
        assert swept == set(builtin_names()), f"{name}: sweeps {sorted(swept)}"


def test_an_exclusion_names_a_builtin_and_gives_its_reason():
    assert "swa" not in model_choices({"swa": "its window covers the whole task"})
    assert model_choices() == builtin_names()
    with pytest.raises(ValueError, match="names no built-in mixer: nosuch"):
        model_choices({"nosuch": "a reason"})
    with pytest.raises(ValueError, match="give the reason each mixer cannot run here: swa"):
        model_choices({"swa": " "})


def test_a_selection_by_nature_reads_what_each_class_declares():
    from harness.layers.registry import resolve

    delta = model_choices({"where": {"family": "delta"}})
    assert delta and delta == [n for n in builtin_names() if resolve(n).family == "delta"]
    both = model_choices({"where": {"family": ["softmax", "delta"]}})
    assert set(both) == {n for n in builtin_names() if resolve(n).family in ("softmax", "delta")} > set(delta)
    assert model_choices({"where": {"memory_kind": "kv_cache"}}) == [
        n for n in builtin_names() if resolve(n).memory_kind == "kv_cache"]
    gated = model_choices({"where": {"tags": "gated"}})
    assert gated and all("gated" in resolve(n).tags for n in gated)
    assert set(builtin_names()) - set(gated) == {n for n in builtin_names() if "gated" not in resolve(n).tags}
    # where, then the exclusions: the same order as the registry's
    assert model_choices({"where": {"family": "delta"}, delta[0]: "a reason"}) == delta[1:]
    with pytest.raises(ValueError, match="no built-in mixer declares colour"):
        model_choices({"where": {"colour": "blue"}})
    with pytest.raises(ValueError, match="keeps no built-in mixer"):
        model_choices({"where": {"family": "no such family"}})


def test_a_chosen_few_name_builtins_and_say_why():
    assert model_choices({"only": ["softmax", "elu"], "why": "one per family"}) == sorted(["softmax", "elu"])
    with pytest.raises(ValueError, match="say why these mixers"):
        model_choices({"only": ["softmax"]})
    with pytest.raises(ValueError, match="names no built-in mixer: nosuch"):
        model_choices({"only": ["nosuch"], "why": "x"})


def test_the_experiments_name_few_mixers_to_leave_out():
    # choosing by nature or naming a chosen few, not excluding the rest one name at a time
    # (there were 38 such exclusions across six files)
    if not OmegaConf.has_resolver("selection_of"):
        OmegaConf.register_new_resolver("selection_of", lambda select=None: "<" + " ".join(select or {}) + ">")
    excluded, files = 0, 0
    for profile in PROFILES:
        for path in _files(profile):
            params = (_load(path).get("hydra") or {}).get("sweeper", {}).get("params", {})
            line = str(params.get("model", ""))
            if line.startswith("${mixers:"):
                files += 1
                keys = OmegaConf.create({"m": line.replace("${mixers:", "${selection_of:", 1)}).m
                excluded += len(set(keys[keys.index("<") + 1:keys.index(">")].split()) - set(SELECTORS))
    assert files >= 25 and 1 <= excluded <= 2, (files, excluded)  # 1 now: cost leaves swa out (no bench case)


def test_cost_excludes_the_window_with_its_reason():
    for profile in FULL_PROFILES:
        name = _name(profile, "cost")
        assert "swa" not in experiment_grid(name)["model"]
        assert "{swa: 'mode=cost times the cores of harness.ops" in _model_line(name)
        assert "harness.bench has no case" in _model_line(name)


@pytest.mark.parametrize("name", ["reassignment", "forgetting", "frontier"])
@pytest.mark.parametrize("profile", FULL_PROFILES)
def test_the_delta_rule_control_runs_where_it_is_asked(profile, name):
    choices = experiment_grid(_name(profile, name))["model"]
    assert "deltanet_additive" in choices and _load(MODELS / "deltanet_additive.yaml")["options"]["rule"] == "additive"


def test_paper_capacity_has_the_anchor_variants():
    choices = experiment_grid("paper/capacity")["model"]
    nus = {(_load(MODELS / f"{c}.yaml").get("options") or {}).get("dpfp_nu", 1) for c in choices if mixer_of(c) == "dpfp"}
    # Schlag et al.'s FAVOR+ counted as they count it: 64, 128 and 512 projections at d = 64 (1, 2
    # and 8 per key dimension), a + and a - feature each
    favor = [_load(MODELS / f"{c}.yaml").get("options") or {} for c in choices if mixer_of(c) == "favor"]
    assert nus == {1, 2, 3} and {1, 2, 8} <= {f.get("favor_per_dim") for f in favor if f.get("favor_signs") == "both"}


def test_the_findings_designs_of_the_anatomy_and_hybrid_figures():
    """The five-seed designs behind anatomy.png and hybrid.png (issue 38): at least 4 heads per
    layer with an arm without the short convolution; 0, 1 at each position, 2 and 4 attention
    layers of 4 for three recurrent mixers, one of them with neither gate nor decay; in distribution."""
    from harness.layers.registry import resolve

    anatomy = experiment_grid("findings/anatomy")
    assert anatomy["seed"] == ["0", "1", "2", "3", "4"] and set(anatomy["model.short_conv"]) == {"true", "false"}
    composed = compose_experiment("findings/anatomy")
    assert composed.model.n_heads >= 4 and composed.trainer.ablate
    assert {"ga_necessity", "ga_restore", "ga_attention"} <= set(composed.analysis)
    stacks = _stacks("findings/hybrid")
    assert len(stacks) * 5 == 95 and experiment_grid("findings/hybrid")["seed"] == ["0", "1", "2", "3", "4"]
    recurrent = {s for stack in stacks for s in stack} - {"softmax"}
    assert len(recurrent) == 3 and any(not resolve(m).has_decay and resolve(m).family == "linear" for m in recurrent)
    for mixer in recurrent:
        mine = [tuple(s == "softmax" for s in stack) for stack in stacks if mixer in stack]
        ones = {flags.index(True) for flags in mine if sum(flags) == 1}
        assert ones == {0, 1, 2, 3} and {sum(flags) for flags in mine} == {0, 1, 2}
    assert ["softmax"] * 4 in stacks
    hybrid = compose_experiment("findings/hybrid")
    largest = max(n for _, n, *_ in hybrid.task.mixture)
    assert largest >= 4 * hybrid.model.qk_dim and largest in hybrid.task.test_num_pairs
    assert set(hybrid.task.test_seq_len or [hybrid.task.seq_len]) == {hybrid.task.seq_len}  # in distribution
