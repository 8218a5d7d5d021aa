"""The delta rule against its additive control on re-assigned keys (analysis.plots.forgetting's
reassignment figure): the paired difference and its interval, on synthetic results."""
from __future__ import annotations

import pytest
from conftest import draw_figure, make_results

from analysis.plots.forgetting import KIND


@pytest.fixture(scope="module")
def drawn(tree):
    return draw_figure(tree, "reassignment")


def test_the_rule_gains_where_it_replaces_and_ties_where_it_does_not(drawn):
    rules = drawn.tables["reassignment_rule"].set_index(["model", "key"])
    gain = rules.loc[("deltanet", KIND[1])]
    assert gain["mean"] == pytest.approx(make_results.REASSIGNMENT_GAIN, abs=0.03) and gain["n"] == 5
    assert 0 < gain["low"] < gain["mean"] < gain["high"] and gain["separated"]
    assert "paired difference" in gain["interval_method"] and "bootstrap" in gain["interval_method"]
    tie = rules.loc[("gated_deltanet", KIND[1])]
    assert tie["mean"] == pytest.approx(0.0, abs=0.03) and not tie["separated"]
    assert rules.loc[("deltanet", KIND[0]), "mean"] == pytest.approx(0.0, abs=0.03)  # untouched keys: no gain
    assert ("deltanet", "all keys") in rules.index


def test_every_point_has_five_seeds_and_a_named_interval(drawn):
    points = drawn.tables["reassignment"]
    assert (points["n"] == 5).all() and points["interval_method"].str.contains("bootstrap").all()
    assert len(points) == 4 * 2  # two mixers x two rules, overwritten and untouched keys
