"""A mixer's own settings: typed Options on the mixer, filled from model.options, and the one
mapping (harness.layers.options.LEGACY_KEYS) that keeps old configs, hashes and checkpoints."""
from dataclasses import fields

import pytest
import torch

from harness.config.compose import compose_config
from harness.config.digest import config_hash, flat_config
from harness.layers import registry
from harness.layers.options import LEGACY_KEYS, lift, rewrite_override
from harness.model import LanguageModel, ModelConfig, layer_configs

# Config hashes recorded by the code before mixers owned their settings (commit 9e24313, where
# they were ModelConfig fields): results and checkpoints written then must still be found.
RECORDED = {
    (): "76f884120b2f0657",
    ("model=swa",): "2142915cca98a581",
    ("model=favor_schlag1",): "7809c27a0080333d",
    ("model=deltanet_additive",): "ed1e446450e3ec71",
    ("model=retnet", "model.retnet_heads=2"): "66f9fc404810c70f",
    ("model=mamba", "model.gate=per_dim"): "871b4614397b5dfd",
    ("model=dpfp_nu2",): "2a8e65b68d6be9e0",
    ("+experiment=findings/capacity", "model=favor_schlag1", "model.qk_dim=16"): "65f47a801e0647c5",
    ("+experiment=findings/capacity", "model=elu"): "a34d0f3422d9ef5a",
    ("model=swa", "model.window=16"): "3c287922fb494099",
    ("model=elu", "model.eps=1e-5", "model.normalize=false"): "2d2f2a301e5135e1",
    ("model=retnet", "model.decay=0.9"): "822cbdb61d8a55be",
    ("+experiment=hybrid",): "d2976f158cbd4362",
}


@pytest.mark.parametrize("overrides", list(RECORDED), ids=lambda o: " ".join(o) or "default")
def test_a_config_hashes_as_it_did_when_its_settings_were_model_fields(overrides):
    assert config_hash(compose_config([*overrides])) == RECORDED[overrides]


@pytest.mark.parametrize("key, value, model", [("window", 16, "swa"), ("retnet_heads", 2, "retnet"),
                                               ("favor_redraw", "step", "favor"), ("rule", "additive", "deltanet"),
                                               ("dpfp_nu", 2, "dpfp"), ("gate", "per_dim", "mamba")])
def test_the_old_key_and_the_option_are_one_setting(key, value, model):
    old = compose_config([f"model={model}", f"model.{key}={value}"])
    new = compose_config([f"model={model}", f"model.options.{key}={value}"])
    assert old.model.options[key] == new.model.options[key] == value
    assert config_hash(old) == config_hash(new)
    assert flat_config(new)[f"model.{key}"] == value  # recorded under the old key, as results always were
    assert rewrite_override(f"+model.{key}={value}") == f"+model.options.{key}={value}"


def test_an_integer_for_an_old_float_setting_is_recorded_as_the_float_it_was():
    assert flat_config(compose_config(["model=elu", "model.options.eps=1"]))["model.eps"] == 1.0
    assert config_hash(compose_config(["model.eps=1"])) == config_hash(compose_config(["model.eps=1.0"]))


def test_an_old_mapping_builds_the_same_model():
    """A config as results.json or a checkpoint recorded it (every old key present) builds the
    model its option form builds, to the last weight."""
    old = {"name": "retnet", "d_model": 16, "n_layers": 1, **LEGACY_KEYS, "retnet_heads": 2, "decay": 0.9}
    lifted = ModelConfig(**old)
    assert dict(lifted.options) == {"retnet_heads": 2, "decay": 0.9}  # the rest were at their defaults
    torch.manual_seed(0)
    a = LanguageModel(lifted, 16, 32)
    torch.manual_seed(0)
    b = LanguageModel(ModelConfig(name="retnet", d_model=16, n_layers=1, options={"retnet_heads": 2, "decay": 0.9}), 16, 32)
    assert a.layers[0].mixer.per_group == 2
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name
    with pytest.raises(ValueError, match="set one"):
        lift({"name": "swa", "window": 8, "options": {"window": 16}})


def test_each_old_default_is_its_owners_default():
    owners = registry.option_owners()
    assert set(LEGACY_KEYS) <= set(owners)
    for key, default in LEGACY_KEYS.items():
        for name in owners[key]:
            assert registry.resolve(name).Options.default(key) == default, (key, name)


def test_the_model_config_keeps_what_every_model_has():
    names = [f.name for f in fields(ModelConfig)]
    assert len(names) <= 22 and not set(LEGACY_KEYS) & set(names), names


def test_a_hybrid_slot_reads_the_builtin_settings_and_its_own():
    cfg = ModelConfig(name="retnet", d_model=16, layers=["retnet", {"name": "swa", "window": 8}, "swa"],
                      options={"retnet_heads": 2, "window": 4})
    retnet, swa8, swa4 = layer_configs(cfg)
    assert registry.resolve("retnet").options_of(retnet).retnet_heads == 2
    assert registry.resolve("swa").options_of(swa8).window == 8  # the slot's own wins
    assert registry.resolve("swa").options_of(swa4).window == 4
