"""harness.measure.probe: random memories measured against harness.measure.theory.

Statistical tolerances are stated where they are used. Every run is seeded, so a test that
passes once passes always; the tolerances say how far a new seed could move the numbers.
"""

import math

import numpy as np
import pytest
import torch

from harness.layers.retnet import retnet_log_gammas
from harness.measure import probe, theory

LAW_DS = (32, 64, 128)
LAW_MULTIPLES = (1, 2, 4, 8, 16, 32, 64)  # N = d .. 64 d


@pytest.fixture(scope="module")
def law_rows():
    """Identity map, every (d, N = d..64d), three seeds each.

    A single state's ratio-of-means SNR varies between seeds by 2.5-4.4% (d = 32), 1.2-2.6%
    (d = 64) and ~0.9% (d = 128), its reads sharing one key set; each run therefore pools
    at least max(2, 256/d) independent states and 4096 reads, which puts the standard error
    of the three-seed mean at <= 0.5% everywhere. C = 64 keeps scoring cheap (SNR does not
    depend on C).
    """
    rows = {}
    for d in LAW_DS:
        for mult in LAW_MULTIPLES:
            n = mult * d
            pooled = max(4096, max(2, 256 // d) * n)
            rows[d, n] = [probe.probe_row("linear", d, n, seed=s, candidates=64, min_queries=pooled)
                          for s in range(3)]
    return rows


def test_identity_snr_within_5_percent_of_law(law_rows):
    """Measured SNR of the plain linear memory is sqrt(d/N) within 5% (standard error <= 0.5%,
    checked loosely from the three seeds themselves: < 1%)."""
    for (d, n), runs in law_rows.items():
        snr = np.array([r["snr_measured"] for r in runs]) / math.sqrt(d / n)
        se = snr.std(ddof=1) / math.sqrt(len(snr))
        assert se < 0.01, (d, n, se)
        assert abs(snr.mean() - 1) < 0.05, (d, n, snr)
        # the prediction, which counts the N - 1 other pairs, is closer still
        assert runs[0]["snr_predicted"] == pytest.approx(math.sqrt(d / (n - 1)))
        assert abs(np.mean([r["snr_measured"] for r in runs]) / runs[0]["snr_predicted"] - 1) < 0.03


@pytest.fixture(scope="module")
def accuracy_rows():
    """Identity map over the default grid (N = d/2 .. 64 d), C = 1024, >= 4096 reads a row."""
    return probe.run_probe(["linear"], list(LAW_DS), None, candidates=1024, min_queries=4096, progress=False)


def test_identity_accuracy_matches_model(accuracy_rows):
    """|predicted - measured| <= 0.04 everywhere: model error <= ~0.02 (seen against 32k-read
    runs) plus <= 2.5 sampling SE of a 4096-read accuracy (SE <= 0.008)."""
    assert len(accuracy_rows) == sum(len(probe.default_ns(d)) for d in LAW_DS)
    for r in accuracy_rows:
        assert abs(r["acc_predicted"] - r["acc_measured"]) <= 0.04, r
        assert abs(r["acc_from_snr"] - r["acc_measured"]) <= 0.04, r
    # the curve runs the whole way, from near-perfect recall to near chance
    accs = [r["acc_measured"] for r in accuracy_rows]
    assert max(accs) > 0.99 and min(accs) < 0.02
    # recall survives past N = d: at N = 2d (SNR ~ 0.7) the 64- and 128-dim memories still recall
    at_2d = {r["d"]: r["acc_measured"] for r in accuracy_rows if r["n"] == 2 * r["d"]}
    assert at_2d[64] > 0.9 and at_2d[128] > 0.99


def test_decayed_memories_match_model():
    """RetNet and Mamba: the aggregate SNR keeps the undecayed law (decay moves signal between
    reads, theory.aggregate_pairs), while accuracy falls to about the recent pairs / N; the
    per-read prediction follows it (tolerance as for the identity map)."""
    rows = probe.run_probe(["retnet", "mamba"], [64], [64, 512, 4096], min_queries=4096, progress=False)
    single = probe.run_probe(["retnet"], [64], [64, 4096], min_queries=4096, progress=False,
                             options={"retnet_heads": 1})  # one decay head: gamma = 1 - 2^-5 alone
    for r in rows + single:
        assert r["snr_measured"] == pytest.approx(r["snr_predicted"], rel=0.05)
        assert abs(r["acc_predicted"] - r["acc_measured"]) <= 0.04, r
    gamma2 = torch.exp(2 * retnet_log_gammas(4))  # per decay head

    def held(n):  # pairs held at full weight after n writes: sum_t gamma^(2t), per decay head
        return (1 - gamma2**n) / (1 - gamma2)

    assert single[-1]["n_state"] == pytest.approx(float(held(4096)[0]), rel=1e-3)  # ~16 pairs
    retnet = [r for r in rows if r["model"] == "retnet"]
    # N = 64 pools 64 states, 16 per decay head: its horizons averaged; N = 4096 reads one state of one head
    assert retnet[0]["n_state"] == pytest.approx(float(held(64).mean()), rel=1e-3)
    assert any(retnet[-1]["n_state"] == pytest.approx(float(h), rel=1e-3) for h in held(4096))
    assert retnet[0]["acc_measured"] > single[0]["acc_measured"] + 0.1  # the slower heads hold more
    assert retnet[-1]["acc_measured"] < 0.05 < retnet[0]["acc_measured"]
    assert all(r["log_decay_mean"] < 0 for r in rows)


def test_positive_features_lose_snr_and_softmax_keeps_it():
    """elu+1: every weight shares a positive mean, so SNR ~ sqrt(2.1 / N) whatever d (far below
    the law, and no better at larger d), as theory.kernel_effective_dim predicts. FAVOR+ (at
    softmax temperature) keeps an aggregate SNR near sqrt(m/N) but recalls far worse than that
    SNR predicts (heavy-tailed crosstalk). Softmax: the kernel prediction exp(2 sqrt(d) - 2)."""
    rows = probe.run_probe(["linear", "elu", "favor", "softmax"], [32, 64], [128, 512], candidates=256,
                           progress=False)
    by = {(r["model"], r["d"], r["n"]): r for r in rows}
    for d in (32, 64):
        for n in (128, 512):
            lin, elu, fav, soft = (by[m, d, n] for m in ("linear", "elu", "favor", "softmax"))
            assert elu["snr_measured"] < 0.45 * lin["snr_measured"]
            assert elu["snr_measured"] == pytest.approx(elu["snr_kernel"], rel=0.15)
            assert abs(elu["acc_kernel"] - elu["acc_measured"]) < 0.04
            assert fav["d_eff"] > d and fav["acc_measured"] < fav["acc_predicted"] - 0.1
            assert soft["snr_measured"] == pytest.approx(soft["snr_kernel"], rel=0.15)
            assert soft["acc_measured"] == 1.0
    # elu does not improve with d (SNR saturates); the identity map gains sqrt(2)
    assert by["elu", 64, 512]["snr_measured"] / by["elu", 32, 512]["snr_measured"] < 1.15
    assert by["linear", 64, 512]["snr_measured"] / by["linear", 32, 512]["snr_measured"] > 1.3


def test_delta_memories_match_their_law():
    """deltanet and gated_deltanet: SNR as theory.delta_read_energy predicts (within 3%; the
    seed-to-seed spread is below 1% at >= 4096 reads), accuracy within 0.04 (the model runs
    0.01-0.03 high at N <= d, see the module docstring); n_state near d / 2 once N >> d."""
    rows = probe.run_probe(["deltanet", "gated_deltanet"], [32, 64], [16, 64, 256, 1024], min_queries=4096,
                           progress=False)
    for r in rows:
        assert r["snr_measured"] == pytest.approx(r["snr_predicted"], rel=0.03), r
        assert abs(r["acc_predicted"] - r["acc_measured"]) <= 0.04, r
    by = {(r["model"], r["d"], r["n"]): r for r in rows}
    assert by["deltanet", 64, 1024]["n_state"] == pytest.approx(32, rel=0.05)
    assert all(by["gated_deltanet", d, n]["log_decay_mean"] < 0 for d in (32, 64) for n in (16, 1024))


def test_what_the_delta_rule_buys_over_the_additive_state():
    """Random keys at the same d: a higher SNR below N = d (crosstalk only from later writes),
    the same at N = d, and less recall past it (old pairs are overwritten); the *_kernel columns
    of a delta row are the additive law, which the linear rows measure."""
    rows = probe.run_probe(["deltanet", "linear"], [64], [16, 64, 256], min_queries=4096, progress=False)
    by = {(r["model"], r["n"]): r for r in rows}
    assert by["deltanet", 16]["snr_measured"] > 1.25 * by["linear", 16]["snr_measured"]
    assert by["deltanet", 64]["snr_measured"] == pytest.approx(by["linear", 64]["snr_measured"], rel=0.05)
    assert by["deltanet", 256]["acc_measured"] < by["linear", 256]["acc_measured"] - 0.3
    for n in (16, 64, 256):
        assert by["deltanet", n]["snr_kernel"] == pytest.approx(by["linear", n]["snr_predicted"])
        assert by["deltanet", n]["acc_kernel"] == pytest.approx(by["linear", n]["acc_predicted"], abs=1e-9)


def test_dpfp_memories_track_their_feature_count():
    """DPFP (Schlag et al. 2021): 2 d nu features; its sparse positive features keep far more of
    the identity map's SNR than elu+1 and recall more as nu grows; the measured SNR sits 15-25%
    below theory.dpfp_effective_dim's kernel prediction (N(0, 1) coordinates at d = 32): the
    normaliser phi(q).z weights the reads of the ratio of means unequally."""
    rows = [r for nu in (1, 2, 3) for r in probe.run_probe(["dpfp"], [32], [64, 256], candidates=256,
                                                            progress=False, options={"dpfp_nu": nu})]
    elu = {r["n"]: r for r in probe.run_probe(["elu"], [32], [64, 256], candidates=256, progress=False)}
    assert [r["d_eff"] for r in rows] == [64, 64, 128, 128, 192, 192]
    for r in rows:
        assert 0.7 * r["snr_kernel"] < r["snr_measured"] < r["snr_kernel"], r
        assert r["snr_measured"] > 3 * elu[r["n"]]["snr_measured"]
    for n in (64, 256):
        accs = [r["acc_measured"] for r in rows if r["n"] == n]
        assert accs == sorted(accs) and accs[0] > elu[n]["acc_measured"] + 0.15


def test_additive_control_is_the_linear_memory_of_unit_keys():
    """model.options.rule=additive writes the same unit keys with beta = 1 but adds: the plain linear
    memory's law sqrt(d / N), not the delta rule's; gated, its SNR keeps the law while recall
    falls with the decay, as RetNet's and Mamba's."""
    opts = {"rule": "additive"}
    add = {r["n"]: r for r in probe.run_probe(["deltanet"], [64], [16, 256], min_queries=4096, progress=False,
                                              options=opts)}
    delta = {r["n"]: r for r in probe.run_probe(["deltanet"], [64], [16, 256], min_queries=4096, progress=False)}
    for n, r in add.items():
        assert r["snr_measured"] == pytest.approx(math.sqrt(64 / (n - 1)), rel=0.05)
        assert abs(r["acc_predicted"] - r["acc_measured"]) <= 0.04
    assert delta[16]["snr_measured"] > 1.25 * add[16]["snr_measured"]
    assert delta[256]["acc_measured"] < add[256]["acc_measured"] - 0.3
    gated = probe.probe_row("gated_deltanet", 64, 256, min_queries=4096, options=opts)
    assert gated["snr_measured"] == pytest.approx(gated["snr_predicted"], rel=0.05)
    assert gated["acc_measured"] < add[256]["acc_measured"] and gated["log_decay_mean"] < 0


def test_sliding_window_holds_only_its_window():
    """swa keeps the last W = 32 pairs: past N = W only the reads of those recall (plus chance)."""
    rows = probe.run_probe(["swa"], [32], [16, 32, 128], candidates=256, min_queries=2048, progress=False)
    for r in rows:
        held = min(1.0, 32 / r["n"])
        assert r["acc_measured"] == pytest.approx(held + (1 - held) / 256, abs=0.03), r
        assert r["n_state"] == min(32, r["n"])


# --------------------------------------------------------------------------------------------
# The read-outs against dense references (small N, where an N x N matrix is fine).


def _dense_reference(model, d, n, seed=0):
    """Signal and noise energy of every read from the full weight matrix a_ij."""
    gen = probe._generator(seed, "dense", d, n)
    keys = probe.random_keys((1, n), d, gen)[0]  # (N, d)
    book = probe.codebook(32, d, seed)
    idx = torch.randint(32, (n,), generator=gen)
    V = book[idx]
    if model == "softmax":
        a = torch.softmax(keys @ keys.T / math.sqrt(d), dim=-1)
    else:
        memory = probe._memory(model, d, seed)
        phi_k, phi_q, normalize = memory.phi_k, memory.phi_q, memory.normalize
        a = phi_q(keys[None])[0] @ phi_k(keys[None])[0].T  # (N, N)
        if normalize:
            a = a / a.sum(-1, keepdim=True)
    o = a @ V
    signal = a.diagonal()[:, None] * V
    return (keys, V, idx, book), signal.square().sum(-1), (o - signal).square().sum(-1), o


@pytest.mark.parametrize("model", ["linear", "elu", "favor", "taylor", "dpfp"])
def test_state_read_matches_dense_weights(model):
    (keys, V, idx, book), sig2, noise2, o = _dense_reference(model, 16, 50)
    memory = probe._memory(model, 16, 0)
    phi_k, phi_q, normalize = memory.phi_k, memory.phi_q, memory.normalize
    lam = torch.ones(1, 50, dtype=torch.float64)
    got = probe._read_through_state(phi_k, phi_q, lam, keys[None], V[None], book, idx[None],
                                    normalize=normalize, chunk=7)
    torch.testing.assert_close(got[0][0], sig2)
    torch.testing.assert_close(got[1][0], noise2)
    assert torch.equal(got[2][0], (o @ book.T).argmax(-1) == idx)


def test_softmax_stream_matches_dense_and_is_chunk_invariant():
    (keys, V, idx, book), sig2, noise2, o = _dense_reference("softmax", 16, 50)
    q_idx = torch.tensor([[3, 0, 49, 17]])
    for chunk in (7, 50, 4096):
        got = probe._read_softmax(keys[None], V[None], q_idx, book, idx[None], chunk=chunk)
        torch.testing.assert_close(got[0][0], sig2[q_idx[0]])
        torch.testing.assert_close(got[1][0], noise2[q_idx[0]])


@pytest.mark.parametrize("model", ["deltanet", "gated_deltanet"])
def test_delta_read_matches_dense_weights(model):
    """_read_delta against the full a_ij of the naive delta rule with one-hot values (whose state
    after the last write has column j = the weight of v_j in every read)."""
    from harness import ops

    d, n = 16, 50
    gen = probe._generator(0, "dense-delta", d, n)
    keys = probe.random_keys((2, n), d, gen)
    book = probe.codebook(32, d, 0)
    idx = torch.randint(32, (2, n), generator=gen)
    V = book[idx]
    memory = probe._memory(model, d, 0)
    log_a = None if memory.decay is None else memory.decay((2, n), gen)[0]
    k = memory.phi_k(keys)
    ld = None if log_a is None else log_a[:, None]
    _, S = ops.naive_delta_attention(k[:, None], k[:, None], torch.eye(n, dtype=torch.float64).expand(2, 1, n, n),
                                     torch.ones(2, 1, n, dtype=torch.float64), ld, return_state=True)
    a = k @ S[:, 0]  # (2, N, N): a_ij
    o = a @ V
    signal = torch.diagonal(a, dim1=1, dim2=2)[..., None] * V
    sig2, noise2, correct = probe._read_delta(memory.phi_k, log_a, keys, V, book, idx, chunk=7)
    torch.testing.assert_close(sig2, signal.square().sum(-1))
    torch.testing.assert_close(noise2, (o - signal).square().sum(-1))
    assert torch.equal(correct, (o @ book.T).argmax(-1) == idx)


def test_decayed_state_matches_recurrence():
    """RetNet's read through the closed-form survival weights equals a token-by-token scan."""
    d, n = 8, 30
    gen = probe._generator(0, "scan")
    keys = probe.random_keys((1, n), d, gen)
    book = probe.codebook(16, d, 0)
    idx = torch.randint(16, (1, n), generator=gen)
    V = book[idx]
    gamma = math.exp(float(retnet_log_gammas(1)[0]))
    S = torch.zeros(d, d, dtype=torch.float64)
    for t in range(n):
        S = gamma * S + keys[0, t, :, None] * V[0, t, None, :]
    lam = torch.from_numpy(theory.decay_pair_weights(np.full((1, n), math.log(gamma))))
    ident = lambda x: x  # noqa: E731
    sig2, noise2, _ = probe._read_through_state(ident, ident, lam, keys, V, book, idx, normalize=False, chunk=8)
    o = keys[0] @ S
    signal = (lam[0] * (keys[0] * keys[0]).sum(-1))[:, None] * V[0]
    torch.testing.assert_close(noise2[0], (o - signal).square().sum(-1))
    torch.testing.assert_close(sig2[0], signal.square().sum(-1))


# --------------------------------------------------------------------------------------------
# The interface.


def test_rows_have_the_contract_columns_and_are_seeded():
    rows = probe.run_probe(["linear", "softmax"], [16], [8, 32], candidates=32, min_queries=64,
                           max_queries=16, progress=False)
    assert [(r["model"], r["n"]) for r in rows] == [("linear", 8), ("linear", 32), ("softmax", 8), ("softmax", 32)]
    for r in rows:
        for key in ("model", "d", "n", "snr_measured", "snr_predicted", "acc_measured", "acc_predicted",
                    "d_eff", "n_eff", "candidates", "queries"):
            assert key in r
    soft = rows[-1]
    assert soft["queries"] == soft["states"] * 16  # max_queries reads per state
    again = probe.run_probe(["linear", "softmax"], [16], [8, 32], candidates=32, min_queries=64,
                            max_queries=16, progress=False)
    assert [r["snr_measured"] for r in again] == [r["snr_measured"] for r in rows]


def test_large_n_runs_in_one_state():
    r = probe.probe_row("linear", 32, 65536, candidates=32)
    assert r["states"] == 1 and r["queries"] == 65536
    assert r["snr_measured"] == pytest.approx(math.sqrt(32 / 65536), rel=0.1)
    r = probe.probe_row("deltanet", 32, 65536, candidates=32)  # chunk form, no N x N matrix
    assert r["states"] == 1 and r["queries"] == 65536
    # one state: its signal is the ~d/2 newest reads', which moves the ratio by ~3% between seeds
    assert r["snr_measured"] == pytest.approx(r["snr_predicted"], rel=0.06)


def test_default_grid_and_validation():
    assert probe.default_ns(32) == [16, 32, 64, 128, 256, 512, 1024, 2048]
    assert probe.default_ns(512)[-1] == 16384
    assert len(probe.default_grid()) == 24
    assert probe.default_models() == ["deltanet", "dpfp", "elu", "favor", "gated_deltanet", "linear", "mamba",
                                      "retnet", "softmax", "swa"]
    with pytest.raises(ValueError):
        probe.run_probe(["gpt"], [16], [8], progress=False)
    book = probe.codebook(64, 16, 0)
    assert book.mean(0).norm() < 1e-9
    torch.testing.assert_close(book.norm(dim=-1), torch.ones(64, dtype=torch.float64))


def test_probe_mode_passes_a_builtin_mixers_settings(tmp_path):
    """mode=probe model=dpfp model.options.dpfp_nu=2: probe_memory takes model.* settings by name (as an
    outside mixer's take model.options), so the probed map is the configured one."""
    import json

    from harness.config.compose import compose_config
    from harness.run.job import run_job

    run_job(compose_config(["mode=probe", "model=dpfp", "model.options.dpfp_nu=2", "probe.d=[8]", "probe.n=[16]",
                            "logger=none", "trainer.progress=false", f"out_dir={tmp_path}"]))
    (row,) = json.loads((tmp_path / "results.json").read_text())["probe"]
    assert row["d_eff"] == 2 * 8 * 2 and row["d_kernel"] == pytest.approx(theory.dpfp_effective_dim(8, 2))


def test_the_default_list_is_the_registry_less_what_asks_to_be_probed_on_request(monkeypatch):
    from harness.layers import registry
    from harness.layers.kernel import EluAttention

    defaults = probe.default_models()
    assert "taylor" not in defaults and registry.resolve("taylor").probe_on_request
    assert set(defaults) == {n for n in registry.builtin_names() if n != "taylor"}
    # a new built-in with a probe_memory is probed without an edit here
    monkeypatch.setitem(registry._BUILTINS, "throwaway_probe", type("Throwaway", (EluAttention,), {}))
    assert "throwaway_probe" in probe.default_models()
