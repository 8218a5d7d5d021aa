"""Re-assignment as a 2x2 (analysis.plots.forgetting's reassignment figure): the delta rule and its
additive control on overwritten and untouched keys of the same runs, the interaction of the two
with its interval, and the share of the control's wrong answers that are the stale value, on
synthetic results; and the task's record of that stale value, on real batches."""
from __future__ import annotations

import pytest
import torch
from conftest import draw_figure, make_results
from analysis.synthetic.forgetting import REASSIGNMENT_GAIN, REASSIGNMENT_LR, STALE_SHARE

from analysis import stats
from analysis.plots.forgetting import OVERWRITTEN, UNTOUCHED
from harness.tasks import IGNORE, forgetting

INTERACTION = "interaction (gain on overwritten - gain on untouched)"


@pytest.fixture(scope="module")
def drawn(tree):
    return draw_figure(tree, "reassignment")


def quantity(drawn, model: str, name: str):
    table = drawn.tables["reassignment"]
    return table[(table["model"] == model) & (table["quantity"] == name)].iloc[0]


def test_the_interaction_separates_replacing_from_a_gain_everywhere(drawn):
    gain = quantity(drawn, "deltanet", f"gain (delta - additive), {OVERWRITTEN}")
    assert gain["mean"] == pytest.approx(REASSIGNMENT_GAIN, abs=0.03) and gain["n"] == 5
    assert 0 < gain["low"] < gain["mean"] < gain["high"]
    untouched = quantity(drawn, "deltanet", f"gain (delta - additive), {UNTOUCHED}")
    assert untouched["mean"] == pytest.approx(0.0, abs=0.03) and untouched["low"] < 0 < untouched["high"]
    both = quantity(drawn, "deltanet", INTERACTION)
    assert both["mean"] == pytest.approx(gain["mean"] - untouched["mean"]) and both["low"] <= both["mean"]
    assert both["interval_method"].startswith("Student t over seeds")
    tie = quantity(drawn, "gated_deltanet", INTERACTION)
    assert tie["mean"] == pytest.approx(0.0, abs=0.03)


def test_the_stale_share_of_the_controls_errors_and_each_rules_own_rate(drawn):
    stale = quantity(drawn, "deltanet", "stale share of the additive rule's errors on overwritten keys")
    assert stale["mean"] == pytest.approx(STALE_SHARE["additive"], abs=0.02) and stale["n"] == 5
    own = quantity(drawn, "deltanet", "stale share of the delta rule's errors on overwritten keys")
    assert own["mean"] == pytest.approx(0.0)
    assert float(stale["lr_delta"]) == REASSIGNMENT_LR["delta"]
    assert float(stale["lr_additive"]) == REASSIGNMENT_LR["additive"]
    assert stale["rates"] == "set per mixer before the sweep, not chosen"
    assert "set per mixer before the sweep" in drawn.caption


def test_every_cell_has_five_seeds_a_named_interval_and_its_stops(drawn):
    points = drawn.tables["reassignment_points"]
    assert (points["n"] == 5).all() and len(points) == 4 * 2  # two mixers x two rules, two kinds of key
    assert points["interval_method"].isin([stats.METHOD, stats.FALLBACK]).all()
    at_max = points.set_index(["label", "key"])["runs_at_max_steps"]
    assert at_max.sum() == 2 and at_max[("deltanet additive", OVERWRITTEN)] == 1  # one run, both its keys
    pair = drawn.tables["reassignment"].groupby("model")[["runs_at_max_steps", "lower_bound"]].first()
    assert pair.loc["deltanet", "runs_at_max_steps"] == 1 and pair.loc["deltanet", "lower_bound"]
    assert not pair.loc["gated_deltanet", "lower_bound"]


def test_the_task_records_the_stale_value_of_each_key_written_twice():
    cfg = forgetting.Config(seq_len=48, vocab_size=64, num_pairs=8, num_overwrites=4)
    batch = forgetting.make_batch(cfg, 16, seed=3)
    labelled = batch.targets != IGNORE
    twice = labelled & (batch.slice_value == 1)
    assert ((batch.stale != IGNORE) == twice).all()  # a stale value exactly where a key was overwritten
    for b, t in twice.nonzero().tolist():
        key = batch.inputs[b, t]
        writes = [i for i in range(0, 24, 2) if batch.inputs[b, i] == key]
        assert len(writes) == 2
        assert batch.stale[b, t] == batch.inputs[b, writes[0] + 1]      # the first write's value
        assert batch.targets[b, t] == batch.inputs[b, writes[1] + 1]    # the latest is the answer
    same = forgetting.make_batch(cfg, 16, seed=3)
    assert torch.equal(same.inputs, batch.inputs) and torch.equal(same.stale, batch.stale)
