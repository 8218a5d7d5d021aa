"""The Jacobian estimate of effective weights (harness.measure.jacobian) held against the exact
weights of built-in mixers on the default recall task, at initialisation: the weight on the
answer span of every layer within 0.05, and the same retrieval layer where the exact layers are
told apart by more than twice that (at initialisation they are often tied)."""
from __future__ import annotations

import pytest
import torch

from harness.measure.trained import measure_model
from harness.model import LanguageModel, ModelConfig
from harness.tasks import recall

TOLERANCE = 0.05  # |target_weight(jacobian) - target_weight(exact)| of the retrieval head


@pytest.mark.parametrize("name", ["softmax", "elu"])
def test_the_jacobian_estimate_finds_the_exact_retrieval_head(name):
    torch.manual_seed(0)
    task = recall.Config()  # the default task
    model = LanguageModel(ModelConfig(name=name, d_model=32, n_heads=1, n_layers=2), task.vocab_size,
                          recall.max_seq_len(task))
    batch = recall.make_batch(task, 8, seed=0, split="test")
    exact = measure_model(model, batch)
    est = measure_model(model, batch, weights="jacobian")
    assert exact["measure"]["sharpness"] == "ok" and est["measure"]["sharpness"] == "jacobian estimate"
    assert est["summary"]["weights"] == "jacobian estimate" and "snr_measured" not in est["summary"]
    e, j = exact["summary"], est["summary"]
    by = lambda res: {r["layer"]: r["target_weight"] for r in res["heads"]}  # noqa: E731
    weights = sorted(by(exact).values())
    if weights[-1] - weights[-2] > 2 * TOLERANCE:
        assert j["retrieval_layer"] == e["retrieval_layer"]
    assert abs(j["target_weight"] - e["target_weight"]) < TOLERANCE, (e, j)
    # per layer too, not only the best one
    for layer, weight in by(exact).items():
        assert abs(by(est)[layer] - weight) < TOLERANCE


def test_the_jacobian_estimate_on_a_batch_larger_than_it_reads_reports_the_examples_it_read():
    # a measurement batch of the trainer's size (measure_examples 64) meets an estimate built on
    # its first JACOBIAN_EXAMPLES examples: rows of the two must line up, not raise
    from harness.measure.jacobian import JACOBIAN_EXAMPLES
    torch.manual_seed(0)
    task = recall.Config()
    model = LanguageModel(ModelConfig(name="elu", d_model=32, n_heads=1, n_layers=1), task.vocab_size,
                          recall.max_seq_len(task))
    batch = recall.make_batch(task, 2 * JACOBIAN_EXAMPLES, seed=0, split="test")
    est = measure_model(model, batch, weights="jacobian")["summary"]
    exact = measure_model(model, batch, max_examples=JACOBIAN_EXAMPLES)["summary"]
    assert est["measure_examples"] == 2 * JACOBIAN_EXAMPLES and est["jacobian_examples"] == JACOBIAN_EXAMPLES
    assert abs(est["target_weight"] - exact["target_weight"]) < TOLERANCE
