"""Resample ablation, corruption of the context and path patching (harness.measure.ablate,
.corruption, .paths) held against a float64 oracle on a tiny attention-only model, and against
heads that carry the answer by construction; the gather/aggregate criteria
(analysis.gather_aggregate) on rows of known roles; a run's own ablation (trainer.ablate)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import make_results
from analysis.synthetic.anatomy import ANATOMY_PATH, ablate_rows

from harness.hooks import capture, intervene
from harness.layers.parts import merge_heads
from harness.measure.ablate import ablate, accuracy, edit, head_counts
from harness.measure.contrast import logit_diff, restored_share
from harness.measure.corruption import corrupt
from harness.measure.paths import path_patching
from harness.model import LanguageModel, ModelConfig
from harness.tasks import IGNORE, get_task, label_positions

HEADS, WIDTH, T = 2, 8, 16


@pytest.fixture
def model():
    """Two softmax layers of two heads, mixer-only blocks, no short convolution, in float64."""
    torch.manual_seed(0)
    cfg = ModelConfig(layers=["softmax", "softmax"], d_model=WIDTH, n_heads=HEADS, mlp=False, short_conv=False)
    return LanguageModel(cfg, vocab_size=16, max_seq_len=T).double().eval()


@pytest.fixture
def batch():
    task = get_task("recall")
    return task.make_batch(task.Config(seq_len=T, vocab_size=16, num_pairs=3), 24, seed=0)


def _dead(model, layer: int, alive=()) -> None:
    """Zero the output projection's columns of every head of `layer` but those in `alive`: the
    others then write nothing into the residual stream."""
    width = WIDTH // HEADS
    with torch.no_grad():
        for h in range(HEADS):
            if h not in alive:
                model.layers[layer].mixer.out_proj.weight[:, h * width:(h + 1) * width] = 0.0


def _mixer_from_readout(model, layer: int, readout: torch.Tensor) -> torch.Tensor:
    """The softmax layer's output from a per-head read-out (B, H, T, D): its output projection."""
    return model.layers[layer].mixer.out_proj(merge_heads(readout))


def _readout(model, layer: int, block_in: torch.Tensor) -> torch.Tensor:
    """What layer `layer`'s heads read out (B, H, T, D) when its block's input is `block_in`."""
    block = model.layers[layer]
    with capture(model, names={f"layers.{layer}.mixer.hook_out"}) as cache:
        block.mixer(block.norm1(block_in))
    return cache[f"layers.{layer}.mixer.hook_out"]


def _logits_from(model, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    x = x.gather(1, positions.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
    return model.head(model.norm_f(x) * model.logit_scale)


def _embedded(model, inputs: torch.Tensor) -> torch.Tensor:
    return model.embed(inputs) + model.pos_embed.weight[: inputs.shape[1]]


def test_key_and_value_corruption_rotate_the_queried_pairs_and_name_the_new_answers():
    # k1 v1 k2 v2 k3 v3 | k1 k3 (the module docstring's example, with tokens)
    inputs = torch.tensor([[1, 11, 2, 12, 3, 13, 1, 3]])
    targets = torch.full_like(inputs, IGNORE)
    targets[0, 6], targets[0, 7] = 11, 13
    target_pos = torch.full_like(inputs, -1)
    target_pos[0, 6], target_pos[0, 7] = 1, 5
    batch = {"inputs": inputs, "targets": targets, "target_pos": target_pos}
    expect = {"query": ([1, 11, 2, 12, 3, 13, 3, 1], [13, 11]), "key": ([3, 11, 2, 12, 1, 13, 1, 3], [13, 11]),
              "value": ([1, 13, 2, 12, 3, 11, 1, 3], [13, 11])}
    for part, (bad, answers) in expect.items():
        got, labels, other = corrupt(batch, part)
        assert got[0].tolist() == bad, part
        assert other[0, 6:].tolist() == answers and labels[0, 6:].tolist() == [11, 13], part
    with pytest.raises(ValueError, match="unknown corruption 'pair'"):
        corrupt(batch, "pair")


def test_every_corruption_changes_every_answer_of_a_recall_batch(batch):
    for part in ("query", "key", "value"):
        bad, labels, other = corrupt(batch, part)
        kept = labels != IGNORE
        assert kept.sum() > 0.9 * (batch.targets != IGNORE).sum(), part
        assert (other[kept] != labels[kept]).all() and (other[~kept] == IGNORE).all(), part
        # the corrupted answer is the value the asked key now sits before, in the corrupted inputs
        for b, t in kept.nonzero().tolist():
            keys = (bad[b, : 2 * 3] == bad[b, t]).nonzero().squeeze(-1)
            assert bad[b, keys[0] + 1] == other[b, t], (part, b, t)


@torch.no_grad()
def test_resample_ablation_matches_the_float64_oracle(model, batch):
    positions, labels = label_positions(batch.targets)
    x1 = model.layers[0](_embedded(model, batch.inputs))
    readout = _readout(model, 1, x1)
    for h in range(HEADS):
        swapped = readout.clone()
        swapped[:, h] = readout.roll(1, dims=0)[:, h]  # example b takes example b-1's read-out
        logits = _logits_from(model, x1 + _mixer_from_readout(model, 1, swapped), positions)
        oracle = float((logits.argmax(-1) == labels)[labels != IGNORE].double().mean())
        edits = {"layers.1.mixer.hook_out": edit("resample", h, None)}
        assert accuracy(model, batch, edits) == pytest.approx(oracle, abs=1e-7)
        with torch.no_grad(), intervene(model, edits):
            got = model(batch.inputs, positions)
        torch.testing.assert_close(got, logits, rtol=0, atol=1e-12)


def test_a_head_that_writes_nothing_loses_nothing_to_any_ablation(model, batch):
    _dead(model, 1, alive=(0,))
    base = accuracy(model, batch)
    for kind in ("zero", "mean", "resample"):
        mean = {"layers.1.mixer.hook_out": torch.zeros(1, HEADS, T, WIDTH // HEADS, dtype=torch.float64)}
        assert accuracy(model, batch, {"layers.1.mixer.hook_out": edit(kind, 1, mean["layers.1.mixer.hook_out"])}) == base


def test_patching_the_only_head_that_reaches_the_answer_restores_all_of_it_and_the_others_nothing(model, batch):
    _dead(model, 0)             # layer 0 writes nothing
    _dead(model, 1, alive=(1,))  # in layer 1 only head 1 writes
    rows = ablate(model, batch, kinds=("resample",), corruptions=("key", "value"), path_corruptions=())["rows"]
    restored = {(r["layer"], r["head"], r["corrupt"]): r["restored"] for r in rows if r["kind"] == "patch"}
    for part in ("key", "value"):  # the query token is the same in both runs: only head (1, 1) differs
        assert restored[(1, 1, part)] == pytest.approx(1.0, abs=1e-9)
        for other in ((0, 0), (0, 1), (1, 0)):
            assert restored[(*other, part)] == pytest.approx(0.0, abs=1e-9)


@torch.no_grad()
def test_path_patching_matches_the_float64_oracle_and_a_dead_end_restores_nothing(model, batch):
    heads = head_counts(model, batch)
    rows = {(r["sender_head"], r["head"]): r for r in path_patching(model, batch, heads, ("key",))}
    assert set(rows) == {(g, a) for g in range(HEADS) for a in range(HEADS)}  # layer 0 into layer 1 only
    bad_in, targets, other = corrupt(batch, "key")
    positions, labels = label_positions(targets)
    others = other.gather(1, positions)
    x0_clean, x0_bad = _embedded(model, batch.inputs), _embedded(model, bad_in)
    out_clean, out_bad = _readout(model, 0, x0_clean), _readout(model, 0, x0_bad)
    x1_bad = model.layers[0](x0_bad)
    a_bad = _readout(model, 1, x1_bad)

    def diff(x):
        return logit_diff(_logits_from(model, x, positions), labels, others)

    clean = diff(model.layers[1](model.layers[0](x0_clean)))
    corrupted = diff(model.layers[1](x1_bad))
    for (g, a), row in rows.items():
        sender = out_bad.clone()
        sender[:, g] = out_clean[:, g]
        delta = _mixer_from_readout(model, 0, sender) - _mixer_from_readout(model, 0, out_bad)  # G's clean output
        receiver = a_bad.clone()
        receiver[:, a] = _readout(model, 1, x1_bad + delta)[:, a]  # what A reads with G's path restored
        patched = diff(x1_bad + _mixer_from_readout(model, 1, receiver))
        assert row["restored"] == pytest.approx(restored_share(patched, clean, corrupted), abs=1e-10)
        assert row["clean_logit_diff"] == pytest.approx(clean, abs=1e-12)
    _dead(model, 0, alive=(0,))
    _dead(model, 1, alive=(0,))
    dead = {(r["sender_head"], r["head"]): r["restored"] for r in path_patching(model, batch, heads, ("key",))}
    assert dead[(1, 0)] == pytest.approx(0.0, abs=1e-12)  # the sender writes nothing
    assert dead[(0, 1)] == pytest.approx(0.0, abs=1e-12)  # the receiver writes nothing
    assert abs(dead[(0, 0)]) > 1e-3                          # the live path carries something


# --- the criteria ---------------------------------------------------------------------------

def _frame(roles: dict, seed: int = 0, run: str = "r0") -> pd.DataFrame:
    rows = ablate_rows(roles, np.random.default_rng(seed))
    return pd.DataFrame(rows).assign(run_dir=run)


def test_the_criteria_name_exactly_the_heads_built_to_gather_and_aggregate():
    from analysis.gather_aggregate import Criteria, candidates, head_numbers, path_numbers, roles

    rows = pd.concat([_frame({(1, 2): "A", (0, 3): "G"}, 0, "r0"), _frame({(0, 1): "A"}, 1, "r1")])
    heads = roles(head_numbers(rows), path_numbers(rows), Criteria())
    named = {(r.run_dir, int(r.layer), int(r.head)): (r.is_A, r.is_G) for r in heads.itertuples()}
    assert {k for k, (a, _) in named.items() if a} == {("r0", 1, 2), ("r1", 0, 1)}
    assert {k for k, (_, g) in named.items() if g} == {("r0", 0, 3)}  # r1's A has no later-layer partner
    picked = candidates(heads, path_numbers(rows)).set_index("run_dir")
    assert picked.loc["r0", "ga"] and (picked.loc["r0", "G_layer"], picked.loc["r0", "G_head"]) == (0, 3)
    assert not picked.loc["r1", "ga"] and np.isnan(picked.loc["r1", "G_layer"])
    assert picked.loc["r0", "G_path"] == pytest.approx(ANATOMY_PATH, abs=0.05)
    strict = roles(head_numbers(rows), path_numbers(rows), Criteria(necessity=0.95))
    assert not strict["is_A"].any()  # 0.9 of the way to chance is not 0.95


def test_necessity_is_the_share_of_the_way_to_chance():
    from analysis.gather_aggregate import necessity

    rows = pd.DataFrame([{"run_dir": "r", "layer": 0, "head": 0, "kind": "resample", "accuracy": 0.5,
                          "base_accuracy": 0.9, "chance": 0.1},
                         {"run_dir": "r", "layer": 0, "head": None, "kind": "resample", "accuracy": 0.1,
                          "base_accuracy": 0.9, "chance": 0.1}])
    assert necessity(rows)["necessity_resample"].tolist() == [pytest.approx(0.5)]  # (0.9 - 0.5) / (0.9 - 0.1)


def test_the_thresholds_come_from_the_runs_and_must_agree():
    from analysis.gather_aggregate import THRESHOLDS, Criteria

    assert Criteria.of_runs(pd.DataFrame({"model": ["a"]})) == Criteria(*THRESHOLDS.values())
    runs = pd.DataFrame({"config.analysis.ga_restore": [0.6, 0.6]})
    assert Criteria.of_runs(runs).restore == 0.6
    with pytest.raises(ValueError, match="disagree on config.analysis.ga_restore"):
        Criteria.of_runs(pd.DataFrame({"config.analysis.ga_restore": [0.6, 0.7]}))


# --- a run's own ablation --------------------------------------------------------------------

def test_a_run_with_trainer_ablate_writes_the_rows_and_hashes_apart(run_harness, tmp_path):
    from harness.config.digest import flat_hash

    done = run_harness("task=recall", "task.seq_len=16", "task.vocab_size=16", "task.num_pairs=3",
                       "model=softmax", "model.d_model=8", "model.n_heads=2", "trainer=debug", "trainer.threads=1",
                       "trainer.ablate=true", "ablate.examples=16", "logger=none", f"out_dir={tmp_path / 'run'}")
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads((tmp_path / "run" / "results.json").read_text())
    kinds = {(r["kind"], r.get("corrupt")) for r in found["ablate"]}
    assert kinds == {("zero", None), ("mean", None), ("resample", None), ("patch", "query"), ("patch", "key"),
                     ("patch", "value"), ("path", "key"), ("weights", None)}
    assert found["measure"]["ablate"] == "ok" and found["summary"]["ablate_time_s"] > 0
    flat = found["config"]
    assert flat_hash(flat) != flat_hash(dict(flat, **{"trainer.ablate": False}))
    assert flat_hash(dict(flat, **{"trainer.ablate": False})) == flat_hash(
        dict(flat, **{"trainer.ablate": False, "ablate.examples": 99}))  # off: its settings do not count
    bad = run_harness("model=softmax", "trainer=debug", "trainer.ablate=true", "ablate.kinds=[zero,scramble]",
                      "logger=none", f"out_dir={tmp_path / 'bad'}")
    assert bad.returncode == 2 and "ablate.kinds" in bad.stderr
