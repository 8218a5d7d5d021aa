"""Every task x model pair trains end to end through the composed Hydra config."""
import json

import pytest
import torch

from harness.config.compose import compose_config
from harness.run.job import run_job

TASKS = ["recall", "induction", "interference"]
MODELS = ["softmax", "linear", "elu", "favor", "taylor", "retnet", "mamba"]


def run(tmp_path, *overrides):
    cfg = compose_config(["trainer=debug", "logger=none", f"out_dir={tmp_path}", *overrides])
    run_job(cfg)
    return json.loads((tmp_path / "results.json").read_text())


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("model", MODELS)
def test_task_model_pair_runs(tmp_path, task, model):
    res = run(tmp_path, f"task={task}", f"model={model}")
    assert res["status"] == "ok" and res["task"] == task and res["model"] == model
    s = res["summary"]
    assert 0.0 <= s["accuracy"] <= 1.0 and s["steps"] == 6
    assert s["state_elements_per_head"] > 0 and s["params"] > 0
    assert res["slices"] and all(0 <= r["accuracy"] <= 1 for r in res["slices"])
    assert res["heads"], "measurements are on by default"
    assert res["config"]["model.name"] == model  # flat config
    assert (tmp_path / "metrics.jsonl").exists() and (tmp_path / "model.pt").exists()


def test_recall_accuracy_is_sliced_per_num_pairs(tmp_path):
    res = run(tmp_path, "task=recall", "model=softmax", "task.test_num_pairs=[2,4,8]",
              "task.test_seq_len=[64]")
    values = sorted({r["value"] for r in res["slices"] if r["slice"] == "num_pairs"})
    assert values == [2, 4, 8]


def test_training_is_deterministic_on_cpu(tmp_path):
    a = run(tmp_path / "a", "model=elu", "seed=3")
    b = run(tmp_path / "b", "model=elu", "seed=3")
    c = run(tmp_path / "c", "model=elu", "seed=4")
    assert a["summary"]["loss"] == b["summary"]["loss"]
    assert a["summary"]["loss"] != c["summary"]["loss"]


def test_softmax_learns_default_recall_well_above_chance(tmp_path):
    res = run(tmp_path, "task=recall", "model=softmax", "task.num_queries=56", "trainer.max_steps=500",
              "trainer.batch_size=32", "trainer.eval_every=100", "trainer.eval_examples=128",
              "trainer.warmup_steps=20")
    vocab_values = res["config"]["task.vocab_size"] // 2
    assert res["summary"]["accuracy"] > 20 / vocab_values, res["summary"]


def test_checkpoint_reloads_into_the_same_model(tmp_path):
    from harness.model import LanguageModel, ModelConfig

    run(tmp_path, "model=retnet")
    ckpt = torch.load(tmp_path / "model.pt", weights_only=True)
    mcfg = ModelConfig(**ckpt["config"]["model"])
    model = LanguageModel(mcfg, vocab_size=ckpt["config"]["task"]["vocab_size"], max_seq_len=64)
    model.load_state_dict(ckpt["model"])


def test_on_step_is_called_once_per_step_in_order(tmp_path):
    from harness.train.loop import train

    cfg = compose_config(["trainer=debug", "logger=none", "trainer.measure=false", f"out_dir={tmp_path}"])
    steps = []
    train(cfg, tmp_path, on_step=steps.append)
    assert steps == list(range(1, cfg.trainer.max_steps + 1))


def test_threads_option_sets_torch_threads_and_rejects_zero(tmp_path):
    before = torch.get_num_threads()
    try:
        run(tmp_path / "a", "trainer.threads=1")
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="trainer.threads must be a positive integer or null, got 0"):
        run(tmp_path / "b", "trainer.threads=0")
