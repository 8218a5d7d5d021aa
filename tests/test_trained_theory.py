"""The crosstalk law from a trained model's own statistics (harness.measure.trained_theory).

Known answer: random keys frozen in place of a trained projection (each query equal to its
stored key, values from a codebook) are the untrained probe's setting, so the module must
return the probe's d_kernel, snr_kernel and acc_kernel.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from harness.measure import probe, theory
from harness.measure.trained_theory import codebook_dimension, measure_trained_theory, merge_rows, read_sums
from harness.model import LanguageModel, ModelConfig


def frozen_random_keys(name: str, d: int, n: int, examples: int, candidates: int, seed: int = 0):
    """A 1-layer model whose q/k/v projection is replaced by random pairs, and its batch.

    Each example writes n random keys (the probe's: uniform on the sphere of radius sqrt(d))
    with codebook values, then one query at position n asks one of them with q = its key; the
    query position writes a fresh random pair too (every position writes). So the read sees
    n + 1 random writes, the probe's setting with n + 1 pairs.
    """
    torch.manual_seed(seed)
    cfg = ModelConfig(name=name, d_model=d, n_heads=1, n_layers=1, short_conv=False)
    T, vocab = n + 1, candidates + 1
    model = LanguageModel(cfg, vocab, T).double().eval()
    gen = torch.Generator().manual_seed(seed + 1)
    keys = probe.random_keys((examples, T), d, gen)  # (B, T, d): n pairs and the query's own write
    book = probe.codebook(candidates, d, seed)  # (C, d)
    idx = torch.randint(candidates, (examples, T), generator=gen)
    asked = torch.randint(n, (examples,), generator=gen)  # the pair each example's query asks
    q = torch.zeros(examples, 1, T, d, dtype=torch.float64)
    q[:, 0, n] = keys[torch.arange(examples), asked]
    k, v = keys[:, None].clone(), book[idx][:, None].clone()  # (B, 1, T, .)
    model.layers[0].mixer.project_qkv = lambda x: (q, k, v)  # frozen in place of the projection

    inputs = torch.randint(1, vocab, (examples, T), generator=gen)
    target_pos = torch.full((examples, T), -1)
    target_pos[:, n] = asked
    targets = torch.full((examples, T), -100)
    targets[:, n] = 1 + idx[torch.arange(examples), asked]  # token = codebook entry + 1
    slice_value = torch.where(target_pos >= 0, n, -1)
    batch = SimpleNamespace(inputs=inputs, targets=targets, target_pos=target_pos, slice_value=slice_value,
                            slice_name="num_pairs")
    return model, batch


@pytest.mark.parametrize("name", ["linear", "elu"])
def test_frozen_random_keys_give_the_untrained_probe_numbers(name):
    d, n, examples, C = 32, 64, 384, 64
    model, batch = frozen_random_keys(name, d, n, examples, C)
    found = measure_trained_theory(model, batch, retrieval=(0, 0))
    got = found["rows"][(0, 0, n)]
    assert found["summary"] == got  # one slice value: the pooled reads are the same reads
    want = probe.probe_row(name, d, n + 1, candidates=C, min_queries=4096)
    assert got["candidates"] == C
    assert got["n_eff"] == pytest.approx(want["n_eff"], rel=1e-12)  # n other writes, no decay
    assert got["pairs"] == pytest.approx(n)
    assert got["value_dim"] == pytest.approx(d, rel=0.15)  # C random directions in R^d
    # the kernel's effective dimension: d for the identity map, ~2.1 for elu+1, within sampling error
    assert want["d_kernel"] == pytest.approx(d if name == "linear" else 2.1, rel=0.05)
    assert got["d_kernel"] == pytest.approx(want["d_kernel"], rel=0.1)
    assert got["snr_readout_trained"] == pytest.approx(want["snr_kernel"], rel=0.05)
    assert got["acc_readout_trained"] == pytest.approx(want["acc_kernel"], abs=0.05)


def test_frozen_random_keys_predict_what_the_probe_measures():
    """Where the law holds (the identity map), the prediction from the model's statistics
    matches the probe's measured SNR and accuracy as well as its predicted ones."""
    d, n, C = 32, 64, 64
    model, batch = frozen_random_keys("linear", d, n, 384, C)
    got = measure_trained_theory(model, batch, retrieval=(0, 0))["summary"]
    want = probe.probe_row("linear", d, n + 1, candidates=C, min_queries=4096)
    assert got["snr_readout_trained"] == pytest.approx(want["snr_measured"], rel=0.08)
    assert got["acc_readout_trained"] == pytest.approx(want["acc_measured"], abs=0.08)


def test_read_sums_factorise_the_weight_snr():
    """Per read, (kernel_target / kernel_other) / N_eff = sum_span a^2 / sum_other a^2."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(3, 5, 12, generator=g, dtype=torch.float64)
    positions = torch.tensor([6, 8, 9, 10, 11])
    log_decay = -torch.rand(3, 12, generator=g, dtype=torch.float64) * 0.3
    from harness.measure.trained import decay_gain_sq

    g2 = decay_gain_sq(log_decay, 12, positions=positions)  # (3, 5, 12)
    prefix = torch.arange(12) <= positions[:, None]
    a = torch.where(prefix, a * g2.sqrt(), torch.zeros_like(a))  # a = kappa g on the prefix
    tp = torch.tensor([[1, 2, 0, 3, 5]] * 3)
    s = read_sums(a, g2, tp, positions, span=2)
    on = (torch.arange(12) >= tp[..., None]) & (torch.arange(12) < tp[..., None] + 2) & prefix
    want = torch.where(on, a * a, 0).sum(-1) / torch.where(prefix & ~on, a * a, 0).sum(-1)
    got = s["kernel_target"] / s["kernel_other"] / (s["gain_other"] / s["gain_target"])
    assert torch.allclose(got, want, rtol=1e-12)
    no_target = read_sums(a, g2, torch.full_like(tp, -1), positions, span=2)
    assert all(float(v.abs().sum()) == 0 for v in no_target.values())


def test_codebook_dimension():
    g = torch.Generator().manual_seed(0)
    book = torch.randn(256, 16, generator=g, dtype=torch.float64)
    labels = torch.arange(256).repeat(3)
    dim, entries = codebook_dimension(book[labels], labels)
    assert entries == 256 and dim == pytest.approx(16, rel=0.1)  # isotropic: the full width
    flat = book.clone()
    flat[:, 4:] = 0  # a codebook in 4 of the 16 directions
    assert codebook_dimension(flat, torch.arange(256))[0] == pytest.approx(4, rel=0.15)
    assert math.isnan(codebook_dimension(book[:2], torch.arange(2))[0])


def test_merge_rows_adds_the_columns_by_layer_head_value():
    heads = [{"layer": 0, "head": 0, "value": 4, "entropy": 1.0}, {"layer": 0, "head": 0, "value": 8}]
    found = {"rows": {(0, 0, 4): {"d_kernel": 3.0}}}
    assert merge_rows(heads, found) == [{"layer": 0, "head": 0, "value": 4, "entropy": 1.0, "d_kernel": 3.0},
                                        {"layer": 0, "head": 0, "value": 8}]


def test_measured_on_a_trained_run(tmp_path):
    """A (tiny) trained run reports the trained-statistics law in its summary and heads rows."""
    from harness.config.compose import compose_config
    from harness.run.job import plan_for
    from harness.train.loop import train

    cfg = compose_config(["task=recall", "model=elu", "model.d_model=16", "trainer=debug", "logger=none",
                          "trainer.checkpoint=false", "task.test_num_pairs=[2,4]"])
    results = train(plan_for(cfg), tmp_path)
    s = results["summary"]
    for key in ("d_kernel", "snr_readout_trained", "acc_readout_trained", "n_eff", "value_dim", "candidates"):
        assert key in s and np.isfinite(s[key]), key
    assert s["measure_examples"] == 8  # trainer.measure_examples of the debug trainer
    rows = results["heads"]
    assert {r["value"] for r in rows} == {2, 4}
    assert all(np.isfinite(r["acc_readout_trained"]) and 0 <= r["acc_readout_trained"] <= 1 for r in rows)
    assert all(theory.predicted_snr(r["d_kernel"], r["n_eff"]) == pytest.approx(r["snr_readout_trained"])
               for r in rows)
    # out of sample: statistics at the training setting, a prediction per test setting
    stats = results["train_stats"]
    assert stats["status"] == "ok" and stats["law"] == "additive"
    assert stats["num_pairs"] == cfg.task.num_pairs and stats["seq_len"] > 0
    assert stats["n_eff_law"] == pytest.approx(stats["n_eff"])  # no decay: the layout is the count
    names = [row["name"] for row in results["settings"]]
    assert names == ["num_pairs=2", "num_pairs=4"]
    for row in results["settings"]:
        assert 0 <= row["acc_predicted_from_train"] <= 1 and row["snr_predicted_from_train"] > 0
        assert s[f"acc_predicted_from_train/{row['name']}"] == row["acc_predicted_from_train"]
        assert s[f"snr_predicted_from_train/{row['name']}"] == row["snr_predicted_from_train"]
    assert s["acc_predicted_from_train"] == pytest.approx(np.mean([r["acc_predicted_from_train"]
                                                                   for r in results["settings"]]))


@pytest.mark.parametrize("name", ["mamba", "retnet"])
def test_heads_read_out_together_are_pooled(name):
    """mamba's and retnet's decay heads of one q/k head share one prediction: the group's pooled sums."""
    import torch

    from harness.measure.trained_theory import SUMS, pool_heads

    g = torch.Generator().manual_seed(0)
    sums = {n: torch.rand(2, 3, 5, generator=g, dtype=torch.float64) for n in SUMS}
    pooled = pool_heads(sums)
    signal = (sums["kernel_target"] * sums["gain_target"]).sum(1)
    crosstalk = (sums["kernel_other"] * sums["gain_other"]).sum(1)
    got = pooled["kernel_target"] / pooled["kernel_other"] / (pooled["gain_other"] / pooled["gain_target"])
    assert torch.allclose(got, signal / crosstalk)  # the group's sum_span a^2 / sum_other a^2
    one = pool_heads({n: v[:, :1] for n, v in sums.items()})
    assert all(torch.allclose(one[n], sums[n][:, 0]) for n in SUMS)  # one head: unchanged

    from harness.model import LanguageModel, ModelConfig

    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(name=name, d_model=16, n_heads=1, n_layers=1), 24, 32).double()
    assert model.mixers()[0].heads_per_readout == 4
    batch = SimpleNamespace(inputs=torch.randint(1, 24, (3, 24), generator=g), slice_name="num_pairs",
                            target_pos=torch.full((3, 24), -1), targets=torch.full((3, 24), -100),
                            slice_value=torch.full((3, 24), -1))
    batch.target_pos[:, 16:] = torch.arange(1, 16, 2)
    batch.targets[:, 16:] = batch.inputs[:, 1:16:2]
    batch.slice_value[:, 16:] = 8
    rows = measure_trained_theory(model, batch)["rows"]
    assert {(l, h) for l, h, _ in rows} == {(0, h) for h in range(4)}  # the 4 decay heads
    assert len({tuple(sorted(r.items())) for r in rows.values()}) == 1  # one read-out, one prediction
