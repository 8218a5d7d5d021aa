"""Hybrid stacks (model.layers, model.attn_every) and the accounting of mixed and outside layers,
with small stand-ins for the shapes of Zoology's mixers (Zoology itself is not needed)."""
import json

import pytest
import torch
from torch import nn

from harness.hooks import hook_points
from harness.layers import registry
from harness.layers.preflight import ignored, skipped
from harness.measure.trained import measure_model
from harness.model import LanguageModel, ModelConfig, label, layer_configs, validate
from harness.tasks import get_task

HERE = __name__


def tiny(**kw) -> ModelConfig:
    return ModelConfig(**{"d_model": 16, "n_heads": 2, "chunk_size": 4, **kw})


def forms_agree(model, T=12, vocab=16, tol=1e-4):
    x = torch.randint(0, vocab, (2, T), generator=torch.Generator().manual_seed(0))
    model.eval()
    outs = {form: model.set_form(form)(x) for form in ("chunk", "parallel", "recurrent")}
    for form, out in outs.items():
        assert torch.isfinite(out).all(), form
        assert torch.allclose(out, outs["parallel"], atol=tol, rtol=tol), form


@pytest.mark.parametrize("name", registry.builtin_names())
@pytest.mark.parametrize("slot", [0, 1])
def test_every_builtin_mixer_sits_in_any_slot_of_a_hybrid(name, slot):
    layers = ["softmax", "softmax"]
    layers[slot] = name
    torch.manual_seed(0)
    model = LanguageModel(tiny(layers=layers), vocab_size=16, max_seq_len=16)
    assert [type(m) for m in model.mixers()][slot] is registry.resolve(name)
    assert f"layers.{slot}.mixer.hook_out" in hook_points(model)
    forms_agree(model)


def test_attn_every_is_the_short_form_of_the_list():
    short = tiny(name="gated_deltanet", n_layers=4, attn_every=4)
    assert [c.name for c in layer_configs(short)] == ["gated_deltanet"] * 3 + ["softmax"]
    assert label(short) == "gated_deltanet*3+softmax"
    listed = tiny(layers=["gated_deltanet"] * 3 + ["softmax"])
    assert listed.n_layers == 4 and label(listed) == label(short)
    torch.manual_seed(0)
    a = LanguageModel(short, vocab_size=16, max_seq_len=16)
    torch.manual_seed(0)
    b = LanguageModel(listed, vocab_size=16, max_seq_len=16)
    x = torch.randint(0, 16, (1, 8))
    assert torch.equal(a(x), b(x))


def test_each_slot_has_its_own_settings_and_errors_name_the_slot():
    cfg = tiny(layers=[{"name": "retnet", "decay": 0.9}, {"name": "swa", "window": 4}], attn={"name": "swa"})
    model = LanguageModel(cfg, vocab_size=16, max_seq_len=16)
    assert model.mixers()[1].window == 4 and layer_configs(cfg)[0].options["decay"] == 0.9
    forms_agree(model)
    with pytest.raises(ValueError, match=r"model.layers\[0\] \(gated_deltanet\): model.options.window"):
        validate(tiny(layers=[{"name": "gated_deltanet", "window": 4}, "softmax"]))
    with pytest.raises(ValueError, match=r"model.layers\[1\].d_model: not a setting of one layer"):
        validate(tiny(layers=["softmax", {"name": "softmax", "d_model": 8}]))
    with pytest.raises(ValueError, match="set one"):
        validate(tiny(layers=["softmax"], attn_every=1))


def test_memory_names_the_state_and_the_kv_cache_per_layer():
    model = LanguageModel(tiny(layers=["gated_deltanet", {"name": "softmax", "n_heads": 4}]), 16, 64)
    mem = model.memory(64)
    state, cache = mem["layers"]
    assert (state["kind"], cache["kind"]) == ("state", "kv_cache")
    assert state["elements_per_head"] == 8 * 8 and state["n_heads"] == 2
    assert cache["n_heads"] == 4 and cache["elements_per_head"] == 64 * (4 + 4)  # 64 keys and values of 4
    assert mem["kv_cache_elements"] * 2 == model.memory(128)["kv_cache_elements"]  # it grows with length
    assert mem["state_elements"] == model.memory(128)["state_elements"]


def test_a_hybrid_trains_resumes_reloads_and_reports_both_parts(run_harness, tmp_path, monkeypatch):
    import harness
    from tests.conftest import cut_at_first_evaluation

    args = ["task=recall", "task.seq_len=32", "task.vocab_size=32", "task.test_seq_len=[32,64]",
            "model.layers=[gated_deltanet,tests.test_hybrid.Plain]", "model.d_model=16", "trainer.threads=1",
            "trainer.max_steps=6", "trainer.eval_every=4", "trainer.ckpt_every=2", "trainer.batch_size=4",
            "trainer.eval_examples=4", "trainer.measure_examples=4", "logger=none", "trainer.progress=false",
            f"out_dir={tmp_path / 'run'}"]
    cut_at_first_evaluation(monkeypatch, args)
    assert not (tmp_path / "run" / "results.json").exists()
    done = run_harness(*args)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resum" in (done.stdout + done.stderr).lower()
    assert "recurrent state" in done.stdout and "KV cache" in done.stdout
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    assert res["model"] == "gated_deltanet+tests.test_hybrid.Plain" and res["summary"]["steps"] == 6
    assert [r["mixer"] for r in res["layers"]] == ["gated_deltanet", "tests.test_hybrid.Plain"]
    assert res["layers"][1]["kwargs"] == {"d_model": 16}
    assert {"short_conv", "n_heads"} <= set(res["layers"][1]["not_applied"]) and res["layers"][0]["not_applied"] == []
    assert [(r["kind"], r["seq_len"]) for r in res["memory"]] == [("state", 64), ("kv_cache", 64)]
    assert {"recurrent_state_bytes", "attention_kv_cache_bytes"} <= set(res["summary"])
    run = harness.load_run(tmp_path / "run", trust_code=True)
    assert [type(m).__name__ for m in run.model.mixers()] == ["GatedDeltaNet", "Plain"]


class Plain(nn.Module):
    """A one-head causal attention written outside the harness, with a growing cache."""

    def __init__(self, d_model):
        super().__init__()
        self.qkv = nn.Linear(d_model, 3 * d_model)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    def state_size(self, sequence_length):
        return 2 * sequence_length * self.qkv.in_features


class BasedLike(Plain):
    def state_size(self, sequence_length=2048):
        return 9945.0  # Based returns a float


class H3Like(Plain):
    def __init__(self, d_model):
        super().__init__(d_model)
        self.kernel = nn.Linear(2, 2)  # its SSM kernel, not the protocol's kernel name


class MHALike(Plain):
    def __init__(self, d_model, num_heads=1):
        super().__init__(d_model)
        self.num_heads = num_heads

    def state_size(self, sequence_length):
        return 2 * sequence_length * self.qkv.in_features  # all heads


class HyenaLike(Plain):
    def __init__(self, d_model, l_max=32):
        super().__init__(d_model)
        self.l_max = l_max

    def forward(self, x):
        if x.shape[1] > self.l_max:
            return self.max_l  # what Zoology's Hyena does past l_max: an AttributeError on another name
        return super().forward(x)


def test_a_whole_number_float_state_size_is_a_count(capsys):
    model = LanguageModel(tiny(name=f"{HERE}.BasedLike"), 16, 16)
    assert model.state_size(16) == 2 * 9945 and "state_size" not in skipped(model.mixers()[0])


def test_an_attribute_of_the_mixers_own_is_not_read_as_a_protocol_member(capsys):
    model = LanguageModel(tiny(name=f"{HERE}.H3Like"), 16, 16)
    mixer = model.mixers()[0]
    assert skipped(mixer) == {} and "kernel" in ignored(mixer)
    assert "warning" not in capsys.readouterr().err


def test_per_head_accounting_uses_the_mixers_own_head_count():
    cfg = tiny(name=f"{HERE}.MHALike", options={"num_heads": 4}, n_heads=1, d_model=32)
    row = LanguageModel(cfg, 16, 64).memory(64)["layers"][0]
    assert (row["n_heads"], row["d_head"], row["elements_per_head"]) == (4, 8, 2 * 64 * 32 // 4)


def test_a_length_limit_is_refused_naming_the_option_and_the_length():
    cfg = tiny(name=f"{HERE}.HyenaLike", options={"l_max": 32})
    with pytest.raises(ValueError, match=r"fails at T = 64 \(a test length\): model.options.l_max=32 \(set\) < T = 64; "
                       r"set model.options.l_max=64 or more \(AttributeError"):
        registry.check_mixer(cfg, [(32, "the training length"), (64, "a test length")])


def test_a_jacobian_estimate_names_no_head():
    task = get_task("recall")
    batch = task.make_batch(task.Config(seq_len=16, vocab_size=32, num_pairs=2), 2, seed=0)
    model = LanguageModel(tiny(layers=["softmax", f"{HERE}.Plain"]), 32, 16)
    rows = measure_model(model, batch)["heads"]
    assert {r["head"] for r in rows if r["layer"] == 1} == {None}
    assert all(r["heads_merged"] for r in rows if r["layer"] == 1)
    assert {r["head"] for r in rows if r["layer"] == 0} == {0, 1}


def test_the_hybrid_and_ablation_keys_at_their_defaults_leave_a_plain_runs_hash_as_it_was():
    from harness.config.digest import flat_hash

    before = {"mode": "train", "model.name": "elu", "model.d_model": 64, "seed": 0}  # a run's flat config before them
    now = dict(before, **{"model.layers": None, "model.attn_every": None, "model.attn": "softmax",
                          "ablate.examples": 256, "ablate.kinds": ["zero", "mean"], "sweep.max_jobs": 100000})
    assert flat_hash(now) == flat_hash(before)  # finished sweeps are still found by their skip check
    assert flat_hash(dict(now, **{"model.attn_every": 2})) != flat_hash(dict(now, **{"model.attn_every": 2,
                                                                                      "model.attn": "swa"}))
    ablate = dict(now, mode="ablate")
    assert flat_hash(ablate) != flat_hash(dict(ablate, **{"ablate.examples": 128}))
