"""Hedgehog's monotonicity in the sharpness figure: a 1 that a map has by construction (softmax,
the identity map) is flagged and never ranked, on synthetic results."""
from __future__ import annotations

import pandas as pd
import pytest
from conftest import draw_figure

from analysis.plots.sharpness import monotone_by_construction


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


def test_by_construction_is_what_the_mixer_declares_and_not_the_value():
    heads = pd.DataFrame({"label": ["softmax", "linear", "linear", "elu", "hybrid", "hybrid"],
                          "monotonicity": [1.0, 0.9998, 0.9997, 1.0, 1.0, 1.0],
                          "monotone_in_score": [True, True, True, False, True, float("nan")]})
    # linear below 1 by rounding is flagged; elu at 1 is not (it declares no such map); a label
    # with a head that declares nothing is not either
    assert monotone_by_construction(heads) == {"softmax", "linear"}
    assert monotone_by_construction(heads.drop(columns="monotone_in_score")) == set()


def test_the_figure_hatches_the_bars_it_flags(drawn):
    axis = drawn.axes[2]
    hatched = {axis.get_xticklabels()[round(b.get_x() + b.get_width() / 2)].get_text()
               for b in axis.patches if b.get_hatch()}
    assert hatched == {"softmax", "linear"}
    assert "Hatched: monotone by construction" in drawn.caption
