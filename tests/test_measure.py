"""Sharpness metrics on known cases, the signal/crosstalk split, and measure_model end to end."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import spearmanr

from harness.hooks import capture
from harness.measure.trained import (
    answer_span,
    crosstalk_mass,
    decay_gain_sq,
    effective_count,
    measure_model,
    sharpness,
    signal_noise,
    spearman_rows,
)
from harness.layers import builtin_names
from harness.layers.protocol import mixer_hooks
from harness.model import LanguageModel, ModelConfig

T = 12


def uniform(T: int) -> torch.Tensor:
    w = torch.ones(T, T, dtype=torch.float64).tril()
    return w / w.sum(-1, keepdim=True)


def test_uniform_weights():
    target = torch.zeros(T, dtype=torch.long)
    m = sharpness(uniform(T), target)
    n = torch.arange(1, T + 1, dtype=torch.float64)
    assert torch.allclose(m["entropy"], torch.log(n))
    assert torch.allclose(m["norm_entropy"][1:], torch.ones(T - 1, dtype=torch.float64))
    assert math.isnan(m["norm_entropy"][0])  # log 1 = 0: undefined for a one-token prefix
    assert torch.allclose(m["eff_support"], n)
    assert torch.allclose(m["max_weight"], 1 / n)
    assert torch.allclose(m["target_weight"], 1 / n)
    assert torch.allclose(m["target_rank"], 1 + (n - 1) / 2)  # all tied: the middle rank


def test_one_hot_weights():
    target = torch.tensor([0, 0, 1, 2, 0, 5])
    w = torch.nn.functional.one_hot(target, 6).to(torch.float64)
    m = sharpness(w, target)
    assert torch.equal(m["entropy"], torch.zeros(6, dtype=torch.float64))
    assert torch.equal(m["eff_support"], torch.ones(6, dtype=torch.float64))
    assert torch.equal(m["max_weight"], torch.ones(6, dtype=torch.float64))
    assert torch.equal(m["target_weight"], torch.ones(6, dtype=torch.float64))
    assert torch.equal(m["target_rank"], torch.ones(6, dtype=torch.float64))


def test_rank_missing_target_and_upper_triangle():
    w = torch.tensor([[1.0, 9.0, 9.0], [0.5, 0.5, 9.0], [0.5, 0.3, 0.2]], dtype=torch.float64)
    m = sharpness(w, torch.tensor([-1, 0, 1]))
    assert math.isnan(m["target_weight"][0]) and math.isnan(m["target_rank"][0])
    assert m["target_weight"][1] == 0.5  # entries above the diagonal are ignored
    assert m["target_rank"][1] == 1.5
    assert m["target_weight"][2] == pytest.approx(0.3) and m["target_rank"][2] == 2
    assert m["max_weight"][2] == pytest.approx(0.5)


def test_signed_weights_use_magnitudes():
    w = torch.tensor([[1.0, 0.0], [-3.0, 1.0]], dtype=torch.float64)
    m = sharpness(w, torch.tensor([0, 0]))
    assert m["target_weight"][1] == pytest.approx(0.75)
    assert m["entropy"][1] == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))


def test_monotonicity():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(3, T, T, generator=g, dtype=torch.float64)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    ones = torch.ones(3, T - 1, dtype=torch.float64)
    soft = scores.masked_fill(~mask, -math.inf).softmax(-1)
    assert torch.allclose(sharpness(soft, scores=scores)["monotonicity"][:, 1:], ones)
    anti = (-scores).masked_fill(~mask, -math.inf).softmax(-1)
    assert torch.allclose(sharpness(anti, scores=scores)["monotonicity"][:, 1:], -ones)
    assert torch.isnan(sharpness(uniform(T), scores=scores[0])["monotonicity"]).all()  # constant rows


def test_monotonicity_is_hedgehogs_on_shared_inputs():
    """Hedgehog's protocol: the same q and k through each map, each map's weights ranked against
    softmax's score q.k / sqrt(d). Softmax and the identity map keep its order by construction
    (1); elu+1 and FAVOR+ do not (below 1, still positive); a decay reorders the keys by age."""
    from harness import features, ops

    g = torch.Generator().manual_seed(3)
    d = 8
    q, k = (torch.randn(1, 1, T, d, generator=g, dtype=torch.float64) for _ in range(2))
    scores = (q @ k.transpose(-1, -2))[0, 0] / math.sqrt(d)
    mask = torch.ones(T, T, dtype=torch.bool).tril()

    def score(weights):
        return float(sharpness(weights[0, 0], scores=scores)["monotonicity"][2:].mean())

    soft = scores.masked_fill(~mask, -math.inf).softmax(-1)[None, None]
    assert score(soft) == pytest.approx(1.0)
    got = {}
    for name in ("identity", "elu1", "favor"):
        phi = features.feature_map(name, d, m=4 * d, seed=0)
        normalize = name != "identity"  # the identity map's weights are the raw q.k
        got[name] = score(ops.linear_weights(phi(q, is_query=True), phi(k, is_query=False), normalize=normalize))
    assert got["identity"] == pytest.approx(1.0)
    assert 0.0 < got["elu1"] < 0.99 and 0.0 < got["favor"] < 0.99
    decayed = scores * (0.7 ** (torch.arange(T)[:, None] - torch.arange(T)[None, :])).clamp(max=1.0)
    assert score(decayed.masked_fill(~mask, 0.0)[None, None]) < 0.99


def test_spearman_matches_scipy_with_ties():
    g = torch.Generator().manual_seed(1)
    a = torch.randint(0, 4, (5, 20), generator=g).to(torch.float64)  # many ties
    b = torch.randn(5, 20, generator=g, dtype=torch.float64)
    valid = torch.arange(20) < torch.tensor([20, 15, 10, 5, 3])[:, None]
    rho = spearman_rows(a, b, valid)
    for r in range(5):
        n = int(valid[r].sum())
        assert rho[r].item() == pytest.approx(spearmanr(a[r, :n], b[r, :n]).statistic, abs=1e-12)


def test_signal_noise_split():
    # one-hot on the target: no crosstalk
    v = torch.randn(1, 4, 3, dtype=torch.float64)
    target = torch.tensor([[-1, 0, 1, 0]])
    s2, n2 = signal_noise(torch.nn.functional.one_hot(target.clamp_min(0), 4).double(), v, target)
    assert torch.allclose(n2, torch.zeros(1, 4, dtype=torch.float64))
    assert s2[0, 0] == 0  # no target: nothing counted
    # uniform over 4 orthonormal values: signal 1/4, noise sqrt(3)/4
    v = torch.eye(4, dtype=torch.float64)[None]
    s2, n2 = signal_noise(uniform(4)[None], v, torch.tensor([[-1, -1, -1, 2]]))
    assert s2[0, 3].item() == pytest.approx(1 / 16) and n2[0, 3].item() == pytest.approx(3 / 16)


def test_effective_count():
    target = torch.tensor([-1, 0, 0, 2, 1])
    n = effective_count(decay_gain_sq(None, 5), target)
    assert math.isnan(n[0]) and n[1:].tolist() == [1.0, 2.0, 3.0, 4.0]  # every other earlier position
    gamma = 0.9
    ld = torch.full((5,), math.log(gamma), dtype=torch.float64)
    n = effective_count(decay_gain_sq(ld, 5), target)
    # row 4, target 1: sum_{j != 1} gamma^(2(4-j)) / gamma^(2*3)
    expected = sum(gamma ** (2 * (4 - j)) for j in (0, 2, 3, 4)) / gamma**6
    assert n[4].item() == pytest.approx(expected)
    per_dim = ld[:, None].expand(5, 3)  # the same decay in every key dimension
    assert torch.allclose(decay_gain_sq(per_dim, 5, per_dim=True), decay_gain_sq(ld, 5))
    # mamba: write j is scaled by dt_j as well as decayed
    dt = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5], dtype=torch.float64)
    g2 = decay_gain_sq(ld, 5, write_scale=dt)
    assert g2[4, 1].item() == pytest.approx((0.2 * gamma**3) ** 2)
    assert g2[1, 3].item() == 0  # the future is not in the state
    rows = decay_gain_sq(ld, 5, write_scale=dt, positions=torch.tensor([4, 2]))
    assert torch.equal(rows, g2[[4, 2]])


def test_sharpness_on_selected_rows_matches_full():
    g = torch.Generator().manual_seed(2)
    w = torch.rand(2, T, T, generator=g, dtype=torch.float64)
    scores = torch.randn(2, T, T, generator=g, dtype=torch.float64)
    target = torch.randint(0, 3, (2, T), generator=g)
    full = sharpness(w, target, scores=scores)
    rows = torch.tensor([3, 7, 11])
    part = sharpness(w[:, rows], target[:, rows], scores=scores[:, rows], positions=rows)
    for name, value in part.items():
        assert torch.allclose(value, full[name][:, rows], equal_nan=True), name


def tiny_model(name: str, **kw) -> LanguageModel:
    torch.manual_seed(0)
    cfg = ModelConfig(name=name, d_model=16, n_layers=2, n_heads=2, chunk_size=8, **kw)
    return LanguageModel(cfg, 24, 64).double().eval()


@pytest.mark.parametrize("variant", [*builtin_names(), "mamba-gate=per_dim", "retnet-retnet_heads=4",
                                     "deltanet-rule=additive", "gated_deltanet-rule=additive", "dpfp-dpfp_nu=3"])
def test_effective_weights_reproduce_the_read_out(variant):
    """sum_j a_ij v_j over the hooked v equals what the op returned (hook_out)."""
    name, _, setting = variant.partition("-")
    kw = dict(mamba_heads=1, retnet_heads=1)  # one decay head per q/k head unless the variant asks
    if setting:
        key, value = setting.split("=")
        kw[key] = int(value) if value.isdigit() else value
    model = tiny_model(name, **kw)
    heads = 2 * (kw["retnet_heads"] if name == "retnet" else 1)  # each decay head is a head of a_ij
    x = torch.randint(1, 24, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), capture(model) as cache:
        model(x)
    for layer, mixer in enumerate(model.mixers()):
        hooks = mixer_hooks(mixer, cache, f"layers.{layer}.mixer.")
        a = mixer.effective_weights(hooks)
        assert a.shape == (2, heads, 20, 20)
        assert torch.allclose(a @ hooks["v"], hooks["out"], rtol=0, atol=1e-10)
        rows = torch.tensor([3, 7, 19])
        part = mixer.effective_weights(hooks, rows=rows)  # built for those rows alone: O(R T)
        assert part.shape == (2, heads, 3, 20)
        torch.testing.assert_close(part, a[:, :, rows], rtol=0, atol=1e-13)
        assert torch.allclose(part @ hooks["v"], hooks["out"][:, :, rows], rtol=0, atol=1e-10)


def test_mamba_decay_heads_are_measured_as_heads():
    """With several decay heads per q/k head each is a head of the effective weights."""
    model = tiny_model("mamba", mamba_heads=2)  # 2 decay heads per q/k head
    x = torch.randint(1, 24, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), capture(model) as cache:
        model(x)
    hooks = mixer_hooks(model.mixers()[0], cache, "layers.0.mixer.")
    a = model.mixers()[0].effective_weights(hooks)
    assert a.shape == (2, 4, 20, 20)
    assert torch.allclose(a @ hooks["v"], hooks["out"], rtol=0, atol=1e-10)
    out = measure_model(model, recall_batch(B=4), max_examples=4)
    assert {r["head"] for r in out["heads"]} == {0, 1, 2, 3}


def recall_batch(B: int = 4, T: int = 24):
    from types import SimpleNamespace

    g = torch.Generator().manual_seed(3)
    inputs = torch.randint(1, 24, (B, T), generator=g)
    target_pos = torch.full((B, T), -1)
    target_pos[:, 16:] = torch.tensor([1, 3, 5, 7, 9, 11, 13, 15])
    slice_value = torch.where(target_pos >= 0, torch.tensor([4, 8] * (B // 2))[:, None], -1)
    return SimpleNamespace(inputs=inputs, target_pos=target_pos, slice_value=slice_value, slice_name="num_pairs")


@pytest.mark.parametrize("variant", [*builtin_names(), "linear-normalize"])
def test_a_mixer_that_declares_monotone_weights_measures_one_in_float64(variant):
    """monotone_in_score is a claim about the map, which the sharpness figure takes on trust:
    where a mixer makes it, its weights order every row exactly as softmax's score does
    (Spearman 1 in float64, untrained). Softmax and the undivided identity map make it; a
    divided one (phi(q).z may be negative and reverse a row) and every other built-in do not."""
    name, _, divided = variant.partition("-")
    model = tiny_model(name, **({"normalize": True} if divided else {}))
    declared = {bool(m.monotone_in_score) for m in model.mixers()}
    assert declared == {name == "softmax" or (name == "linear" and not divided)}
    if declared == {True}:
        heads = measure_model(model, recall_batch(B=6), max_examples=4)["heads"]
        assert heads and all(r["monotone_in_score"] is True for r in heads)
        assert all(r["monotonicity"] == pytest.approx(1.0, abs=1e-9) for r in heads)


@pytest.mark.parametrize("name", ["softmax", "elu", "mamba", "gated_deltanet"])
def test_measure_model_tables(name):
    model = tiny_model(name).train()
    out = measure_model(model, recall_batch(B=6), max_examples=4)
    assert model.training  # mode restored
    heads = out["heads"]
    H = 2 * getattr(model.mixers()[0], "per_group", 1)  # mamba: each decay head is a head
    assert len(heads) == 2 * H * 2  # layers x heads x slice values
    assert {(r["layer"], r["head"], r["value"]) for r in heads} == {
        (l, h, v) for l in range(2) for h in range(H) for v in (4, 8)
    }
    keys = ["layer", "head", "slice", "value", "seq_len", "entropy", "norm_entropy", "eff_support", "max_weight",
            "target_weight", "target_rank", "monotonicity", "snr_measured", "snr_predicted"]
    decay = ["log_decay"] if name in ("mamba", "gated_deltanet") else []
    for r in heads:
        assert list(r) == keys + decay + ["monotone_in_score"] and r["slice"] == "num_pairs" and r["seq_len"] == 24
        # what the mixer declares: softmax's weights are its score's softmax, the others' are not
        assert r["monotone_in_score"] is (name == "softmax")
        for k in keys[5:] + decay:
            assert math.isfinite(r[k]), (k, r)
        assert 0 < r["target_weight"] <= 1 and r["max_weight"] <= 1  # the span's sum may pass the max
        assert 1 <= r["target_rank"] and 1 <= r["eff_support"] <= 24
    s = out["summary"]
    assert {"target_weight", "entropy", "snr_measured", "snr_predicted"} <= set(s)
    pooled = {}  # equal query counts per slice value here, so pooling is the plain mean
    for r in heads:
        pooled.setdefault((r["layer"], r["head"]), []).append(r["target_weight"])
    pooled = {key: sum(v) / len(v) for key, v in pooled.items()}
    best = max(pooled, key=pooled.get)
    assert (s["retrieval_layer"], s["retrieval_head"]) == best
    assert s["target_weight"] == pytest.approx(pooled[best])


def test_answer_span_counts_the_positions_the_conv_spreads_a_value_over():
    """Row i=4 with target t=1: weights 0.1, 0.2, 0.4, 0.05, 0.25 on positions 0..4."""
    w = torch.tensor([[0.1, 0.2, 0.4, 0.05, 0.25]], dtype=torch.float64)
    v = torch.eye(5, dtype=torch.float64)  # o = w, so the split is readable
    tp, pos = torch.tensor([1]), torch.tensor([4])
    one = sharpness(w, tp, positions=pos)
    two = sharpness(w, tp, positions=pos, span=2)
    assert one["target_weight"].item() == pytest.approx(0.2) and one["target_rank"].item() == 3
    assert two["target_weight"].item() == pytest.approx(0.6) and two["target_rank"].item() == 1
    sig, noise = signal_noise(w, v, tp, span=2)
    assert sig.item() == pytest.approx(0.2**2 + 0.4**2) and noise.item() == pytest.approx(0.1**2 + 0.05**2 + 0.25**2)
    other, target = crosstalk_mass(torch.ones(1, 5, dtype=torch.float64), tp, span=3)
    assert target.item() == 3 and other.item() == 2
    assert answer_span(tiny_model("elu")) == tiny_model("elu").cfg.conv_size


def test_measure_model_runs_without_autograd():
    model = tiny_model("elu")
    seen = []
    mixer = model.mixers()[0]
    inner = mixer.effective_weights
    mixer.effective_weights = lambda *args, **kw: (seen.append(torch.is_grad_enabled()), inner(*args, **kw))[1]
    measure_model(model, recall_batch(), max_examples=2)
    assert seen and not any(seen)


def test_measure_model_without_queries():
    batch = recall_batch()
    batch.target_pos[:] = -1
    out = measure_model(tiny_model("elu"), batch)
    assert out["heads"] == [] and math.isnan(out["summary"]["target_weight"])


def test_predicted_snr_without_decay_counts_positions():
    """Undecayed mixers: N_eff = number of other positions in the prefix, SNR = sqrt(d_key / mean N_eff)
    (without the short convolution, so that the answer span is the one position t)."""
    model = tiny_model("elu", short_conv=False)
    batch = recall_batch()
    out = measure_model(model, batch)
    rows = [r for r in out["heads"] if r["value"] == 4]
    positions = torch.arange(16, 24, dtype=torch.float64)  # query rows: i others besides the target
    assert rows[0]["snr_predicted"] == pytest.approx(math.sqrt(model.d_key / positions.mean().item()))


def test_measure_on_a_real_task_batch():
    from harness.tasks import get_task

    task = get_task("recall")
    cfg = task.Config()
    batch = task.make_batch(cfg, 4, seed=0)
    model = LanguageModel(ModelConfig(name="retnet", d_model=16, n_heads=2), cfg.vocab_size, cfg.seq_len)
    out = measure_model(model, batch, max_examples=2)
    assert out["heads"] and all(r["slice"] == batch.slice_name for r in out["heads"])
    assert math.isfinite(out["summary"]["snr_measured"])


def test_measurement_streamed_over_examples_is_the_single_pass():
    model = tiny_model("retnet")
    batch = recall_batch(B=6)
    whole = measure_model(model, batch, tokens=10_000)
    streamed = measure_model(model, batch, tokens=1)  # one example per forward pass
    def numbers(row):
        return {k: v for k, v in row.items() if isinstance(v, (int, float))}

    assert numbers(whole["summary"]) == pytest.approx(numbers(streamed["summary"]), rel=1e-12, nan_ok=True)
    assert len(whole["heads"]) == len(streamed["heads"]) == 2 * 8 * 2  # layers x decay heads x N
    for a, b in zip(whole["heads"], streamed["heads"]):
        assert numbers(a) == pytest.approx(numbers(b), rel=1e-12, nan_ok=True)


@pytest.mark.parametrize("name", ["softmax", "elu", "mamba"])
def test_measurement_memory_grows_linearly_with_length(name):
    """Rows at the query positions only: quadrupling T about quadruples the peak (a (T, T)
    weight matrix per example would make it 16 times)."""
    from harness.peak_memory import LiveMemory

    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(name=name, d_model=16, n_heads=2, rotary=True, pos_emb="none"), 24, 4096)

    def peak(t):
        g = torch.Generator().manual_seed(1)
        inputs = torch.randint(1, 24, (2, t), generator=g)
        target_pos = torch.full((2, t), -1)
        target_pos[:, -4:] = torch.tensor([1, 3, 5, 7])
        slice_value = torch.where(target_pos >= 0, 4, -1)
        batch = dict(inputs=inputs, target_pos=target_pos, slice_value=slice_value, slice_name="num_pairs")
        with LiveMemory(list(model.parameters()) + [inputs]) as mem:
            measure_model(model, batch, tokens=t)
        return mem.peak

    small, big = peak(512), peak(2048)
    assert big / small < 5.5, f"peak grew {big / small:.1f}x when T quadrupled"
