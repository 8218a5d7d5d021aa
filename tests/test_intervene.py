"""Interchange interventions by position (harness.measure.intervene, mode=intervene, trainer.intervene)
and the rule that names a mechanism (harness.measure.mechanism).

What holds by construction, for any model: restoring the corrupted token itself at layer 0's
input gives back the clean run (share 1), restoring a position whose token both runs share at
layer 0's input gives back nothing, and nothing but the query's own final hidden state reaches
its logits from the last block's output. A float64 oracle splices the blocks by hand; a small
trained softmax model shows the control restoring nothing and the CLI and the in-run switch
writing what the functional API computes."""
import json
import os
import subprocess
import sys

import pytest
import torch

import harness
from harness.measure import mechanism
from harness.measure.intervene import (COMPONENTS, CORRUPTIONS, ROLES, intervene, intervene_run, queried_pairs,
                                       replace_token, role_positions)
from harness.model import LanguageModel, ModelConfig, mixer_output
from harness.tasks import IGNORE, get_task

TRAIN = ["task=recall", "task.seq_len=32", "task.vocab_size=64", "task.num_pairs=4", "model=softmax",
         "model.d_model=32", "model.n_heads=2", "trainer.batch_size=32", "trainer.threads=1", "trainer.max_steps=600",
         "trainer.eval_every=50", "trainer.target_accuracy=0.95", "trainer.measure_examples=64",
         "trainer.eval_examples=128", "trainer.intervene=true", "logger=none", "trainer.progress=false"]


class Plain(torch.nn.Module):
    """An outside mixer with nothing but a forward pass (a causal running sum of a projection):
    only the block-level hook points reach it."""

    def __init__(self, d_model):
        super().__init__()
        self.proj = torch.nn.Linear(d_model, d_model)

    def forward(self, x):
        return self.proj(x).cumsum(1) / x.shape[1]


def recall_batch(examples=32, seq_len=24, num_pairs=4, vocab=48, seed=0):
    task = get_task("recall")
    return task.make_batch(task.Config(seq_len=seq_len, vocab_size=vocab, num_pairs=num_pairs), examples, seed=seed)


def cli(*args, cwd, pythonpath=None):
    env = {**os.environ, "WANDB_MODE": "disabled"}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def cell(rows, corrupt, layer, component, role):
    return next(r for r in rows if (r["corrupt"], r["layer"], r["component"], r["role"]) == (corrupt, layer, component, role))


def assert_checks_by_construction(rows, layers):
    """What every model's map satisfies, whatever it learned."""
    for corrupt in CORRUPTIONS:
        own = cell(rows, corrupt, 0, "block_in", corrupt)  # the corrupted token itself, as it enters
        assert own["restored_share"] == pytest.approx(1.0, abs=1e-6)
        assert own["restored_prob"] == pytest.approx(own["clean_prob"], abs=1e-6)
        for role in ROLES:
            if role != corrupt:  # a token both runs share, at the input: nothing to restore
                assert cell(rows, corrupt, 0, "block_in", role)["restored_share"] == pytest.approx(0.0, abs=1e-6)
            # the last block's output reaches the logits only at the query
            last = cell(rows, corrupt, layers - 1, "block_out", role)["restored_share"]
            assert last == pytest.approx(1.0 if role == "query" else 0.0, abs=1e-6), (corrupt, role)


@pytest.mark.parametrize("layers", [["softmax", "softmax"], ["gated_deltanet", "softmax"], ["mamba", "retnet"]])
def test_checks_by_construction_on_built_in_stacks(layers):
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(layers=layers, d_model=16, n_heads=2), vocab_size=48, max_seq_len=24)
    out = intervene(model, recall_batch())
    assert out["examples"] == 32 and out["skipped"] == {}
    assert len(out["rows"]) == len(CORRUPTIONS) * len(layers) * len(COMPONENTS) * len(ROLES)
    assert_checks_by_construction(out["rows"], len(layers))
    # block_in of layer 1 is block_out of layer 0 (one hook point)
    for corrupt in CORRUPTIONS:
        for role in ROLES:
            assert cell(out["rows"], corrupt, 1, "block_in", role) == {
                **cell(out["rows"], corrupt, 0, "block_out", role), "layer": 1, "component": "block_in"}


def test_an_outside_mixer_is_restored_at_the_block_level_and_its_core_skipped_with_the_reason():
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(layers=[f"{__name__}.Plain", "softmax"], d_model=16, n_heads=2), 48, 24)
    out = intervene(model, recall_batch())
    assert "no hook_q, hook_k and hook_v" in out["skipped"]["layer 0 core_in"] and len(out["skipped"]) == 1
    assert {r["component"] for r in out["rows"] if r["layer"] == 0} == {"block_in", "mixer_out", "block_out"}
    assert_checks_by_construction(out["rows"], 2)


def _spliced_logits(model, inputs, query, splice=None):
    """The oracle: LanguageModel.forward and Block.forward written out, with ``splice`` =
    (layer, component, (B, T) mask, clean tensor) put in by hand; and every block's states."""
    x = model.embed(inputs)
    states = {}

    def at(layer, component, x):
        states[layer, component] = x
        if splice is not None and splice[:2] == (layer, component):
            return torch.where(splice[2][..., None], splice[3], x)
        return x

    for i, block in enumerate(model.layers):
        x = at(i, "block_in", x)
        h = at(i, "mixer_out", mixer_output(block.mixer(block.norm1(x))))
        x = x + h
        if block.mlp is not None:
            x = x + block.mlp(block.norm2(x))
        x = at(i, "block_out", x)
    rows = torch.arange(inputs.shape[0])
    return model.head(model.norm_f(x[rows, query]) * model.logit_scale), states


def test_float64_oracle_splices_the_blocks_by_hand():
    torch.manual_seed(1)
    model = LanguageModel(ModelConfig(layers=["softmax", "mamba"], d_model=16, n_heads=2), 48, 24).double().eval()
    batch = recall_batch(examples=16)
    out = intervene(model, batch, seed=3)
    q = queried_pairs(batch.inputs, batch.targets, batch.target_pos, 48)
    where = role_positions(q)
    with torch.no_grad():
        clean_logits, clean = _spliced_logits(model, q.inputs, q.query)
        for k, corrupt in enumerate(CORRUPTIONS):
            generator = torch.Generator().manual_seed(3 * len(CORRUPTIONS) + k)  # intervene's draw
            bad = replace_token(q.inputs, q.key if corrupt == "key" else q.value, 48, generator)
            bad_logits, _ = _spliced_logits(model, bad, q.query)
            alt = bad_logits.scatter(1, q.answer[:, None], float("-inf")).argmax(-1)
            diff = lambda z: (z.gather(1, q.answer[:, None]) - z.gather(1, alt[:, None])).mean()  # noqa: E731
            for layer in (0, 1):
                for component in ("block_in", "mixer_out", "block_out"):
                    for role in ROLES:
                        restored, _ = _spliced_logits(model, bad, q.query,
                                                      (layer, component, where[role], clean[layer, component]))
                        has = where[role].any(1)
                        share = float((diff(restored[has]) - diff(bad_logits[has]))
                                      / (diff(clean_logits[has]) - diff(bad_logits[has])))
                        prob = float(restored[has].softmax(-1).gather(1, q.answer[has, None]).mean())
                        got = cell(out["rows"], corrupt, layer, component, role)
                        assert got["restored_share"] == pytest.approx(share, abs=1e-10), (corrupt, layer, component, role)
                        assert got["restored_prob"] == pytest.approx(prob, abs=1e-12)


def test_the_followed_query_its_pair_and_the_replacement_token():
    batch = recall_batch(examples=64)
    q = queried_pairs(batch.inputs, batch.targets, batch.target_pos, 48)
    rows = torch.arange(64)
    assert torch.equal(q.inputs[rows, q.value], q.answer) and (q.answer >= 24).all()
    assert ((q.inputs[rows, q.key] >= 1) & (q.inputs[rows, q.key] < 24)).all()
    assert torch.equal(q.inputs[rows, q.query], q.inputs[rows, q.key])  # a query asks its key
    last = torch.where(batch.targets != IGNORE, torch.arange(24), -1).max(1).values
    assert torch.equal(q.query, last)
    assert ((q.other > q.value) | (q.other < q.value)).all() and torch.equal(q.inputs[rows, q.other] >= 24, torch.ones(64, dtype=torch.bool))
    for at, low, high in ((q.key, 1, 24), (q.value, 24, 48)):
        bad = replace_token(q.inputs, at, 48, torch.Generator().manual_seed(0))
        new = bad[rows, at]
        assert ((new >= low) & (new < high)).all()
        assert not (q.inputs == new[:, None]).any()  # a token nowhere in the example
        assert (bad != q.inputs).sum() == 64  # that one token, nothing else


def test_interference_keys_of_two_tokens_corrupt_the_token_before_the_value():
    task = get_task("interference")
    batch = task.make_batch(task.Config(num_pairs=4, vocab_size=64, key_len=2, key_overlap=0.5), 8, seed=0)
    q = queried_pairs(batch.inputs, batch.targets, batch.target_pos, 64)
    rows = torch.arange(8)
    assert torch.equal(q.key, q.value - 1) and torch.equal(q.inputs[rows, q.query], q.inputs[rows, q.key])
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(layers=["deltanet", "softmax"], d_model=16, n_heads=2), 64, batch.inputs.shape[1])
    assert_checks_by_construction(intervene(model, batch)["rows"], 2)


def test_a_batch_without_a_pair_layout_is_refused_in_one_line():
    inputs = torch.tensor([[5, 6, 5, 0]])  # V = 16: the "answer" 6 is in the key half, not a value
    targets = torch.full_like(inputs, IGNORE)
    targets[0, 2] = 6
    target_pos = torch.full_like(inputs, -1)
    target_pos[0, 2] = 1
    model = LanguageModel(ModelConfig(name="softmax", d_model=16, n_heads=2), 16, 4)
    with pytest.raises(ValueError, match="no example of this batch has a labelled query whose answer is a value"):
        intervene(model, {"inputs": inputs, "targets": targets, "target_pos": target_pos})


# --- the rule -----------------------------------------------------------------------------

def synthetic(cells, layers=2, clean=0.95, corrupted=0.2):
    """Key-corruption rows with every share 0 but ``cells`` {(layer, component, role): share}."""
    return [{"corrupt": "key", "layer": layer, "component": c, "role": role, "clean_prob": clean,
             "corrupted_prob": corrupted, "restored_prob": corrupted,
             "restored_share": cells.get((layer, c, role), 1.0 if (layer, c, role) == (layers - 1, "block_out", "query")
                                         else 0.0), "examples": 64}
            for layer in range(layers) for c in COMPONENTS for role in ROLES]


@pytest.mark.parametrize("cells,label", [
    ({(0, "block_out", "value"): 0.9, (1, "mixer_out", "query"): 0.9}, mechanism.INDUCTION),
    ({(0, "core_in", "value"): 0.8, (0, "mixer_out", "query"): 0.8}, mechanism.CONVOLUTION),
    ({(1, "core_in", "between"): 0.9, (0, "block_out", "key"): 0.95}, mechanism.CONVOLUTION),  # the next token's write
    ({(1, "core_in", "value"): 0.8, (1, "block_in", "value"): 0.7}, mechanism.MIXED),  # bound before layer 1: not in it
    ({(0, "mixer_out", "query"): 0.9}, mechanism.LAST_STATE),
    ({(0, "mixer_out", "query"): 0.9, (0, "block_out", "between"): 0.3}, mechanism.MIXED),
    ({(0, "block_out", "value"): 0.9, (0, "block_out", "other_pair"): 0.25}, mechanism.MIXED),  # the control leaks
    ({(0, "block_out", "value"): 0.45, (0, "core_in", "value"): 0.45}, mechanism.MIXED),
    ({(1, "block_out", "value"): 0.9}, mechanism.MIXED),  # the last block's output reaches no query
])
def test_the_rule_names_each_mechanism_by_its_thresholds(cells, label):
    assert mechanism.mechanism_label(synthetic(cells)) == label


def test_the_rule_names_no_mechanism_for_a_model_that_did_not_learn_or_a_corruption_without_effect():
    bound = {(0, "block_out", "value"): 0.9}
    assert mechanism.mechanism_label(synthetic(bound, clean=0.4)) == mechanism.NOT_LEARNED
    assert mechanism.mechanism_label(synthetic(bound, clean=0.95, corrupted=0.8)) == mechanism.MIXED
    assert mechanism.mechanism_label(synthetic(bound)) == mechanism.INDUCTION


# --- a trained model: the CLI, the in-run switch, the functional API ------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2-layer softmax model trained to recall with trainer.intervene=true, and mode=intervene on it."""
    root = tmp_path_factory.mktemp("intervene")
    done = cli(*TRAIN, f"out_dir={root / 'run'}", cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    iv = cli("mode=intervene", f"intervene.run={root / 'run'}", "intervene.examples=128", "logger=none",
             "trainer.threads=1", f"out_dir={root / 'iv'}", cwd=root)
    assert iv.returncode == 0, iv.stderr[-2000:]
    return root, done.stdout, iv.stdout


def test_a_trained_model_restores_nothing_through_another_pair(trained):
    root, _, _ = trained
    run = json.loads((root / "run" / "results.json").read_text())
    assert run["summary"]["accuracy"] >= 0.9  # it learned: otherwise its map says nothing
    found = json.loads((root / "iv" / "results.json").read_text())
    for rows in (run["intervene"], found["intervene"]):
        assert_checks_by_construction(rows, 2)
        for r in rows:
            if r["role"] == "other_pair" and r["component"] != "core_in":
                assert abs(r["restored_share"]) < 0.1, r
        key = cell(rows, "key", 0, "block_in", "key")
        assert key["clean_prob"] > 0.8 and key["clean_prob"] - key["corrupted_prob"] > 0.5  # the key matters
    for res in (run, found):
        assert res["mechanism"] == mechanism.mechanism_label(res["intervene"]) and res["mechanism"] in mechanism.LABELS
        assert res["summary"]["mechanism_clean_prob"] == pytest.approx(mechanism.evidence(res["intervene"])["clean_prob"])


def test_the_cli_prints_the_table_and_agrees_with_the_functional_api(trained):
    root, train_out, stdout = trained
    found = json.loads((root / "iv" / "results.json").read_text())
    assert found["mode"] == "intervene" and found["measure"] == {"intervene": "ok"}
    assert f"[harness] intervene: mechanism: {found['mechanism']}" in stdout
    assert f"[harness] mechanism (interchange interventions): " in train_out
    own = cell(found["intervene"], "key", 1, "mixer_out", "query")
    assert f"    1 mixer_out " in stdout and f"{own['restored_share']:>10.3f}" in stdout
    loaded = harness.load_run(root / "run")
    api = intervene_run(loaded.model, loaded.config, examples=128)
    assert len(api["rows"]) == len(found["intervene"]) == 80
    for a, c in zip(api["rows"], found["intervene"]):
        assert (a["corrupt"], a["layer"], a["component"], a["role"]) == (c["corrupt"], c["layer"], c["component"], c["role"])
        assert a["restored_share"] == pytest.approx(c["restored_share"], abs=1e-6)
    # the functional API at the top of the package is the same function
    batch = loaded.batch(16, split="test")
    assert harness.intervene(loaded.model, batch)["rows"] == intervene(loaded.model, batch)["rows"]


@pytest.mark.parametrize("args,message", [
    ([], "mode=intervene needs intervene.run=<a trained run's directory>"),
    (["intervene.run=/nonexistent/run"], "intervene.run=/nonexistent/run: not a directory"),
    (["intervene.run=."], "intervene.run=.: not a finished run (no results.json there)"),
    (["intervene.run=/tmp", "intervene.examples=0"], "intervene.examples must be"),
])
def test_a_bad_source_run_is_refused_in_one_line(tmp_path, args, message):
    done = cli("mode=intervene", *args, "logger=none", f"out_dir={tmp_path / 'out'}", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("harness: error:") and message in lines[0], done.stderr


def test_a_hybrid_and_an_outside_mixer_through_the_cli(tmp_path):
    (tmp_path / "outside_mixers.py").write_text(
        "import torch\n\n\nclass Plain(torch.nn.Module):\n    def __init__(self, d_model):\n        super().__init__()\n"
        "        self.proj = torch.nn.Linear(d_model, d_model)\n\n    def forward(self, x):\n"
        "        return self.proj(x).cumsum(1) / x.shape[1]\n")
    small = ["task.seq_len=24", "task.vocab_size=48", "model.d_model=16", "model.n_heads=2", "trainer=debug",
             "trainer.threads=1", "logger=none"]
    for name, model in (("hybrid", "model.layers=[gated_deltanet,softmax]"), ("outside", "model.name=outside_mixers.Plain")):
        done = cli(*small, model, f"out_dir={tmp_path / name}", cwd=tmp_path, pythonpath=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
    refused = cli("mode=intervene", f"intervene.run={tmp_path / 'outside'}", "logger=none", f"out_dir={tmp_path / 'r'}",
                  cwd=tmp_path, pythonpath=tmp_path)
    assert refused.returncode == 2 and "trust_code" in refused.stderr  # outside code: the trust gate
    for name, trust, skipped in (("hybrid", [], []), ("outside", ["intervene.trust_code=true"], ["layer 0 core_in", "layer 1 core_in"])):
        done = cli("mode=intervene", f"intervene.run={tmp_path / name}", "intervene.examples=32", *trust, "logger=none",
                   "trainer.threads=1", f"out_dir={tmp_path / (name + '_iv')}", cwd=tmp_path, pythonpath=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
        found = json.loads((tmp_path / (name + "_iv") / "results.json").read_text())
        assert_checks_by_construction(found["intervene"], 2)
        assert "[harness] intervene: mechanism: " in done.stdout
        measured = found["measure"]["intervene"]
        assert (measured == "ok") if not skipped else (sorted(measured) == skipped), measured


def test_the_intervention_keys_at_their_defaults_leave_a_plain_runs_hash_as_it_was():
    from harness.config.digest import flat_hash

    before = {"mode": "train", "model.name": "elu", "model.d_model": 64, "seed": 0}
    now = dict(before, **{"trainer.intervene": False, "intervene.run": None, "intervene.examples": 256,
                          "intervene.seed": 1_000_003, "intervene.trust_code": False})
    assert flat_hash(now) == flat_hash(before)  # finished sweeps are still found by their skip check
    assert flat_hash(dict(now, **{"trainer.intervene": True})) != flat_hash(now)
    mode = dict(now, mode="intervene")
    assert flat_hash(mode) != flat_hash(dict(mode, **{"intervene.examples": 128}))
