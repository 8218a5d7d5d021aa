"""The state apart from the embedding, on synthetic results with known answers: N at 50% of a
wide model against its key width (the exponent and the 16-over-8 ratio with intervals), the
narrow model's confound, the break beside the ceiling, and softmax as the control."""
from __future__ import annotations

import math

import pytest
from conftest import make_results
from analysis.synthetic.capacity import CAPACITY_KEY_N, CAPACITY_NARROW_N
from analysis.synthetic.law import CAPACITY_LENGTHS

from analysis.loader import load_all
from analysis.plots.capacity import BREAK_FRACTION, break_n, capacity_figure


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    root = make_results.write_results_tree(tmp_path_factory.mktemp("keys"), experiments=("capacity_keys",))
    return capacity_figure(load_all(root / "capacity_keys")).tables


def test_break_reads_the_fall_from_the_mixers_own_level_not_a_fixed_ceiling():
    # a narrow model that never reaches 0.9: its own level at N = 2 is 0.8
    n, acc = [2, 4, 8, 16], [0.80, 0.795, 0.70, 0.40]
    assert break_n(n, acc) == 4 and 0.795 >= BREAK_FRACTION * 0.80 > 0.70
    assert break_n([2, 4], [1.0, 1.0]) == 4 and math.isnan(break_n([], []))


def test_n50_rows_carry_their_key_width_and_the_mixer_whatever_its_width(tables):
    half = tables["capacity_n50"]
    wide = half[half["config.model.d_model"] == 64]
    assert sorted(wide["qk_dim"].unique()) == [4, 8, 16] and set(wide["base_label"]) == {"elu", "deltanet"}
    elu = wide[wide["base_label"] == "elu"].set_index("qk_dim")
    for d in (4, 8, 16):  # N at 50% near 2.5 d (seeds 8% apart; interpolated in log N between grid points)
        assert elu.loc[d, "n50_per_n"] == pytest.approx(2.5 * d, rel=0.25)
        assert elu.loc[d, "n_break"] < elu.loc[d, "n50_per_n"]


def test_the_exponent_and_ratio_tell_the_law_from_a_faster_growth(tables):
    keys = tables["capacity_n50"].drop_duplicates("base_label").set_index("base_label")
    elu, delta = keys.loc["elu"], keys.loc["deltanet"]
    assert elu["n50_exponent_low"] <= 1.0 <= elu["n50_exponent_high"] and not elu["exponent_excludes_law"]
    assert delta["n50_exponent"] == pytest.approx(2.0, abs=0.3) and delta["exponent_excludes_law"]
    assert elu["n50_ratio_of"] == "16/8" and elu["n50_ratio_low"] <= 2.0 <= elu["n50_ratio_high"]
    assert delta["n50_ratio"] == pytest.approx(4.0, rel=0.25)
    # the narrow model (d_model = key width = 8) holds half: the confound's size, with its interval
    assert elu["narrow_width"] == 8 and elu["wide_over_narrow_low"] <= 2.0 <= elu["wide_over_narrow_high"]
    assert elu["wide_over_narrow"] == pytest.approx(elu["n50_wide_same_key"] / elu["n50_narrow"])


def test_softmax_is_the_control_at_every_n_of_the_narrow_width(tables):
    control = tables["capacity_control"].set_index("num_pairs")
    assert sorted(control.index) == list(CAPACITY_NARROW_N)
    assert control.loc[24, "below_ceiling"] and not control.loc[16, "below_ceiling"]


def test_the_preregistered_predictions_get_their_verdict_whichever_way_it_falls(tmp_path_factory):
    """law_predictions.csv on runs whose truth is known: elu's law holds its curve (a win past the
    margin); deltanet's law says N at 50% grows as d_key where it grows as its square, and the
    nominal baseline has it right: reported as the law losing. A row where the law is the anchored
    baseline by algebra, or one not yet measured, counts for nothing."""
    from analysis.plots.law import law_figure

    root = make_results.write_results_tree(tmp_path_factory.mktemp("law"), experiments=("capacity_keys",))
    tab = law_figure(load_all(root / "capacity_keys")).tables["law_predictions"]
    summary = tab[tab["row"] == "summary"].set_index("model")
    assert summary.loc["elu", "verdict"] == "law" and summary.loc["elu", "law_beats_baseline"]
    assert summary.loc["deltanet", "verdict"] == "nominal" and not summary.loc["deltanet", "law_beats_baseline"]
    assert summary.loc["deltanet", "err_law_logodds"] > summary.loc["deltanet", "err_nominal_logodds"] + 0.25
    points = tab[tab["row"] == "setting"]
    assert (points.loc[points["part"] == "key_width", "n"] == 5).all()
    length = points[points["part"] == "length"].iloc[0]
    assert length["n"] == 0 and length["verdict"] == "" and "length" not in set(summary["part"])
    assert summary["settings"].eq(2 * (len(CAPACITY_KEY_N) - 1)).all()  # N = 2 is not discriminating


def test_the_length_law_is_judged_on_the_lengths_it_was_written_for(tmp_path_factory):
    from analysis.plots.law import law_figure

    root = make_results.write_results_tree(tmp_path_factory.mktemp("length"), experiments=("capacity_length",))
    tab = law_figure(load_all(root / "capacity_length")).tables["law_predictions"]
    points = tab[tab["row"] == "setting"].set_index("seq_len")
    assert list(points.index) == list(CAPACITY_LENGTHS) and (points["n"] == 5).all()
    summary = tab[tab["row"] == "summary"].iloc[0]
    assert summary["part"] == "length" and summary["verdict"] == "law" and summary["settings"] == 4
