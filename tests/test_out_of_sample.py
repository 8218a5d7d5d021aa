"""The out-of-sample law (harness.measure.out_of_sample): statistics measured at one setting
predict the SNR and accuracy at settings the model was never measured at.

Known answer: random keys frozen in place of a trained projection (tests/test_trained_theory.py)
are the untrained probe's setting, so statistics measured at N = 16 must predict the probe's
accuracy at N = 32 .. 128, where nothing of the model was looked at.
"""
from __future__ import annotations

import dataclasses
import inspect
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_trained_theory import frozen_random_keys

from harness import ops
from harness.measure import probe, theory
from harness.measure.out_of_sample import (Reads, TrainStats, flat_n_eff, law_n_eff, predict_baselines,
                                           predict_from_train, read_accuracy, reads_of, survival_sums)
from harness.measure.trained import crosstalk_mass, decay_gain_sq
from harness.measure.trained_theory import train_statistics

D, TRAIN_N, C, EXAMPLES = 32, 16, 64, 384
TEST_NS = (32, 64, 128)  # 2x, 4x, 8x the measured N


def frozen_delta_rule(d: int, n: int, examples: int, candidates: int, seed: int = 0):
    """frozen_random_keys for the delta rule: unit keys (the probe's, normalised), q = the asked
    key, every write with beta = 1, fed to the op as DeltaNet's forward feeds it."""
    model, batch = frozen_random_keys("deltanet", d, n, examples, candidates, seed)
    mixer = model.layers[0].mixer
    q, k, v = mixer.project_qkv(None)  # the frozen tensors, (B, 1, T, .)
    q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)

    def forward(x):
        mixer.hook_q_raw(q), mixer.hook_k_raw(k)  # no feature map: raw == fed
        fed = mixer.hook_q(q), mixer.hook_k(k), mixer.hook_v(v)
        beta = mixer.hook_beta(torch.ones(q.shape[:3], dtype=q.dtype))
        mixer.hook_out(ops.delta_attention(*fed, beta))
        return torch.zeros_like(x)

    mixer.forward = forward
    return model, batch


def layout(n: int, candidates: int = C) -> Reads:
    """The probe's reads with n + 1 pairs: every pair read once, after the last write (the
    frozen-keys task, measured at n = TRAIN_N, reads n of them)."""
    return Reads(position=np.full(n + 1, float(n)), target=np.arange(n + 1.0), candidates=candidates)


@pytest.fixture(scope="module")
def measured():
    """Statistics of each frozen memory at N = TRAIN_N (one measurement per mixer for the module)."""
    out = {}
    for name in ("linear", "retnet", "deltanet"):
        if name == "deltanet":
            model, batch = frozen_delta_rule(D, TRAIN_N, EXAMPLES, C)
        else:
            model, batch = frozen_random_keys(name, D, TRAIN_N, EXAMPLES, C)
        out[name] = train_statistics(model, batch, num_pairs=TRAIN_N, retrieval=(0, 0))  # the one head
    return out


@pytest.mark.parametrize("name", ["linear", "retnet", "deltanet"])
def test_statistics_at_one_n_predict_the_probe_at_others(measured, name):
    """linear: no decay; retnet: its constant decay (gamma = 1 - 2^-5); deltanet: the delta law,
    whose one fitted number d_delta must come out as the keys' dimension."""
    stats, status = measured[name]
    assert status == "ok" and stats.num_pairs == TRAIN_N and stats.seq_len == TRAIN_N + 1
    assert stats.law == ("delta" if name == "deltanet" else "additive")
    assert stats.n_eff_law == pytest.approx(stats.n_eff, rel=1e-9)  # the decay model holds in sample
    if name == "retnet":
        assert stats.log_decay[0][0] == pytest.approx(math.log1p(-2.0**-5), rel=1e-9)
    if name == "deltanet":
        assert stats.d_delta == pytest.approx(D, rel=0.1)
    for n in TEST_NS:
        got = predict_from_train(stats, layout(n))
        want = probe.probe_row(name, D, n + 1, candidates=C, min_queries=4096)
        # 0.05: the accuracy model's own error against simulation (~0.02, harness.measure.theory),
        # 4,096 probe reads (~0.01) and the statistics of 384 measured reads (~0.01)
        assert got["acc_predicted_from_train"] == pytest.approx(want["acc_measured"], abs=0.05), n
        assert got["snr_predicted_from_train"] == pytest.approx(want["snr_measured"], rel=0.1), n


def test_at_the_training_setting_it_is_the_readout(measured):
    """Without decay every read of the training layout has N_eff = n: the prediction there is
    exactly the same-setting read-out (the law adds nothing, and hides nothing, in sample)."""
    stats, _ = measured["linear"]
    got = predict_from_train(stats, layout(TRAIN_N, stats.candidates))  # the answers the batch drew
    assert got["snr_predicted_from_train"] == pytest.approx(stats.snr_readout, rel=1e-9)
    assert got["acc_predicted_from_train"] == pytest.approx(stats.acc_readout, abs=1e-6)


def test_the_prediction_cannot_see_the_model(measured):
    """predict_from_train takes the statistics and the target setting's reads and nothing else;
    the statistics are plain numbers (no tensor, no module), and hand-made reads suffice."""
    assert list(inspect.signature(predict_from_train).parameters) == ["stats", "reads"]
    stats, _ = measured["retnet"]
    for f in dataclasses.fields(TrainStats):
        value = getattr(stats, f.name)
        flat = [x for part in value for x in (part if isinstance(part, tuple) else (part,))] \
            if isinstance(value, tuple) else [value]
        assert all(x is None or isinstance(x, (int, float, str)) for x in flat), f.name
    assert np.isfinite(predict_from_train(stats, layout(256))["acc_predicted_from_train"])


def test_reads_of_a_task_batch():
    _, batch = frozen_random_keys("linear", 8, 5, 6, 16)
    reads = reads_of(batch)
    assert reads.position.tolist() == [5.0] * 6
    assert reads.target.tolist() == batch.target_pos[:, 5].tolist()
    assert reads.candidates == int(torch.unique(batch.targets[:, 5]).numel())


@pytest.mark.parametrize("per_dim", [False, True])
def test_survival_sums_are_the_measured_gains(per_dim):
    """The closed-form geometric sums against harness.measure.trained's explicit ones
    (decay_gain_sq, crosstalk_mass) for a constant decay, spans clipped by the read."""
    T, span = 40, 3
    lam = torch.tensor([-0.05, -0.2, -0.01], dtype=torch.float64) if per_dim else torch.tensor(-0.07, dtype=torch.float64)
    positions = torch.tensor([5, 12, 30, 39, 39])
    target = torch.tensor([4, 0, 29, 10, 38])
    ld = lam.expand(T, 3) if per_dim else lam.expand(T)
    g2 = decay_gain_sq(ld, T, per_dim=per_dim, positions=positions)  # (R, T)
    other, on = crosstalk_mass(g2, target, span)
    got = survival_sums(Reads(positions.double().numpy(), target.double().numpy(), 2), span,
                        lam.numpy() if per_dim else [float(lam)], write_gain=2.0)
    assert np.allclose(got["gain_target"], 2.0 * on.numpy(), rtol=1e-12)
    assert np.allclose(got["gain_other"], other.numpy(), rtol=1e-12)
    if not per_dim:
        off = g2 * (torch.arange(T) <= positions[:, None]) * ~((torch.arange(T) >= target[:, None])
                                                                & (torch.arange(T) < target[:, None] + span))
        assert np.allclose(got["gain_other_sq"], off.square().sum(-1).numpy(), rtol=1e-12)


def test_additive_state_grows_and_a_decay_saturates(measured):
    """N_eff of the law: linear in N without decay; bounded by the decay's horizon with one."""
    linear, retnet = measured["linear"][0], measured["retnet"][0]
    assert [law_n_eff(linear, layout(n)) for n in (64, 256)] == [64.0, 256.0]
    horizon = retnet.as_dict()["decay_horizon"]
    # the slowest of the default model.retnet_heads = 4 decay heads, gamma = 1 - 2^-(5 + 3)
    assert horizon == pytest.approx(1 / (1 - (1 - 2.0**-8) ** 2))
    far = law_n_eff(retnet, layout(4096))
    assert far > 1e3  # old targets fade: the ratio of sums grows, the per-read count is
    got = survival_sums(layout(4096), 1, retnet.log_decay[0])
    newest = got["gain_target"].argmax()
    assert got["gain_other"][newest] < horizon  # what the newest pair sees saturates


def test_delta_read_energy_at_is_delta_read_energy():
    for d, n, log_a in [(16, 40, 0.0), (32, 100, -0.03), (8.5, 30, -0.2)]:
        sig, cross = theory.delta_read_energy(d, theory.decay_pair_weights(np.full(n, log_a)))
        i = np.arange(n)
        sig2, cross2 = theory.delta_read_energy_at(d, i, n - 1 - i, log_a)
        assert np.allclose(sig2, sig, rtol=1e-10) and np.allclose(cross2, cross, rtol=1e-10)


def test_a_law_that_does_not_apply_says_so(measured):
    stats = dataclasses.replace(measured["linear"][0], law="not applicable: window")
    assert all(math.isnan(v) for v in predict_from_train(stats, layout(32)).values())


def test_the_baselines_carry_the_training_point_with_the_random_key_slope(measured):
    """Anchored: the training read-out SNR scaled by N_flat(training) / N_flat(test), so at 4x the
    flat count its SNR is half the training one; nominal: the random-key law at d_key. Both
    through the law's own accuracy map, and both fall as N grows."""
    stats, _ = measured["linear"]
    assert stats.d_key == D and stats.n_eff_flat == pytest.approx(TRAIN_N)  # every read sees n others
    n = 4 * TRAIN_N
    got = predict_baselines(stats, layout(n))
    # layout(n): every read has n other writes before it, the flat count is n at every read
    assert flat_n_eff(layout(n), 1) == n
    assert got["acc_baseline_anchored"] == pytest.approx(
        read_accuracy(np.full(n + 1, stats.snr_readout / 2), C, stats.value_dim, n), rel=1e-9)
    assert got["acc_baseline_nominal"] == pytest.approx(
        read_accuracy(np.full(n + 1, math.sqrt(D / n)), C, stats.value_dim, n), rel=1e-9)
    far = predict_baselines(stats, layout(8 * TRAIN_N))
    assert far["acc_baseline_anchored"] < got["acc_baseline_anchored"]
    assert far["acc_baseline_nominal"] < got["acc_baseline_nominal"]


def test_a_decay_law_beats_the_flat_baselines_where_the_decay_matters(measured):
    """retnet's frozen memory at 8x its training N: the flat count keeps growing while the decay
    caps what the newest pairs see, so the law is nearer the probe than either baseline."""
    stats, _ = measured["retnet"]
    n = TEST_NS[-1]
    want = probe.probe_row("retnet", D, n + 1, candidates=C, min_queries=4096)["acc_measured"]
    law = predict_from_train(stats, layout(n))["acc_predicted_from_train"]
    base = predict_baselines(stats, layout(n))
    assert abs(law - want) < min(abs(base[k] - want) for k in base), (law, base, want)


def test_statistics_come_back_from_their_record(measured):
    """results.json holds TrainStats.as_dict(), NaN written as null: from_record returns them."""
    import json

    for name in ("linear", "deltanet"):
        stats, _ = measured[name]
        record = json.loads(json.dumps(stats.as_dict()).replace("NaN", "null"))
        back = TrainStats.from_record({"status": "ok", **record})
        for field in dataclasses.fields(TrainStats):
            mine, theirs = getattr(back, field.name), getattr(stats, field.name)
            assert mine == theirs or (isinstance(mine, float) and math.isnan(mine) and math.isnan(theirs)), field.name


@pytest.mark.parametrize("name", ["linear", "deltanet"])
def test_a_wider_key_side_is_predicted_by_the_law_alone(measured, name):
    """at_key_width(r): the law's SNR^2 at the same reads r times the measured one (d_kernel, or the
    delta rule's d_delta, in proportion); the nominal baseline at r d_key; the anchored baseline,
    which knows no width, unchanged. So the three part where the width changes."""
    stats, _ = measured[name]
    reads = layout(TRAIN_N)
    wide = stats.at_key_width(2.0)
    assert wide.d_key == 2 * stats.d_key and wide.snr_readout == stats.snr_readout
    base, twice = predict_baselines(stats, reads), predict_baselines(wide, reads)
    assert twice["acc_baseline_anchored"] == base["acc_baseline_anchored"]
    assert twice["acc_baseline_nominal"] > base["acc_baseline_nominal"]
    law, law2 = (predict_from_train(s, reads)["snr_predicted_from_train"] for s in (stats, wide))
    if name == "linear":
        assert law2 ** 2 == pytest.approx(2 * law ** 2, rel=1e-12)
    else:  # the delta law is not linear in d_delta, but grows with it
        assert law2 > law and wide.d_delta == 2 * stats.d_delta


def test_the_law_is_the_anchored_baseline_where_the_algebra_says_so(measured):
    """One additive head without decay: the law out of sample is the anchored baseline to rounding
    (anchored_by_algebra), so no win can be read from it; with a decay the two part."""
    linear, retnet = measured["linear"][0], measured["retnet"][0]
    assert linear.anchored_by_algebra and not retnet.anchored_by_algebra and not measured["deltanet"][0].anchored_by_algebra
    for n in TEST_NS:
        law = predict_from_train(linear, layout(n))["acc_predicted_from_train"]
        assert law == pytest.approx(predict_baselines(linear, layout(n))["acc_baseline_anchored"], rel=1e-12, abs=1e-12)
    n = TEST_NS[-1]
    assert abs(predict_from_train(retnet, layout(n))["acc_predicted_from_train"]
               - predict_baselines(retnet, layout(n))["acc_baseline_anchored"]) > 0.01
