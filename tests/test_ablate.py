"""Causal attribution (harness.measure.ablate, mode=ablate) on a small trained softmax model:
the head the end-of-run measurements name as the retrieval head carries recall."""
import json

import pytest
import torch

import harness
from harness.hooks import intervene
from harness.measure.ablate import ablate, ablate_run, edit
from harness.measure.corruption import corrupt
from harness.model import LanguageModel, ModelConfig
from harness.tasks import IGNORE

NUM_PAIRS = 4
TRAIN = ["task=recall", "task.seq_len=32", "task.vocab_size=64", f"task.num_pairs={NUM_PAIRS}", "model=softmax",
         "model.n_heads=2", "model.d_model=64", "trainer.batch_size=32", "trainer.threads=1",
         "trainer.max_steps=400", "trainer.eval_every=50", "trainer.target_accuracy=0.9",
         "trainer.measure_examples=32", "trainer.eval_examples=128", "logger=none", "trainer.progress=false"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2-layer, 2-head softmax model trained to recall (about 250 steps), and mode=ablate on it."""
    import os
    import subprocess
    import sys

    root = tmp_path_factory.mktemp("ablate")
    env = {**os.environ, "WANDB_MODE": "disabled"}
    run = lambda *o: subprocess.run([sys.executable, "-m", "harness", *o], cwd=root, env=env,  # noqa: E731
                                    capture_output=True, text=True, timeout=600)
    done = run(*TRAIN, f"out_dir={root / 'run'}")
    assert done.returncode == 0, done.stderr[-2000:]
    cli = run("mode=ablate", f"ablate.run={root / 'run'}", "ablate.examples=128", "logger=none",
              "trainer.threads=1", f"out_dir={root / 'ablate'}")
    assert cli.returncode == 0, cli.stderr[-2000:]
    return root, cli.stdout


def test_retrieval_head_carries_recall(trained):
    root, stdout = trained
    own = json.loads((root / "run" / "results.json").read_text())["summary"]
    assert own["accuracy"] > 0.8  # it learned the task: otherwise nothing below means anything
    found = json.loads((root / "ablate" / "results.json").read_text())
    rows = [r for r in found["ablate"] if r["kind"] == "zero" and r["head"] is not None]
    key = (own["retrieval_layer"], own["retrieval_head"])
    named = next(r for r in rows if (r["layer"], r["head"]) == key)
    assert named["accuracy"] < 1 / NUM_PAIRS + 0.1  # near chance: a guess among the stored values
    for r in rows:
        if (r["layer"], r["head"]) != key:
            assert r["drop"] < 0.5 * named["drop"], r
    patched = {(r["layer"], r["head"]): r["restored"] for r in found["ablate"]
               if r["kind"] == "patch" and r["corrupt"] == "query"}
    assert patched[key] > 0.5 and patched[key] == max(patched.values())
    mean = next(r for r in found["ablate"] if r["kind"] == "mean" and (r["layer"], r["head"]) == key)
    assert mean["accuracy"] < 1 / NUM_PAIRS + 0.15
    assert "restores" in stdout and f"{named['accuracy']:.3f}" in stdout


def test_cli_and_functional_api_agree(trained):
    root, _ = trained
    cli = json.loads((root / "ablate" / "results.json").read_text())
    loaded = harness.load_run(root / "run")
    api = ablate_run(loaded.model, loaded.config, examples=128)
    assert len(api["rows"]) == len(cli["ablate"]) > 0
    for a, c in zip(api["rows"], cli["ablate"]):
        assert (a["layer"], a["head"], a["kind"]) == (c["layer"], c["head"], c["kind"])
        for k in ("accuracy", "restored"):
            if k in a:
                assert a[k] == pytest.approx(c[k], abs=1e-6)


def test_edits_leave_the_model_unchanged_outside_the_block():
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(name="softmax", d_model=16, n_heads=2), vocab_size=16, max_seq_len=8).eval()
    x = torch.randint(0, 16, (2, 8))
    before = model(x)
    with intervene(model, {"layers.1.mixer.hook_out": edit("zero", 0, None)}):
        during = model(x)
    assert not torch.allclose(before, during)
    assert torch.equal(before, model(x))
    with pytest.raises(KeyError, match="not a hook point"):
        with intervene(model, {"layers.9.mixer.hook_out": edit("zero", 0, None)}):
            pass


def test_corrupt_swaps_queried_keys_within_an_example():
    inputs = torch.tensor([[5, 1, 6, 2, 5, 6, 0, 0]])
    targets = torch.full_like(inputs, IGNORE)
    targets[0, 4], targets[0, 5] = 1, 2
    bad, labels, other = corrupt({"inputs": inputs, "targets": targets})
    assert bad[0, 4] == 6 and bad[0, 5] == 5 and other[0, 4] == 2 and other[0, 5] == 1
    assert torch.equal(labels, targets)


class NoHeads(torch.nn.Module):
    """An outside mixer that declares no hook points."""

    def __init__(self, d_model):
        super().__init__()
        self.proj = torch.nn.Linear(d_model, d_model)

    def forward(self, x):
        return self.proj(x)


def test_outside_mixer_without_hooks_is_ablated_by_layer_and_says_why_not_by_head():
    cfg = ModelConfig(layers=["softmax", f"{__name__}.NoHeads"], d_model=16, n_heads=2)
    model = LanguageModel(cfg, vocab_size=16, max_seq_len=8)
    targets = torch.full((4, 8), IGNORE)
    targets[:, 5:] = 3
    out = ablate(model, {"inputs": torch.randint(0, 16, (4, 8)), "targets": targets}, patch=False)
    assert "no hook_out" in out["skipped"]["layer 1 heads"]
    layer1 = {(r["head"], r["kind"]) for r in out["rows"] if r["layer"] == 1}
    assert layer1 == {(None, "zero"), (None, "mean"), (None, "resample")}
    assert "no target_pos" in out["skipped"]["corrupt key"]  # the batch says not where answers sit
    assert {r["head"] for r in out["rows"] if r["layer"] == 0} == {None, 0, 1}
