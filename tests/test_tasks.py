"""Task generators: layouts, labels, determinism and validation."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from omegaconf import OmegaConf

from harness.tasks import TASKS, get_task
from harness.tasks import forgetting, induction, interference, needle, recall
from harness.tasks.base import (IGNORE, NO_SLICE, PAD, balanced_choice, label_positions, make_generator,
                                power_law_offsets, sample_excluding)


def _check_common(batch, slice_name: str) -> None:
    """Shapes, dtypes, and the contract shared by every task."""
    b, t = batch.inputs.shape
    for name in ("inputs", "targets", "slice_value", "target_pos"):
        x = getattr(batch, name)
        assert x.shape == (b, t) and x.dtype == torch.long, name
    assert batch.slice_name == slice_name
    lab = batch.label_mask
    assert lab.any(dim=1).all(), "every example has labels"
    # nothing outside labelled positions
    assert (batch.slice_value[~lab] == NO_SLICE).all()
    assert (batch.target_pos[~lab] == NO_SLICE).all()
    assert (batch.slice_value[lab] >= 0).all()
    # target_pos points at the token that answers: inputs[b, target_pos] == targets[b, t]
    tp = batch.target_pos.clamp(min=0)
    read = batch.inputs.gather(1, tp)
    assert torch.equal(read[lab], batch.targets[lab])
    # the answer lies strictly before the position that must predict it (causal models)
    rows, cols = lab.nonzero(as_tuple=True)
    assert (batch.target_pos[rows, cols] < cols).all()


# ---------------------------------------------------------------------------------------------
# registry

def test_get_task_names_and_unknown():
    assert {"forgetting", "induction", "interference", "needle", "recall"} <= set(TASKS)  # a new one joins
    assert get_task("recall") is recall and get_task("induction") is induction
    with pytest.raises(ValueError, match=rf"^unknown task 'x'; valid: {', '.join(sorted(TASKS))}, or a module path"):
        get_task("x")


@pytest.mark.parametrize("name", sorted(TASKS))
def test_configs_are_hydra_structured(name):
    module = get_task(name)
    node = OmegaConf.structured(module.Config)
    cfg = module.Config(**OmegaConf.to_container(node))
    module.validate(cfg)
    # a mapping with the Hydra group's `name` is accepted; unknown fields are not
    module.validate({**dataclasses.asdict(cfg), "name": name})
    with pytest.raises(ValueError, match="unknown config field 'seq_length'"):
        module.validate({**dataclasses.asdict(cfg), "seq_length": 3})


# ---------------------------------------------------------------------------------------------
# determinism and call arguments

@pytest.mark.parametrize("name", sorted(TASKS))
def test_determinism_in_seed_and_split(name):
    module = get_task(name)
    cfg = module.Config()
    a = module.make_batch(cfg, 8, seed=3)
    b = module.make_batch(cfg, 8, seed=3)
    for x, y in zip(a[:4], b[:4]):
        assert torch.equal(x, y)
    c = module.make_batch(cfg, 8, seed=4)
    assert not torch.equal(a.inputs, c.inputs)
    test = module.make_batch(cfg, 8, seed=3, split="test")
    assert not torch.equal(a.inputs, test.inputs)
    # train seed 2s+1 and test seed s never share a stream
    assert not torch.equal(module.make_batch(cfg, 8, seed=7).inputs, test.inputs)
    # the validation split is a third stream, disjoint from both, and as deterministic
    val = module.make_batch(cfg, 8, seed=3, split="val")
    assert torch.equal(val.inputs, module.make_batch(cfg, 8, seed=3, split="val").inputs)
    for other in (a, test, module.make_batch(cfg, 8, seed=6), module.make_batch(cfg, 8, seed=6, split="test")):
        assert not torch.equal(val.inputs, other.inputs)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_call_argument_errors(name):
    module = get_task(name)
    cfg = module.Config()
    with pytest.raises(ValueError, match="unknown split 'validation'; valid: train, test, val"):
        module.make_batch(cfg, 2, seed=0, split="validation")
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        module.make_batch(cfg, 0, seed=0)
    with pytest.raises(ValueError, match="seed must be an integer"):
        module.make_batch(cfg, 2, seed=1.5)


def test_sampling_functions():
    g = make_generator(0, "train", "cpu")
    picks = balanced_choice(g, 4, 10, 3)
    counts = torch.stack([(picks == i).sum(1) for i in range(3)], 1)
    assert ((counts == 3) | (counts == 4)).all() and (counts.sum(1) == 10).all()
    distinct = balanced_choice(g, 4, 3, 5)
    assert all(len(set(row)) == 3 for row in distinct.tolist())
    offs = power_law_offsets(g, 2000, 1, 50, 0.01)
    uniform = power_law_offsets(g, 2000, 1, 50, 1.0)
    assert offs.float().mean() < 0.6 * uniform.float().mean()
    assert (offs < 10).float().mean() > 0.5   # p ∝ 1/s puts most mass on short gaps


# ---------------------------------------------------------------------------------------------
# recall

def _recall_pairs(batch, n):
    keys = batch.inputs[:, 0:2 * n:2]
    values = batch.inputs[:, 1:2 * n:2]
    return keys, values


def test_recall_default_asks_each_key_once():
    cfg = recall.Config()
    batch = recall.make_batch(cfg, 16, seed=0)
    n = cfg.num_pairs
    keys, _ = _recall_pairs(batch, n)
    lab = batch.label_mask
    assert not lab[:, :2 * n].any() and (lab.sum(1) == n).all()    # Q = N, after the pairs
    asked = torch.where(lab, batch.inputs, torch.zeros_like(batch.inputs))
    for row_keys, row in zip(keys.tolist(), asked.tolist()):
        assert sorted(t for t in row if t) == sorted(row_keys)    # every key exactly once
    assert (batch.inputs[:, 2 * n:][~lab[:, 2 * n:]] == 0).all()


def test_recall_layout_fill():
    cfg = recall.Config(num_queries=recall.Config().seq_len - 2 * recall.Config().num_pairs)
    batch = recall.make_batch(cfg, 16, seed=0)
    _check_common(batch, "num_pairs")
    n, t, v = cfg.num_pairs, cfg.seq_len, cfg.vocab_size
    keys, values = _recall_pairs(batch, n)
    assert ((keys >= 1) & (keys < v // 2)).all() and ((values >= v // 2) & (values < v)).all()
    assert all(len(set(r)) == n for r in keys.tolist())
    assert all(len(set(r)) == n for r in values.tolist())
    lab = batch.label_mask
    assert not lab[:, :2 * n].any() and lab[:, 2 * n:].all()      # fill: every later position asks
    assert (batch.slice_value[lab] == n).all()
    # every query's label is the value paired with its key, read from the context
    q = batch.inputs[:, 2 * n:]                                    # (B, Q)
    match = q.unsqueeze(-1) == keys.unsqueeze(1)                   # (B, Q, N)
    assert (match.sum(-1) == 1).all()
    idx = match.float().argmax(-1)
    assert torch.equal(values.gather(1, idx), batch.targets[:, 2 * n:])
    assert torch.equal(batch.target_pos[:, 2 * n:], 2 * idx + 1)
    # values are never repeated after the pairs, so target_pos is the only place to read from
    assert not (batch.inputs[:, 2 * n:] >= v // 2).any()
    # balanced queries: every key asked 14 times (56 queries, 4 keys)
    assert (match.sum(1) == (t - 2 * n) // n).all()


def test_recall_power_law_queries():
    cfg = recall.Config(seq_len=128, vocab_size=64, num_pairs=8, num_queries=8, power_a=0.01)
    batch = recall.make_batch(cfg, 256, seed=1)
    _check_common(batch, "num_pairs")
    n = cfg.num_pairs
    lab = batch.label_mask
    assert (lab.sum(1) == 8).all()
    # no label outside query positions: exactly the non-filler positions after the pairs
    tail = batch.inputs[:, 2 * n:]
    assert torch.equal(lab[:, 2 * n:], tail != PAD) and not lab[:, :2 * n].any()
    keys, values = _recall_pairs(batch, n)
    # Q == N: every key asked exactly once
    asked = batch.inputs[lab].view(-1, 8).sort(1).values
    assert torch.equal(asked, keys.sort(1).values)
    idx = (batch.target_pos[lab].view(-1, 8) - 1) // 2
    assert torch.equal(keys.gather(1, idx), batch.inputs[lab].view(-1, 8))
    assert torch.equal(values.gather(1, idx), batch.targets[lab].view(-1, 8))
    # power-law gaps: offsets after the pairs are short far more often than uniform
    offsets = lab[:, 2 * n:].nonzero()[:, 1].float()
    assert offsets.mean() < 0.6 * (128 - 2 * n - 1) / 2


def test_recall_eval_settings_and_max_len():
    cfg = recall.Config(test_seq_len=[128], test_num_pairs=[4, 16, 32], vocab_size=256)
    recall.validate(cfg)
    settings = recall.eval_settings(cfg)
    assert [(s.seq_len, s.num_pairs) for s in settings] == [(128, 4), (128, 16), (128, 32)]
    assert all(s.test_num_pairs == [] and s.test_seq_len == [] for s in settings)
    assert recall.max_seq_len(cfg) == 128
    grid = recall.eval_settings(recall.Config(test_seq_len=[64, 1024], test_num_pairs=[2, 8]))
    assert [(s.seq_len, s.num_pairs) for s in grid] == [(64, 2), (64, 8), (1024, 2), (1024, 8)]
    assert recall.max_seq_len(recall.Config(test_seq_len=[32, 1024])) == 1024
    batch = recall.make_batch(settings[2], 4, seed=0, split="test")
    _check_common(batch, "num_pairs")
    assert batch.inputs.shape == (4, 128) and (batch.slice_value[batch.label_mask] == 32).all()
    default = recall.eval_settings(recall.Config())
    assert [(s.seq_len, s.num_pairs) for s in default] == [(64, 4)]


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_pairs=30, num_queries=8), r"2\*num_pairs \+ num_queries = 68 exceeds seq_len=64"),
    (dict(num_pairs=32), r"2\*num_pairs \+ num_queries = 96 exceeds seq_len=64 \(num_queries defaults"),
    (dict(num_pairs=25), r"2\*num_pairs \+ num_queries = 75 exceeds seq_len=64"),  # room for pairs, not queries
    (dict(vocab_size=16, num_pairs=8), r"num_pairs=8 distinct keys do not fit in the key half"),
    (dict(num_pairs=0), r"num_pairs must be >= 1"),
    (dict(seq_len=-1), r"seq_len must be >= 1"),
    (dict(num_queries=0), r"num_queries must be >= 1"),
    (dict(power_a=0.0), r"power_a must be in \(0, 8.0\]"),
    (dict(power_a=float("inf")), r"power_a must be a finite number"),
    (dict(test_num_pairs=[4, 40]), r"test num_pairs=40 distinct|2\*num_pairs \+ num_queries = 120 exceeds test seq_len=64"),
    (dict(test_seq_len=[64, 8]), r"num_queries = 12 exceeds test seq_len=8"),
    (dict(test_seq_len=[0]), r"test_seq_len entry must be >= 1"),
    (dict(test_seq_len=64), r"test_seq_len must be a list of lengths"),
    (dict(filler="noise"), r"unknown filler 'noise'; valid: zero, random"),
    (dict(filler="random", filler_rate=1.5), r"filler_rate must be in \[0, 1\], got 1.5"),
    (dict(num_pairs=2.5), r"num_pairs must be an integer"),
    (dict(mixture=[[64, 4], [32, 16]]), r"2\*num_pairs \+ num_queries = 48 exceeds mixture\[1\] seq_len=32"),
    (dict(mixture=[[512, 200]]), r"mixture\[0\] num_pairs=200 distinct keys do not fit in the key half"),
    (dict(mixture=[[64, 4], [128]]), r"mixture\[1\] must be \[seq_len, num_pairs\] or \[seq_len, num_pairs, weight\]"),
    (dict(mixture=[[64, 4, 0]]), r"mixture\[0\] weight must be > 0, got 0"),
    (dict(mixture=[[64, 4.5]]), r"mixture\[0\] num_pairs must be an integer"),
    (dict(mixture="64,4"), r"mixture must be a list of \[seq_len, num_pairs\]"),
])
def test_recall_validation(kwargs, message):
    with pytest.raises(ValueError, match=message) as err:
        recall.validate(recall.Config(**kwargs))
    assert "\n" not in str(err.value)


# the training mixture (Based / Zoology's frontier)

MIXTURE = [[16, 2], [32, 4, 2], [48, 8]]  # distinct N, so each example's setting reads off its labels


def _mixture_rows(batch):
    """Each example's (seq_len, num_pairs) from its labels' N (MIXTURE's N are distinct)."""
    length = {n: t for t, n, *_ in MIXTURE}
    n = batch.slice_value.amax(dim=1)  # (B,)
    return [(length[int(x)], int(x)) for x in n]


def test_recall_mixture_draws_settings_and_pads_each_example_after_its_labels():
    cfg = recall.Config(vocab_size=64, mixture=MIXTURE)
    recall.validate(cfg)
    batch = recall.make_batch(cfg, 600, seed=0)
    _check_common(batch, "num_pairs")
    assert batch.inputs.shape == (600, 48)  # the mixture's longest length
    rows = _mixture_rows(batch)
    counts = {n: sum(1 for _, m in rows if m == n) for _, n, *_ in MIXTURE}
    assert abs(counts[4] / 600 - 0.5) < 0.07 and abs(counts[2] / 600 - 0.25) < 0.07  # weights 1 : 2 : 1
    for i, (t, n) in enumerate(rows):
        lab = batch.label_mask[i]
        assert lab.sum() == n and not lab[:2 * n].any() and not lab[t:].any()  # Q = N queries inside T
        assert (batch.inputs[i, t:] == PAD).all()  # right padding: PAD, no label
        keys = batch.inputs[i, 0:2 * n:2]
        assert ((keys >= 1) & (keys < 32)).all() and len(set(keys.tolist())) == n
        assert (batch.inputs[i, 2 * n:t][~lab[2 * n:t]] == 0).all()  # the zero layout of its own length
    # each setting's queries are drawn over its own length: the longest gaps reach its end
    last = [int(batch.label_mask[i].nonzero().max()) for i, (t, n) in enumerate(rows) if n == 2]
    assert max(last) > 10 and max(last) < 16
    again = recall.make_batch(cfg, 600, seed=0)
    assert torch.equal(batch.inputs, again.inputs) and torch.equal(batch.targets, again.targets)
    assert not torch.equal(batch.inputs, recall.make_batch(cfg, 600, seed=1).inputs)


def test_recall_mixture_settings_for_validation_and_test():
    cfg = recall.Config(vocab_size=64, mixture=MIXTURE, test_seq_len=[64], test_num_pairs=[4, 16])
    assert [(s.seq_len, s.num_pairs) for s in recall.val_settings(cfg)] == [(16, 2), (32, 4), (48, 8)]
    assert [(s.seq_len, s.num_pairs) for s in recall.eval_settings(cfg)] == [(64, 4), (64, 16)]
    assert all(s.mixture == [] for s in recall.val_settings(cfg) + recall.eval_settings(cfg))
    assert recall.max_seq_len(cfg) == 64
    plain = recall.Config()
    assert recall.val_settings(plain) == recall.eval_settings(plain)  # without a mixture: the test settings
    assert recall.make_batch(recall.val_settings(cfg)[0], 4, seed=0, split="val").inputs.shape == (4, 16)
    from harness.train.evaluate import make_eval_sets
    from types import SimpleNamespace

    tr = SimpleNamespace(eval_examples=4)
    assert [es.name for es in make_eval_sets(recall, cfg, tr, 0, torch.device("cpu"), split="val")] == [
        "seq_len=16,num_pairs=2", "seq_len=32,num_pairs=4", "seq_len=48,num_pairs=8"]
    assert [es.seq_len for es in make_eval_sets(recall, cfg, tr, 0, torch.device("cpu"))] == [64, 64]


@pytest.mark.parametrize("name", ["softmax", "elu", "retnet", "deltanet"])
def test_right_padding_leaves_a_causal_models_outputs_at_the_labels(name):
    """The logits at an example's labelled positions are the same padded to the mixture's length
    as cut to its own (float64: the shapes differ, so float32 would differ by rounding)."""
    from harness.model import LanguageModel, ModelConfig

    cfg = recall.Config(vocab_size=64, mixture=MIXTURE)
    batch = recall.make_batch(cfg, 6, seed=2)
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(name=name, d_model=16, n_heads=2, chunk_size=8), 64, 48).double().eval()
    with torch.no_grad():
        padded = model(batch.inputs)
        for i, (t, _) in enumerate(_mixture_rows(batch)):
            own = model(batch.inputs[i:i + 1, :t])[0]
            lab = batch.label_mask[i, :t]
            torch.testing.assert_close(padded[i, :t][lab], own[lab], rtol=0, atol=1e-10)


# ---------------------------------------------------------------------------------------------
# induction

def test_induction_layout():
    cfg = induction.Config()
    batch = induction.make_batch(cfg, 64, seed=0)
    _check_common(batch, "distance")
    v, k = cfg.vocab_size, cfg.num_triggers
    lab = batch.label_mask
    assert (lab.sum(1) == k).all()
    rows, q = lab.nonzero(as_tuple=True)
    d = batch.slice_value[rows, q]
    assert ((d >= cfg.min_distance) & (d <= cfg.max_distance)).all()
    first = q - d
    a = batch.inputs[rows, q]
    # the token at the query is A, seen before at q - distance and followed there by B
    assert torch.equal(batch.inputs[rows, first], a)
    assert torch.equal(batch.target_pos[rows, q], first + 1)
    assert torch.equal(batch.inputs[rows, first + 1], batch.targets[rows, q])
    # A comes from the trigger range and occurs exactly twice in its row: unambiguous
    assert ((a >= 1) & (a < v // 2)).all()
    assert ((batch.inputs[rows] == a.unsqueeze(1)).sum(1) == 2).all()
    # nothing else uses the trigger range, so no label sits outside an induction position
    trig = (batch.inputs >= 1) & (batch.inputs < v // 2)
    assert (trig.sum(1) == 2 * k).all()
    assert not (batch.inputs == PAD).any()
    # every distance of the range shows up across a large batch (uniform distances)
    many = induction.make_batch(cfg, 512, seed=1)
    seen = set(many.slice_value[many.label_mask].tolist())
    assert seen == set(range(cfg.min_distance, cfg.max_distance + 1))


def test_induction_densest_valid_layout():
    # seq_len - max_distance = 8*(K-1) + 1: the tightest layout validation allows
    cfg = induction.Config(seq_len=40, vocab_size=32, num_triggers=4, min_distance=15, max_distance=15)
    batch = induction.make_batch(cfg, 256, seed=5)
    _check_common(batch, "distance")
    assert (batch.label_mask.sum(1) == 4).all()
    assert (batch.slice_value[batch.label_mask] == 15).all()


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_triggers=5, max_distance=40), r"need seq_len - max_distance > 32, got 24"),
    (dict(min_distance=1), r"min_distance must be >= 2"),
    (dict(min_distance=20, max_distance=10), r"min_distance=20 exceeds max_distance=10"),
    (dict(max_distance=64, num_triggers=1), r"max_distance=64 must be < seq_len=64"),
    (dict(vocab_size=8, num_triggers=4), r"num_triggers=4 distinct triggers do not fit"),
    (dict(num_triggers=0), r"num_triggers must be >= 1"),
])
def test_induction_validation(kwargs, message):
    with pytest.raises(ValueError, match=message) as err:
        induction.validate(induction.Config(**kwargs))
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------------
# interference

def _interference_checks(cfg, batch):
    """Labels, keys and target positions against the documented layout."""
    _check_common(batch, "num_pairs")
    n, length, v = cfg.num_pairs, cfg.key_len, cfg.vocab_size
    q = interference.num_queries(cfg)
    start = n * (length + 1)
    first_query = batch.inputs.shape[1] - q * length  # the queries close the sequence
    pairs = batch.inputs[:, :start].view(-1, n, length + 1)
    keys, values = pairs[..., :length], pairs[..., length]           # (B, N, L), (B, N)
    assert ((keys >= 1) & (keys < v // 2)).all() and ((values >= v // 2) & (values < v)).all()
    assert all(len(set(r)) == n for r in values.tolist())
    assert all(len(set(map(tuple, r))) == n for r in keys.tolist()), "keys distinct as tuples"
    # labels exactly at the last token of each query
    lab = batch.label_mask
    expect = torch.zeros_like(lab)
    expect[:, first_query + torch.arange(q) * length + length - 1] = True
    assert torch.equal(lab, expect)
    assert (batch.slice_value[lab] == n).all()
    # each query's tokens are the key stored just before target_pos, and its label that value
    asked = batch.inputs[:, first_query:].view(-1, q, length)
    match = (asked.unsqueeze(2) == keys.unsqueeze(1)).all(-1)         # (B, Q, N)
    assert (match.sum(-1) == 1).all()
    idx = match.float().argmax(-1)
    assert torch.equal(batch.targets[lab].view(-1, q), values.gather(1, idx))
    assert torch.equal(batch.target_pos[lab].view(-1, q), idx * (length + 1) + length)
    return keys


def test_interference_layout_default():
    cfg = interference.Config()
    batch = interference.make_batch(cfg, 16, seed=0)
    keys = _interference_checks(cfg, batch)
    assert batch.inputs.shape[1] == 16 * 2 + 16 == interference.max_seq_len(cfg)
    # default: every key asked once
    lab = batch.label_mask
    assert torch.equal(batch.inputs[lab].view(-1, 16).sort(1).values, keys[..., 0].sort(1).values)


@pytest.mark.parametrize("overlap, pool", [(0.0, 32), (0.5, 16), (0.75, 8), (0.95, 6)])
def test_interference_key_overlap(overlap, pool):
    cfg = interference.Config(num_pairs=32, key_len=2, key_overlap=overlap, vocab_size=512)
    assert interference.pool_size(cfg) == pool
    batch = interference.make_batch(cfg, 32, seed=2)
    keys = _interference_checks(cfg, batch)
    for j in range(2):
        distinct = torch.tensor([len(set(r)) for r in keys[..., j].tolist()])
        assert (distinct == pool).all(), "each position uses exactly its pool of P tokens"
    # first tokens are spread evenly: each is shared by floor(N/P) or ceil(N/P) keys
    first = keys[..., 0]
    share = (first.unsqueeze(2) == first.unsqueeze(1)).sum(-1)
    assert ((share == 32 // pool) | (share == -(-32 // pool))).all()
    # pools of different positions are disjoint
    assert not (keys[..., 0].unsqueeze(2) == keys[..., 1].unsqueeze(1)).any()
    if overlap == 0.0:
        assert (share == 1).all(), "no overlap: every key token identifies its key"


def test_interference_queries_seq_len_and_sweep():
    cfg = interference.Config(num_pairs=8, num_queries=20, key_len=3, key_overlap=0.5, seq_len=120)
    interference.validate(cfg)
    batch = interference.make_batch(cfg, 8, seed=0)
    _interference_checks(cfg, batch)
    used = 8 * 4 + 20 * 3
    # the filler sits between the pairs and the queries: the queries close the sequence
    assert batch.inputs.shape[1] == 120 and (batch.inputs[:, 8 * 4:120 - 20 * 3] == PAD).all()
    assert (batch.inputs[:, 120 - 20 * 3:] != PAD).all()
    # 20 queries of 8 keys: each key asked 2 or 3 times
    targets = batch.target_pos[batch.label_mask].view(-1, 20)
    counts = torch.stack([(targets == i * 4 + 3).sum(1) for i in range(8)], 1)
    assert ((counts == 2) | (counts == 3)).all()
    # a fixed seq_len must hold every swept N
    with pytest.raises(ValueError, match="test num_pairs=32 pairs and 20 queries need 188 positions"):
        interference.validate(dataclasses.replace(cfg, test_num_pairs=[8, 32]))
    # the sweep: one setting per N, sequence length derived per setting
    sweep = dataclasses.replace(cfg, seq_len=None, num_queries=None, test_num_pairs=[8, 16, 32])
    interference.validate(sweep)
    settings = interference.eval_settings(sweep)
    assert [s.num_pairs for s in settings] == [8, 16, 32]
    assert [interference.seq_len(s) for s in settings] == [56, 112, 224]
    assert interference.max_seq_len(sweep) == 224
    big = interference.make_batch(settings[2], 4, seed=0, split="test")
    _interference_checks(settings[2], big)
    assert big.inputs.shape == (4, 224)


def test_interference_schlag_key_regime():
    """Schlag's regime: a sequence's N keys are distinct and drawn from the S = num_keys tokens
    [1, S] (every key of the set in every sequence where S = N), so S can sit below the width."""
    cfg = interference.Config(num_pairs=6, vocab_size=160, key_regime="schlag")
    interference.validate(cfg)
    batch = interference.make_batch(cfg, 64, seed=3)
    keys = _interference_checks(cfg, batch)[..., 0]
    assert torch.equal(keys.sort(1).values, torch.arange(1, 7).expand(64, 6)), "S = N: every key, once"
    assert len({tuple(r) for r in keys.tolist()}) > 32, "in a random order per sequence"
    shared = interference.make_batch(dataclasses.replace(cfg, key_regime="shared"), 64, seed=3)
    assert shared.inputs[:, 0:12:2].max() > 6, "the shared regime draws from the whole key half"
    # a larger key set: N distinct keys of the S, different subsets across sequences
    wide = dataclasses.replace(cfg, num_pairs=4, num_keys=12, test_num_pairs=[2, 4, 12])
    interference.validate(wide)
    sub = _interference_checks(wide, interference.make_batch(wide, 64, seed=0))[..., 0]
    assert sub.max() <= 12 and sub.min() >= 1 and len({frozenset(r) for r in sub.tolist()}) > 8
    # evaluation settings keep the training setting's key set (S = the training N when null)
    settings = interference.eval_settings(dataclasses.replace(cfg, num_pairs=8, test_num_pairs=[2, 8]))
    assert [(s.num_pairs, s.num_keys) for s in settings] == [(2, 8), (8, 8)]
    test = interference.make_batch(settings[0], 64, seed=0, split="test")
    assert _interference_checks(settings[0], test)[..., 0].max() <= 8


@pytest.mark.parametrize("kwargs, message", [
    (dict(key_regime="schlag", test_num_pairs=[4, 8]), r"test num_pairs=8 distinct keys cannot be drawn from "
                                                      r"key_regime=schlag's 4 keys"),
    (dict(key_regime="schlag", num_keys=3), r"num_pairs=4 distinct keys cannot be drawn"),
    (dict(key_regime="schlag", num_keys=40), r"num_keys=40 keys do not fit in the key half \[1, 32\)"),
    (dict(key_regime="schlag", key_len=2), r"key_regime=schlag takes single-token keys"),
    (dict(key_regime="schlag", num_keys=0), r"num_keys must be >= 1"),
    (dict(num_keys=8), r"num_keys=8 sets the key set of key_regime=schlag"),
    (dict(key_regime="vocab"), r"key_regime must be one of shared, schlag, got 'vocab'"),
])
def test_interference_key_regime_refusals(kwargs, message):
    with pytest.raises(ValueError, match=message) as err:
        interference.validate(interference.Config(num_pairs=4, vocab_size=64, **kwargs))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("kwargs, message", [
    (dict(key_overlap=0.5), r"key_overlap=0.5 needs key_len >= 2"),
    (dict(key_overlap=1.0, key_len=2), r"key_overlap must be in \[0, 1\)"),
    (dict(key_overlap=-0.1, key_len=2), r"key_overlap must be in \[0, 1\)"),
    (dict(num_pairs=200, vocab_size=256), r"needs key_len\*P = 1\*200 = 200 distinct key tokens"),
    (dict(num_pairs=64, key_len=3, vocab_size=256), r"needs key_len\*P = 3\*64 = 192"),
    (dict(seq_len=40), r"need 48 positions, seq_len=40"),
    (dict(test_num_pairs=[16, 300]), r"test num_pairs=300 needs key_len\*P"),
    (dict(num_queries=0), r"num_queries must be >= 1"),
    (dict(key_len=0), r"key_len must be >= 1"),
])
def test_interference_validation(kwargs, message):
    with pytest.raises(ValueError, match=message) as err:
        interference.validate(interference.Config(**kwargs))
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------------
# every task: a length axis

@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_evaluates_at_a_list_of_lengths(name):
    module = get_task(name)
    base = module.Config()
    short = base.seq_len or interference.seq_len(base)
    cfg = dataclasses.replace(base, test_seq_len=[short, 4 * short])
    module.validate(cfg)
    settings = module.eval_settings(cfg)
    made = sorted({module.make_batch(s, 2, seed=0, split="test").inputs.shape[1] for s in settings})
    assert made == [short, 4 * short] and module.max_seq_len(cfg) == 4 * short
    long = next(s for s in settings if s.seq_len == 4 * short)
    _check_common(module.make_batch(long, 4, seed=0, split="test"), module.SLICE_NAME)
    with pytest.raises(ValueError, match="test_seq_len must be a list"):
        module.validate(dataclasses.replace(base, test_seq_len=128))


def test_label_positions_gather_every_label_in_order():
    targets = torch.full((3, 8), IGNORE)
    targets[0, [2, 5]] = torch.tensor([7, 9])
    targets[1, [0, 3, 7]] = torch.tensor([1, 2, 3])
    positions, gathered = label_positions(targets)
    assert positions.shape == (3, 3)
    assert positions[0, :2].tolist() == [2, 5] and positions[1].tolist() == [0, 3, 7]
    assert gathered[0].tolist() == [7, 9, IGNORE] and gathered[1].tolist() == [1, 2, 3]
    assert (gathered[2] == IGNORE).all()  # a row without labels carries no loss
    assert torch.equal(targets.gather(1, positions), gathered)


def test_sample_excluding_never_draws_an_excluded_token_and_covers_the_rest():
    g = make_generator(0, "train", "cpu")
    excluded = torch.tensor([[2, 5, 6], [9, 1, 4]])
    draws = sample_excluding(g, (2, 4000), 1, 10, excluded)
    for row, ex in zip(draws.tolist(), excluded.tolist()):
        assert set(row) == set(range(1, 10)) - set(ex)    # every allowed token, nothing else
    counts = torch.bincount(draws[0], minlength=10)[[1, 3, 4, 7, 8, 9]].double()
    assert counts.min() > 0.8 * counts.mean()              # uniform over the allowed tokens


# ---------------------------------------------------------------------------------------------
# recall with distractors (filler=random)

def test_recall_random_filler_keeps_pairs_queries_and_labels_of_the_zero_layout():
    zero = recall.Config(seq_len=96, vocab_size=32, num_pairs=6)
    rand = dataclasses.replace(zero, filler="random")
    a, b = recall.make_batch(zero, 64, seed=5), recall.make_batch(rand, 64, seed=5)
    _check_common(b, "num_pairs")
    for field in ("targets", "slice_value", "target_pos"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    fill = (a.inputs == PAD)                                # every filler position of the zero layout
    assert torch.equal(b.inputs[~fill], a.inputs[~fill])
    assert (b.inputs[fill] != PAD).all()                    # filler_rate = 1: every one is random
    n = zero.num_pairs
    stored = torch.cat([a.inputs[:, :2 * n]], dim=1)        # keys and values of each example
    hit = (b.inputs.unsqueeze(-1) == stored.unsqueeze(1)).any(-1) & fill
    assert not hit.any(), "a stored key or value never appears as a distractor"
    # the distractors use both halves of the vocabulary: unstored keys and values appear
    tokens = b.inputs[fill]
    assert (tokens < 16).any() and (tokens >= 16).any()


def test_recall_filler_rate_sets_the_share_of_random_filler():
    cfg = recall.Config(seq_len=256, vocab_size=64, num_pairs=4, filler="random", filler_rate=0.25)
    batch = recall.make_batch(cfg, 64, seed=1)
    _check_common(batch, "num_pairs")
    after = batch.inputs[:, 8:][~batch.label_mask[:, 8:]]
    assert abs((after != PAD).double().mean().item() - 0.25) < 0.02
    none = recall.make_batch(dataclasses.replace(cfg, filler_rate=0.0), 8, seed=1)
    assert torch.equal(none.inputs, recall.make_batch(dataclasses.replace(cfg, filler="zero"), 8, seed=1).inputs)


# ---------------------------------------------------------------------------------------------
# forgetting

def test_forgetting_hand_worked_example():
    """The docstring's example: writes (3, 9), (5, 12), (3, 14); queries of 5 and 3."""
    write_keys = torch.tensor([[3, 5, 3]])
    asked = torch.tensor([[5, 3]])
    last = forgetting.latest_write(write_keys, asked)
    assert last.tolist() == [[1, 2]]
    values = torch.tensor([[9, 12, 14]])
    assert values.gather(1, last).tolist() == [[12, 14]]              # the latest value
    assert (2 * last + 1).tolist() == [[3, 5]]                        # target_pos
    ages = torch.tensor([6, 8]) - (2 * last[0] + 1)
    assert ages.tolist() == [3, 3] and forgetting.age_bin(ages).tolist() == [2, 2]
    assert forgetting.age_bin(torch.tensor([1, 2, 3, 4, 7, 8, 1000])).tolist() == [1, 2, 2, 4, 4, 8, 512]


def test_forgetting_labels_are_the_latest_write_before_each_query():
    cfg = forgetting.Config(seq_len=48, vocab_size=32, num_pairs=6, num_overwrites=3, num_queries=10)
    batch = forgetting.make_batch(cfg, 32, seed=2)
    _check_common(batch, "overwritten")
    w = forgetting.num_writes(cfg)
    keys, values = batch.inputs[:, 0:2 * w:2], batch.inputs[:, 1:2 * w:2]
    assert all(len(set(r)) == w for r in values.tolist()), "every write has its own value"
    assert all(len(set(r)) == cfg.num_pairs for r in keys.tolist()), "N keys, M of them twice"
    age = dict(batch.other_slices)["age"]
    for b in range(batch.inputs.shape[0]):   # the slow oracle: scan the context for the last write
        for t in batch.label_mask[b].nonzero().squeeze(-1).tolist():
            key = int(batch.inputs[b, t])
            writes = [2 * i for i in range(w) if int(keys[b, i]) == key]
            assert int(batch.targets[b, t]) == int(batch.inputs[b, writes[-1] + 1])
            assert int(batch.target_pos[b, t]) == writes[-1] + 1
            assert int(batch.slice_value[b, t]) == int(len(writes) == 2)
            a = t - (writes[-1] + 1)
            assert int(age[b, t]) <= a < 2 * int(age[b, t])
    assert (age[~batch.label_mask] == NO_SLICE).all()
    over = batch.slice_value[batch.label_mask]
    assert 0.1 < over.double().mean() < 0.9   # both kinds of key are asked


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_overwrites=5), r"num_overwrites=5 exceeds num_pairs=4"),
    (dict(num_pairs=20, num_overwrites=20), r"2\*\(num_pairs \+ num_overwrites\) \+ num_queries = 100 exceeds seq_len=64"),
    (dict(vocab_size=16, num_pairs=6, num_overwrites=3), r"num_pairs \+ num_overwrites = 9 distinct values do not fit"),
    (dict(test_seq_len=[64, 10]), r"exceeds test seq_len=10"),
    (dict(num_overwrites=-1), r"num_overwrites must be >= 0"),
])
def test_forgetting_validation(kwargs, message):
    with pytest.raises(ValueError, match=message) as err:
        forgetting.validate(forgetting.Config(**kwargs))
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------------
# needle in a haystack

def test_needle_hand_worked_example_position():
    """The docstring's example: seq_len 10, one needle at depth 0.5 -> slot 2, positions 4 and 5."""
    assert needle.needle_slot(0.5, 4, 1) == 2
    cfg = needle.Config(seq_len=10, vocab_size=16, depth=0.5)
    batch = needle.make_batch(cfg, 8, seed=0)
    _check_common(batch, "depth")
    assert batch.label_mask[:, 9].all() and batch.label_mask.sum() == 8
    assert (batch.target_pos[:, 9] == 5).all() and torch.equal(batch.inputs[:, 4], batch.inputs[:, 9])
    assert (batch.slice_value[:, 9] == 50).all() and (batch.inputs[:, 8] == PAD).all()  # odd context: one filler


@pytest.mark.parametrize("haystack", needle.HAYSTACKS)
def test_needle_labels_are_unambiguous_in_every_haystack(haystack):
    cfg = needle.Config(seq_len=200, vocab_size=32, num_needles=3, haystack=haystack, depth=0.25)
    batch = needle.make_batch(cfg, 32, seed=3)
    _check_common(batch, "depth")
    t, k = cfg.seq_len, cfg.num_needles
    asked = batch.inputs[:, t - k:]
    context = batch.inputs[:, :t - k]
    # each needle key once in the context, its value once (at target_pos)
    assert ((context.unsqueeze(-1) == asked.unsqueeze(1)).sum(1) == 1).all()
    answers = batch.targets[:, t - k:]
    assert ((context.unsqueeze(-1) == answers.unsqueeze(1)).sum(1) == 1).all()
    slots = (t - k) // 2
    first = needle.needle_slot(0.25, slots, k)
    assert sorted(set((batch.target_pos[:, t - k:] - 1).div(2).flatten().tolist())) == list(range(first, first + k))
    if haystack == "pairs":  # distractor keys recur, in the key half; values in the value half
        keys = context[:, 0:2 * slots:2]
        assert (keys < 16).all() and (context[:, 1:2 * slots:2] >= 16).all()
        assert max(torch.bincount(r).max().item() for r in keys) > 1
    elif haystack == "zero":
        assert (context != PAD).sum(1).eq(2 * k).all()


def test_needle_depth_grid_and_drawn_depths():
    cfg = needle.Config(seq_len=64, test_depth=[0.0, 0.5, 1.0], test_seq_len=[64, 256])
    needle.validate(cfg)
    settings = needle.eval_settings(cfg)
    assert [(s.seq_len, s.depth) for s in settings] == [(64, 0.0), (64, 0.5), (64, 1.0),
                                                        (256, 0.0), (256, 0.5), (256, 1.0)]
    deep = needle.make_batch(settings[-1], 2, seed=0, split="test")
    assert (deep.target_pos[:, -1] == 2 * ((256 - 1) // 2 - 1) + 1).all()   # the last context slot
    drawn = needle.make_batch(needle.Config(seq_len=128), 512, seed=0)
    depths = drawn.slice_value[drawn.label_mask]
    assert set(depths.tolist()) == set(range(0, 101, 10))


@pytest.mark.parametrize("kwargs, message", [
    (dict(depth=1.5), r"depth=1.5 must be in \[0, 1\].*a needle cannot lie deeper"),
    (dict(test_depth=[0.5, -0.1]), r"test_depth entry=-0.1 must be in \[0, 1\]"),
    (dict(num_needles=50, seq_len=128), r"needs 3\*num_needles = 150 positions"),
    (dict(test_seq_len=[128, 2]), r"test seq_len=2"),
    (dict(haystack="hay"), r"unknown haystack 'hay'; valid: pairs, random, zero"),
    (dict(vocab_size=8, num_needles=3), r"num_needles=3 distinct keys and a distractor key do not fit"),
])
def test_needle_validation(kwargs, message):
    with pytest.raises(ValueError, match=message) as err:
        needle.validate(needle.Config(**kwargs))
    assert "\n" not in str(err.value)
