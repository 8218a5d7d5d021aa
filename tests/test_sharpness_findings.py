"""Hedgehog's monotonicity in the sharpness figure: a 1 that a map has by construction (softmax,
the identity map) is flagged and never ranked, on synthetic results."""
from __future__ import annotations

import pandas as pd
import pytest
from conftest import draw_figure

from analysis.plots.sharpness import by_construction


@pytest.fixture(scope="module")
def drawn(tree):
    return draw_figure(tree, "sharpness")


def test_a_one_by_construction_is_flagged_and_not_ranked(drawn):
    table = drawn.tables["sharpness"].set_index(["metric", "label"])
    flagged = set(table[table["by_construction"]].index)
    assert flagged == {("monotonicity", "softmax"), ("monotonicity", "linear")}
    ranking = drawn.tables["sharpness_ranking"]
    mono = ranking[ranking["metric"] == "monotonicity"]
    assert len(mono) and not ({"softmax", "linear"} & (set(mono["a"]) | set(mono["b"])))
    assert len(ranking[(ranking["metric"] == "target_weight") & (ranking["a"] == "softmax")])  # still ranked there
    assert "Hedgehog" in drawn.axes[2].get_ylabel()


def test_by_construction_needs_every_seed_at_one():
    row = pd.Series({"metric": "monotonicity", "seed_0": 1.0, "seed_1": 0.999})
    assert not by_construction(row) and by_construction(row.replace(0.999, 1.0))
    assert not by_construction(pd.Series({"metric": "entropy", "seed_0": 1.0}))
