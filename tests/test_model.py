"""The language model and its mixers: builds, gradients, causality, forms, hooks, config checks."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from harness import ops
from harness.hooks import capture, hook_points
from harness.layers import builtin_names, resolve
from harness.model import LanguageModel, ModelConfig, validate

VOCAB, MAX_T = 20, 32
LINEAR_FAMILIES = ["linear", "elu", "favor", "taylor", "dpfp", "retnet", "mamba", "deltanet", "gated_deltanet"]

# Every mixer once, plus the options that change its computation.
VARIANTS = [
    *[dict(name=n) for n in builtin_names()],
    dict(name="mamba", gate="per_dim"),
    dict(name="elu", short_conv=True, rotary=True),
    dict(name="softmax", rotary=False, norm="rmsnorm"),
    dict(name="favor", favor_features=12),
    # q and k narrower than v (Based's feature_dim): every mixer's op takes Dk != Dv
    dict(name="taylor", qk_dim=4),
    dict(name="softmax", qk_dim=4, rotary=True),
    dict(name="retnet", qk_dim=4),
    dict(name="mamba", gate="per_dim", qk_dim=4),
    dict(name="gated_deltanet", qk_dim=4, rotary=True),
    dict(name="swa", window=5),  # T = 21 spans several windows
    # the kernel mixers' other denominator policy (linear divides, elu does not)
    dict(name="linear", normalize=True),
    dict(name="elu", normalize=False),
    dict(name="dpfp", dpfp_nu=3),
    dict(name="retnet", retnet_heads=1),  # one decay head per q/k head (RetNet's own layout)
    # the controls: the same layers without the delta term
    dict(name="deltanet", rule="additive"),
    dict(name="gated_deltanet", rule="additive"),
    dict(name="elu", mlp=False),  # mixer-only blocks
]


def variant_id(v: dict) -> str:
    return "-".join(str(x) for x in v.values())


def tiny(**kw) -> ModelConfig:
    base = dict(d_model=16, n_layers=2, n_heads=2, chunk_size=8)
    return ModelConfig(**{**base, **kw})


def build(seed: int = 0, dtype=torch.float32, **kw) -> LanguageModel:
    torch.manual_seed(seed)
    return LanguageModel(tiny(**kw), VOCAB, MAX_T).to(dtype).eval()


def tokens(B: int = 2, T: int = 21, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (B, T), generator=g)


def test_qk_dim_sets_the_key_side_of_the_state():
    taylor, elu, soft = build(name="taylor", qk_dim=4), build(name="elu", qk_dim=4), build(name="softmax", qk_dim=4)
    assert taylor.d_key == 1 + 4 + 16 and elu.d_key == 4 and taylor.d_head == 8
    assert taylor.state_size() == 2 * 2 * (21 * 8 + 21)   # 2 layers x 2 heads of S (m x d_head) and z (m)
    assert soft.state_size() == 2 * 2 * MAX_T * (4 + 8)   # keys of 4, values of 8 per token and head
    with pytest.raises(ValueError, match="model.qk_dim must be a positive integer or null, got 0"):
        build(name="elu", qk_dim=0)
    with pytest.raises(ValueError, match="model.rotary=true needs an even q/k width"):
        build(name="elu", qk_dim=3, rotary=True)


def test_every_builtin_name_resolves_to_a_mixer_that_declares_the_protocol():
    names = builtin_names()
    assert {"softmax", "linear", "elu", "favor", "taylor", "retnet", "mamba"} <= set(names)
    for name in names:
        cls = resolve(name)
        assert cls.family and cls.kernel and callable(cls.probe_memory), name


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_forward_backward_finite(variant):
    model = build(**variant).train()
    x = tokens()
    logits = model(x)
    assert logits.shape == (2, 21, VOCAB)
    assert torch.isfinite(logits).all()
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x.flatten())
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} gets no gradient"
        assert torch.isfinite(p.grad).all(), f"{name} has a non-finite gradient"
    assert model.embed.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_causal(variant):
    """Changing token t changes no logit before t."""
    model = build(dtype=torch.float64, **variant)
    x = tokens(T=24)
    t = 13
    y = x.clone()
    y[:, t:] = (y[:, t:] + 7) % VOCAB
    with torch.no_grad():
        a, b = model(x), model(y)
    assert torch.allclose(a[:, :t], b[:, :t], rtol=0, atol=1e-12)
    assert not torch.allclose(a[:, t:], b[:, t:])


@pytest.mark.parametrize(
    "variant",
    [*[dict(name=n) for n in LINEAR_FAMILIES], dict(name="mamba", gate="per_dim"), dict(name="retnet", rotary=True),
     dict(name="mamba", mamba_heads=2), dict(name="linear", normalize=True), dict(name="dpfp", dpfp_nu=2),
     dict(name="retnet", retnet_heads=2, qk_dim=4), dict(name="deltanet", rule="additive"),
     dict(name="gated_deltanet", rule="additive")],
    ids=variant_id,
)
def test_forms_agree(variant):
    """chunk (T not a multiple of the chunk size), parallel and recurrent give the same logits."""
    model = build(dtype=torch.float64, **variant)
    x = tokens(T=21)
    with torch.no_grad():
        out = {form: model.set_form(form)(x) for form in ("chunk", "parallel", "recurrent")}
    for form in ("parallel", "recurrent"):
        err = (out[form] - out["chunk"]).abs().max().item()
        assert err < 1e-8, f"{form} vs chunk: {err}"


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_hooks_do_not_change_outputs(variant):
    model = build(**variant)
    x = tokens()
    with torch.no_grad():
        before = model(x)
        with capture(model) as cache:
            during = model(x)
        after = model(x)
    assert torch.equal(before, during) and torch.equal(before, after)
    names = {"hook_q_raw", "hook_k_raw", "hook_q", "hook_k", "hook_v", "hook_out"}
    if variant["name"] in ("retnet", "mamba", "gated_deltanet"):
        names.add("hook_log_decay")
    if variant["name"] in ("deltanet", "gated_deltanet"):
        names.add("hook_beta")
    for layer in range(2):
        for n in names:
            assert f"layers.{layer}.mixer.{n}" in cache
    g = getattr(model.layers[0].mixer, "per_group", 1)  # mamba's decay heads per q/k head
    B, H, T = 2, 2 * g, 21
    assert cache["layers.0.mixer.hook_q"].shape == (B, H, T, model.d_key)
    assert cache["layers.0.mixer.hook_v"].shape == (B, H, T, 8 // g)
    assert cache["layers.1.hook_resid_post"].shape == (B, T, 16)
    assert all(h._sink is None for h in hook_points(model).values())  # nothing recorded outside


def test_capture_filters_and_nests_safely():
    model = build(name="elu")
    with capture(model, names="hook_q") as cache:
        model(tokens())
    assert set(cache) == {f"layers.{i}.mixer.hook_q{s}" for i in range(2) for s in ("", "_raw")}
    with capture(model, names=["layers.0.mixer.hook_v"]):
        with pytest.raises(RuntimeError, match="already being captured"):
            with capture(model, names=["layers.0.mixer.hook_v"]):
                pass


def test_key_dimension_and_state_accounting():
    d = 8  # d_head
    assert build(name="elu").d_key == d
    assert build(name="linear").d_key == d
    assert build(name="taylor").d_key == 1 + d + d * d
    assert build(name="favor", favor_features=12).d_key == 12
    assert build(name="retnet").d_key == d
    assert [build(name="dpfp", dpfp_nu=nu).d_key for nu in (1, 2, 3)] == [2 * d, 4 * d, 6 * d]
    for m in (64, 128, 256, 512, 1000):  # Schlag et al.'s FAVOR+ feature counts at d = 64, and one off the blocks
        favor = resolve("favor")(ModelConfig(name="favor", d_model=64, favor_features=m), 0)
        assert favor.d_key == favor.phi.weights.shape[0] == m and favor.state_size() == m * 64 + m
    layers_heads = 2 * 2
    for name, normalize, kw in [("elu", True, {}), ("taylor", True, {}), ("dpfp", True, {}),
                                ("dpfp", True, {"dpfp_nu": 3}), ("retnet", False, {}),
                                ("retnet", False, {"retnet_heads": 1}), ("mamba", False, {}),
                                ("deltanet", False, {}), ("gated_deltanet", False, {}),
                                ("deltanet", False, {"rule": "additive"})]:
        model = build(name=name, **kw)
        assert model.state_size() == layers_heads * ops.state_elements(model.d_key, d, normalize=normalize)
        assert model.state_size(10) == model.state_size(1000)  # fixed-size states
    softmax = build(name="softmax")
    assert softmax.state_size() == layers_heads * ops.kv_cache_elements(MAX_T, d)
    assert softmax.state_size(10) == layers_heads * ops.kv_cache_elements(10, d)  # grows with the length
    swa = build(name="swa", window=6)  # the window's KV cache: 2 W d per head, once the sequence fills it
    assert swa.state_size() == swa.state_size(1000) == layers_heads * 2 * 6 * d
    assert swa.state_size(4) == layers_heads * 2 * 4 * d
    assert build(name="swa").layers[0].mixer.window == 32  # the default window


def test_parameters_and_init():
    model = build(name="softmax")
    assert model.head.weight is not model.embed.weight  # untied by default
    tied = build(name="softmax", tie_embeddings=True)
    assert tied.head.weight is tied.embed.weight
    assert model.num_params() - tied.num_params() == VOCAB * 16
    n = tied.num_params()
    assert n == sum(p.numel() for p in tied.parameters())
    assert tied.num_params(non_embedding=True) == n - VOCAB * 16
    assert abs(model.embed.weight.std().item() - 1.0) < 0.2  # unit-variance embeddings
    big = LanguageModel(ModelConfig(name="elu", d_model=64, n_layers=4), 64, 64)
    qkv = big.layers[0].mixer.qkv_proj.weight
    out = big.layers[0].mixer.out_proj.weight
    for w in (qkv, out):  # Xavier-uniform: std = sqrt(2 / (fan_in + fan_out))
        assert abs(w.std().item() - math.sqrt(2 / sum(w.shape))) < 0.1 * math.sqrt(2 / sum(w.shape))


@pytest.mark.parametrize("name", ["mamba", "gated_deltanet"])
def test_decay_initialisation(name):
    """Mamba-2's: dt = softplus(dt_bias) in [1e-3, 1e-1] and A = exp(A_log) in [1, 16], spread over
    the range (not collapsed by the model's generic init)."""
    torch.manual_seed(0)
    mixer = LanguageModel(ModelConfig(name=name, d_model=64, n_heads=16), VOCAB, MAX_T).layers[0].mixer
    dt = torch.nn.functional.softplus(mixer.dt_bias)
    assert ((dt >= 1e-3 * 0.999) & (dt <= 1e-1 * 1.001)).all() and dt.max() / dt.min() > 10
    A = torch.exp(mixer.A_log)
    assert ((A >= 1) & (A <= 16)).all() and A.max() - A.min() > 5


@pytest.mark.parametrize("name", ["deltanet", "gated_deltanet"])
def test_delta_rule_starts_with_weak_equal_writes_and_an_open_gate(name):
    """beta = sigmoid(x W_beta + b_beta) starts at BETA_START for every token and the output gate
    silu(x W_g + b_g) at 1 (W = 0 and the biases set after the model's generic init, which zeroes
    biases), in the model and in a mixer built alone."""
    from harness.layers.deltanet import BETA_START

    model = build(name=name)
    with capture(model) as cache, torch.no_grad():
        model(tokens())
    assert torch.allclose(cache["layers.0.mixer.hook_beta"], torch.full((2, 2, 21), BETA_START))
    alone = resolve(name)(tiny(name=name), 0)
    x = torch.randn(2, 5, 16)
    for mixer in (model.layers[1].mixer, alone):
        with torch.no_grad():
            assert torch.allclose(torch.sigmoid(mixer.beta_proj(x)), torch.full((2, 5, 2), BETA_START))
            assert torch.allclose(torch.nn.functional.silu(mixer.gate_proj(x)), torch.ones(2, 5, 16), atol=1e-6)


def test_retnet_initialisation():
    """gamma_h = 1 - 2^(-5-h) over every decay head of the layer: 4 q/k heads of 4 decay heads
    give 16 horizons, one q/k head of one decay head (RetNet's own layout at n_heads=1) one."""
    retnet = LanguageModel(ModelConfig(name="retnet", d_model=16, n_heads=4), VOCAB, MAX_T).layers[0].mixer
    gammas = torch.exp(retnet.log_gamma)
    assert torch.allclose(gammas, 1 - 2.0 ** (-5 - torch.arange(16, dtype=torch.float64)))
    single = LanguageModel(ModelConfig(name="retnet", d_model=16, retnet_heads=1), VOCAB, MAX_T).layers[0].mixer
    assert torch.allclose(torch.exp(single.log_gamma), torch.tensor([1 - 2.0**-5], dtype=torch.float64))


def test_retnet_decay_heads_share_q_and_k_and_spread_their_horizons():
    """model.retnet_heads decay heads per q/k head, each with its own gamma over its own slice of v
    (Mamba-2's layout): one q/k head still has four horizons, 32 to 256 tokens."""
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(name="retnet", d_model=32, n_heads=1, n_layers=1), VOCAB, MAX_T).eval()
    mixer = model.layers[0].mixer
    assert mixer.per_group == mixer.heads_per_readout == 4 and mixer.decay_head_dim == 8
    horizons = 1 / (1 - torch.exp(mixer.log_gamma))
    assert torch.allclose(horizons, torch.tensor([32.0, 64.0, 128.0, 256.0], dtype=torch.float64))
    with torch.no_grad(), capture(model) as cache:
        model(tokens(T=12))
    q, k, v = (cache[f"layers.0.mixer.hook_{n}"] for n in ("q", "k", "v"))
    assert q.shape == (2, 4, 12, 32) and v.shape == (2, 4, 12, 8)
    assert torch.equal(q[:, 0], q[:, 3]) and torch.equal(k[:, 0], k[:, 2])  # one q/k head for all
    assert torch.allclose(cache["layers.0.mixer.hook_log_decay"][0, :, 0], mixer.log_gamma.float())
    assert model.state_size() == ops.state_elements(32, 32, normalize=False)  # the split keeps the state
    assert model.num_params() == LanguageModel(ModelConfig(name="retnet", d_model=32, n_layers=1, retnet_heads=1),
                                               VOCAB, MAX_T).num_params()  # the norm is split, not grown
    with pytest.raises(ValueError, match="model.options.retnet_heads=3 must divide the head width"):
        build(name="retnet", retnet_heads=3)
    build(name="elu", retnet_heads=3)  # only retnet's own requirement


def test_dpfp_is_normalised_kernel_attention_through_the_dpfp_map():
    """The built-in DPFP: hook_q / hook_k are features.dpfp of the raw q / k, read as elu+1 is
    (divided by phi(q).z), with the kernel name the theory knows for its nu."""
    from harness import features

    model = build(name="dpfp", dtype=torch.float64, dpfp_nu=2)
    mixer = model.layers[0].mixer
    assert mixer.normalize and mixer.kernel == "dpfp2" and mixer.d_key == 2 * 8 * 2
    with torch.no_grad(), capture(model) as cache:
        model(tokens())
    q_raw, q = cache["layers.0.mixer.hook_q_raw"], cache["layers.0.mixer.hook_q"]
    assert torch.equal(q, features.dpfp(q_raw, 2))
    k, v = cache["layers.0.mixer.hook_k"], cache["layers.0.mixer.hook_v"]
    o = ops.naive_linear_attention(q, k, v, normalize=True, eps=mixer.eps)
    torch.testing.assert_close(cache["layers.0.mixer.hook_out"], o, rtol=0, atol=1e-12)
    for nu, message in [(0, "model.options.dpfp_nu must be a positive integer"), (8, "model.options.dpfp_nu=8 must be below")]:
        with pytest.raises(ValueError, match=message):
            build(name="dpfp", dpfp_nu=nu)


@pytest.mark.parametrize("name", ["deltanet", "gated_deltanet"])
def test_additive_rule_is_the_same_layer_without_the_delta_term(name):
    """model.options.rule=additive: the same parameters (a delta-rule model's state_dict loads into it),
    the same q, k, v, beta and decay, and S_t = a_t S_{t-1} + k_t (beta_t v_t)^T in place of the
    delta rule, by the naive loop of the decayed additive state."""
    delta, additive = build(name=name, dtype=torch.float64), build(name=name, dtype=torch.float64, rule="additive")
    additive.load_state_dict(delta.state_dict())  # identical parameters: nothing else changed
    mixer = additive.layers[0].mixer
    assert mixer.core == ("linear" if name == "deltanet" else "decay_scalar")
    assert mixer.family == ("linear" if name == "deltanet" else "decay") and delta.layers[0].mixer.family == "delta"
    x = tokens()
    with torch.no_grad(), capture(delta, names="layers.0.") as cd, capture(additive, names="layers.0.") as ca:
        delta(x), additive(x)
    for hook in ("hook_q", "hook_k", "hook_v", "hook_beta", "hook_log_decay"):
        key = f"layers.0.mixer.{hook}"
        assert (key in cd) == (key in ca) == (hook != "hook_log_decay" or name == "gated_deltanet")
        if key in cd:
            assert torch.equal(cd[key], ca[key]), hook  # the same layer up to the state update
    q, k, v, beta = (ca[f"layers.0.mixer.hook_{n}"] for n in ("q", "k", "v", "beta"))
    log_decay = ca.get("layers.0.mixer.hook_log_decay", torch.zeros_like(beta))
    o = ops.naive_decay_attention(q, k, v * beta.unsqueeze(-1), log_decay)
    torch.testing.assert_close(ca["layers.0.mixer.hook_out"], o, rtol=0, atol=1e-12)
    assert not torch.allclose(cd["layers.0.mixer.hook_out"], o)  # the delta rule does differ
    with pytest.raises(ValueError, match=r"model.options.rule must be delta for model.name=elu"):
        build(name="elu", rule="additive")
    with pytest.raises(ValueError, match="unknown model.options.rule 'hebbian'"):
        build(name=name, rule="hebbian")


def test_mixer_only_blocks():
    """model.mlp=false: x + mixer(norm(x)) and nothing else; the parameter count from the config
    (harness.train.memory.param_count) follows the model's."""
    from harness.train.memory import param_count

    full, bare = build(name="elu"), build(name="elu", mlp=False)
    assert bare.layers[0].mlp is None and bare.layers[0].norm2 is None
    block = full.layers[0]
    assert full.num_params() - bare.num_params() == 2 * sum(p.numel() for m in (block.mlp, block.norm2)
                                                            for p in m.parameters())
    x = torch.randn(2, 7, 16)
    b = bare.layers[0]
    with torch.no_grad():
        torch.testing.assert_close(b(x), x + b.mixer(b.norm1(x)))
    # the estimate from the config drops exactly the MLPs and their norms
    assert (param_count(tiny(name="elu"), VOCAB, MAX_T) - param_count(tiny(name="elu", mlp=False), VOCAB, MAX_T)
            == full.num_params() - bare.num_params())
    cfg = ModelConfig(name="retnet", mlp=False)  # the default width, Zoology's mixer-only blocks
    assert param_count(cfg, 256, 64) == pytest.approx(LanguageModel(cfg, 256, 64).num_params(), rel=0.01)
    with pytest.raises(ValueError, match="model.mlp must be true or false"):
        build(name="elu", mlp="no")


def test_mamba_decay_heads_share_q_and_k_and_spread_their_timescales():
    """Mamba-2's head layout: model.mamba_heads decay heads per q/k head, each with its own dt and
    A over its own slice of v; dt at init spread over [1e-3, 1e-1], one head per stratum."""
    torch.manual_seed(0)
    cfg = ModelConfig(name="mamba", d_model=32, n_heads=1, n_layers=1, mamba_heads=8)
    model = LanguageModel(cfg, VOCAB, MAX_T).eval()
    mixer = model.layers[0].mixer
    assert mixer.per_group == 8 and mixer.decay_head_dim == 4 and mixer.dt_bias.shape == (8,)
    log_dt = torch.log(torch.nn.functional.softplus(mixer.dt_bias.double()))
    strata = ((log_dt - math.log(1e-3)) / (math.log(1e-1) - math.log(1e-3)) * 8).floor()
    assert sorted(strata.tolist()) == list(range(8))  # one decay head in each eighth of log dt
    # W_dt keeps torch's default Linear init (uniform +-1/sqrt(C)), not the model's Xavier init
    assert mixer.dt_proj.weight.abs().max() <= 32**-0.5
    assert abs(mixer.dt_proj.weight.std().item() - (3 * 32) ** -0.5) < 0.02
    with torch.no_grad(), capture(model) as cache:
        model(tokens(T=12))
    q, k, v = (cache[f"layers.0.mixer.hook_{n}"] for n in ("q", "k", "v"))
    assert q.shape == (2, 8, 12, 32) and v.shape == (2, 8, 12, 4)
    assert torch.equal(q[:, 0], q[:, 7]) and torch.equal(k[:, 0], k[:, 3])  # one q/k head for all
    assert cache["layers.0.mixer.hook_log_decay"].shape == (2, 8, 12)
    assert model.state_size() == ops.state_elements(32, 32, normalize=False)  # the split keeps the state
    assert build(name="mamba", gate="per_dim").layers[0].mixer.per_group == 1  # the GLA gate: one
    assert build(name="mamba").layers[0].mixer.per_group == 4  # the default
    with pytest.raises(ValueError, match="model.options.mamba_heads=3 must divide the head width"):
        build(name="mamba", mamba_heads=3)
    build(name="elu", mamba_heads=3)  # only mamba's own requirement


def test_mamba_decay_parameters_stay_out_of_weight_decay():
    from types import SimpleNamespace

    from harness.train.optim import build_optimizer

    model = build(name="mamba")
    opt = build_optimizer(model, SimpleNamespace(lr=1e-3, weight_decay=0.1))
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    mixer = model.layers[0].mixer
    assert id(mixer.A_log) not in decayed and id(mixer.dt_bias) not in decayed
    assert id(mixer.dt_proj.weight) in decayed and id(mixer.qkv_proj.weight) in decayed


def test_kernel_denominator_policy():
    """linear reads unnormalised with a per-head output norm (fla's default); the positive maps
    divide by phi(q).z (Katharopoulos, Based); model.normalize flips either."""
    x = tokens()
    linear, divided = build(name="linear"), build(name="linear", normalize=True)
    assert not linear.layers[0].mixer.normalize and linear.layers[0].mixer.norm is not None
    assert divided.layers[0].mixer.normalize and divided.layers[0].mixer.norm is None
    assert not linear.layers[0].mixer.positive_denominator  # no denominator to keep positive
    elu, plain = build(name="elu"), build(name="elu", normalize=False)
    assert elu.layers[0].mixer.positive_denominator and not plain.layers[0].mixer.positive_denominator
    d = 8
    assert linear.state_size() == 2 * 2 * ops.state_elements(d, d, normalize=False)  # no z kept
    assert divided.state_size() == 2 * 2 * ops.state_elements(d, d, normalize=True)
    with torch.no_grad(), capture(linear) as cache:
        linear(x)
    q, k, v = (cache[f"layers.0.mixer.hook_{n}"].double() for n in ("q", "k", "v"))
    o = torch.tril(q @ k.transpose(-1, -2)) @ v  # the plain linear memory S^T q, undivided
    assert torch.allclose(o, cache["layers.0.mixer.hook_out"].double(), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="model.options.normalize"):
        build(name="linear", normalize="yes")


def test_retnet_decay_sets_one_gamma_for_every_head():
    def log_gamma(**kw) -> torch.Tensor:  # the float64 buffer, before any .to(dtype)
        model = LanguageModel(tiny(name="retnet", n_heads=4, **kw), VOCAB, MAX_T)
        return model.layers[0].mixer.log_gamma

    assert torch.equal(log_gamma(decay=0.9, retnet_heads=1), torch.full((4,), math.log(0.9), dtype=torch.float64))
    assert torch.equal(log_gamma(decay=0.9), torch.full((16,), math.log(0.9), dtype=torch.float64))  # every decay head
    h = torch.arange(4, dtype=torch.float64)
    assert torch.allclose(log_gamma(retnet_heads=1), torch.log1p(-(2.0 ** (-5 - h))))


def test_rotary_is_opt_in_and_softmax_defaults_to_learned_positions():
    assert build(name="softmax").layers[0].mixer.rotary is None
    assert build(name="softmax").pos_embed is not None
    assert build(name="elu").pos_embed is None
    for name in ("elu", "retnet", "mamba"):
        assert build(name=name).layers[0].mixer.rotary is None
    assert build(name="elu", rotary=True).layers[0].mixer.rotary is not None
    assert build(name="softmax", rotary=False).layers[0].mixer.rotary is None


def test_favor_redraw_each_training_step():
    model = build(name="favor", favor_redraw="step")
    x = tokens()
    with torch.no_grad():
        a, b = model(x), model(x)  # eval: features fixed
        assert torch.equal(a, b)
        model.train()
        c, d = model(x), model(x)
    assert not torch.equal(c, d)


def test_favor_counts_features_per_key_dimension_and_sign():
    """model.favor_per_dim counts Schlag et al.'s projections per q/k dimension; favor_signs=both
    gives each two features, so the state's key side is twice the projections."""
    both = build(name="favor", qk_dim=4, favor_per_dim=2, favor_signs="both")
    mixer = both.layers[0].mixer
    assert mixer.d_key == both.d_key == 16 and mixer.phi.m == 16 and mixer.phi.projections == 8
    assert build(name="favor", qk_dim=4, favor_per_dim=2).d_key == 8
    assert build(name="favor", qk_dim=4, favor_features=12, favor_signs="both").layers[0].mixer.phi.projections == 6
    x = tokens()
    with torch.no_grad():
        assert torch.isfinite(both(x)).all()


def test_favor_features_survive_a_checkpoint():
    """The features are a function of their seed; the seed travels in the state_dict."""
    model = build(name="favor", favor_redraw="step").train()
    x = tokens()
    with torch.no_grad():
        model(x), model(x)  # two redraws
        expected = model.eval()(x)
        fresh = build(seed=5, name="favor", favor_redraw="step")
        fresh.load_state_dict(model.state_dict())
        assert torch.equal(fresh(x), expected)


def test_sequence_longer_than_max_raises():
    with pytest.raises(ValueError, match="max_seq_len"):
        build(name="elu")(tokens(T=MAX_T + 1))


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(name="gpt"), "unknown model.name 'gpt'; valid: deltanet, dpfp, elu, favor, gated_deltanet, linear, "
                           "mamba, retnet, softmax, swa, taylor, or a dotted path"),
        (dict(d_model=30, n_heads=4), r"model.n_heads must be a divisor of model.d_model=30, got 4"),
        (dict(d_model=0), "model.d_model must be a positive integer, got 0"),
        (dict(n_layers=-1), "model.n_layers must be a positive integer"),
        (dict(chunk_size=0), "model.chunk_size must be a positive integer"),
        (dict(form="blocked"), "unknown model.form 'blocked'"),
        (dict(name="mamba", gate="vector"), "unknown model.options.gate 'vector'"),
        (dict(favor_redraw="epoch"), "unknown model.options.favor_redraw"),
        (dict(norm="batchnorm"), "unknown model.norm"),
        (dict(eps=0.0), "model.options.eps must be a positive number"),
        (dict(dropout=1.0), r"model.dropout must be a number in \[0, 1\)"),
        (dict(favor_features=0), "model.options.favor_features must be a positive integer or null"),
        (dict(name="favor", favor_signs="minus"), "unknown model.options.favor_signs 'minus'"),
        (dict(name="favor", favor_per_dim=0), "model.options.favor_per_dim must be a positive integer or null"),
        (dict(name="favor", favor_per_dim=2, favor_features=16), "both count FAVOR\\+'s features: set one"),
        (dict(name="favor", favor_signs="both", favor_features=15), "must be even with model.options.favor_signs=both"),
        (dict(decay=1.0), r"model.options.decay must be a number in \(0, 1\) or null, got 1.0"),
        (dict(decay=0.0), "model.options.decay must be a number in"),
        (dict(name="swa", window=0), "model.options.window must be a positive integer or null, got 0"),
        (dict(name="elu", window=4), r"model.options.window must be null for model.name=elu \(it is an option of swa\)"),
        (dict(short_conv="yes"), "model.short_conv must be true or false"),
        (dict(name="softmax", d_model=6, n_heads=2, rotary=True), "model.rotary=true needs an even q/k"),
    ],
)
def test_validate_errors(change, message):
    cfg = replace(ModelConfig(), **change)
    with pytest.raises(ValueError, match=message) as err:
        validate(cfg)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError):
        LanguageModel(cfg, VOCAB, MAX_T)


def test_default_config_is_valid():
    validate(ModelConfig())
    assert ModelConfig().name == "elu"


@pytest.mark.parametrize("size", [1, 2, 4])
def test_short_conv_matches_conv1d_and_is_causal(size):
    from harness.layers import ShortConv

    torch.manual_seed(0)
    conv = ShortConv(6, size).double()
    x = torch.randn(3, 9, 6, dtype=torch.float64, requires_grad=True)
    y, ref = conv(x), conv.reference(x)
    assert torch.allclose(y, ref, atol=1e-12)
    g = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, conv.conv.weight, conv.conv.bias), g)
    ref_grads = torch.autograd.grad(ref, (x, conv.conv.weight, conv.conv.bias), g)
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(grads, ref_grads))
    x2 = x.detach().clone()
    x2[:, 5] += 1.0  # a change at t = 5 moves nothing before it
    assert torch.equal(conv(x2)[:, :5], conv(x.detach())[:, :5])


@pytest.mark.parametrize("name", ["softmax", "elu", "mamba"])
def test_logits_at_chosen_positions_are_those_of_the_full_head(name):
    """forward(inputs, positions) runs the final norm and the head at those positions alone."""
    model = build(name=name, dtype=torch.float64, tie_embeddings=name == "elu")
    x = tokens(B=3, T=21)
    positions = torch.tensor([[3, 7, 20], [0, 0, 5], [19, 2, 11]])
    full = model(x)  # (B, T, V)
    part = model(x, positions)  # (B, K, V)
    assert part.shape == (3, 3, VOCAB)
    torch.testing.assert_close(part, full.gather(1, positions.unsqueeze(-1).expand(-1, -1, VOCAB)),
                               rtol=0, atol=1e-12)
    # the head's product runs at K positions, not T: its input has K rows
    seen = []
    handle = model.head.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape))
    model(x, positions)
    handle.remove()
    assert seen == [torch.Size([3, 3, 16])]


@pytest.mark.parametrize("name", ["mamba", "gated_deltanet"])
def test_a_scalar_decay_starts_with_a_memory_on_unit_inputs(name):
    """Every scalar decay starts from Mamba-2's initialisation, dt projection included: with the
    model's Xavier init on W_dt, x W_dt spread so wide on unit-variance inputs that dt * A
    reached -40 and a head forgot everything at some tokens (gated_deltanet sat at chance on
    the needle task and at N = 24 of capacity, three seeds of five, until it shared mamba's)."""
    from harness.layers.mamba import scalar_log_decay
    torch.manual_seed(0)
    cfg = ModelConfig(name=name, d_model=64, n_heads=4, n_layers=2)
    model = LanguageModel(cfg, VOCAB, MAX_T)
    for mixer in model.mixers():
        assert mixer.dt_proj.weight.abs().max() <= 64**-0.5  # torch's default Linear init
        log_a, _ = scalar_log_decay(mixer.dt_proj(torch.randn(8, 32, 64)), mixer.dt_bias, mixer.A_log)
        assert log_a.exp().min() > 1e-3  # no head wiped at a token (it reached e^-40)


def test_retnet_says_when_its_group_norm_would_keep_one_bit_per_decay_head(capsys, monkeypatch):
    from harness import errors
    from harness.layers.retnet import Retention

    monkeypatch.setattr(errors, "_SAID", set())  # said once a process: another test may have said it

    Retention.check_config(ModelConfig(name="retnet", d_model=8, retnet_heads=4))  # 2 channels a head
    assert "keeps one bit" in capsys.readouterr().err
    Retention.check_config(ModelConfig(name="retnet", d_model=8, retnet_heads=4))  # once a process
    assert capsys.readouterr().err == ""
    Retention.check_config(ModelConfig(name="retnet", d_model=8, retnet_heads=2))
    assert capsys.readouterr().err == ""
