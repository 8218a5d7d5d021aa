"""What the capacity and SNR figures may claim: lower bounds where a run ended at max_steps,
Schlag's criterion beside N at 50%, the share of runs stopped on their plateau, and the
out-of-sample law against its naive baselines (softmax apart), on synthetic results."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from conftest import draw_figure, make_results
from analysis.synthetic.capacity import CAPACITY_LOWER_BOUND, CAPACITY_TRAIN_N, LAW_TOLERANCE

from analysis.plots.capacity import (law_baseline_table, law_errors, log_odds, recalled_n, rests_on_lower_bounds,
                                     stop_table)


@pytest.fixture(scope="module")
def capacity(tree):
    return draw_figure(tree, "capacity")


@pytest.fixture(scope="module")
def snr(tree):
    return draw_figure(tree, "snr")


def test_points_from_runs_that_ended_at_max_steps_are_lower_bounds(capacity):
    proto = capacity.tables["capacity_protocol"].set_index(["label", "num_pairs"])
    label, n = CAPACITY_LOWER_BOUND
    assert proto.loc[(label, n), "lower_bound"] and proto.loc[(label, n), "runs_at_max_steps"] == 5
    assert proto["lower_bound"].sum() == 1                     # every other point stopped on its plateau
    ranking = capacity.tables["capacity_ranking"]
    at = ranking[ranking["value"] == n]
    assert label not in set(at["a"]) | set(at["b"])             # no ranking read from a lower bound
    assert len(at)                                              # the others at that N are still ranked


def test_a_break_point_resting_on_a_lower_bound_says_so(capacity):
    half = capacity.tables["capacity_n50"].set_index("label")
    label, _ = CAPACITY_LOWER_BOUND
    # favor m=16 breaks near N = 10, between the training N 8 and 16: its 32 is past the first N below 50%
    assert not half.loc[label, "n50_lower_bound"] and not half.loc["elu", "n50_lower_bound"]
    assert rests_on_lower_bounds([8, 16, 32], [False, False, True], 20.0)
    assert not rests_on_lower_bounds([8, 16, 32], [False, False, True], 12.0)
    assert rests_on_lower_bounds([8, 16], [False, True], math.inf)  # holds past every N: rests on all


def test_schlags_criterion_beside_n_at_half(capacity):
    half = capacity.tables["capacity_n50"].set_index("label")
    assert (half["recall_threshold"] == 0.9).all()
    assert half.loc["softmax", "n_recalled"] == max(CAPACITY_TRAIN_N)  # 0.99 at every N
    assert (half["n_recalled"].dropna() <= half["n50_per_n"].dropna().reindex(half["n_recalled"].dropna().index)).all()
    assert recalled_n([2, 4, 8, 16], [1.0, 0.95, 0.8, 0.92]) == 4       # the first failure ends it
    assert math.isnan(recalled_n([2, 4], [0.5, 0.4]))


def test_the_share_of_runs_stopped_on_the_plateau(capacity):
    stops = capacity.tables["capacity_stops"].set_index("label")
    runs = stops.loc["all", "runs"]
    assert stops.loc["all", "at_max_steps"] == 5 and stops.loc["all", "plateau_share"] == pytest.approx(1 - 5 / runs)
    assert "stopped on their validation plateau" in capacity.caption
    frame = pd.DataFrame({"run_dir": ["a", "b", "c"], "label": ["x", "x", "y"],
                          "summary.stop_reason": ["plateau", "max_steps", None]})
    got = stop_table(frame).set_index("label")
    assert got.loc["x", "plateau_share"] == 0.5 and math.isnan(got.loc["y", "plateau_share"])


def test_log_odds_errors_are_clipped_half_a_query_from_the_floor():
    assert log_odds([0.5])[0] == 0.0
    assert log_odds([0.0], [100])[0] == pytest.approx(math.log(0.005 / 0.995))
    rows = pd.DataFrame({"accuracy": [0.1], "count": [100], "acc_predicted_from_train": [0.5],
                         "acc_baseline_nominal": [0.1], "acc_baseline_anchored": [np.nan]})
    got = law_errors(rows).iloc[0]
    assert got["err_law_acc"] == pytest.approx(0.4) and got["err_law_logodds"] == pytest.approx(math.log(9))
    assert got["err_nominal_logodds"] == 0.0 and math.isnan(got["err_anchored_logodds"])


def test_the_law_against_its_baselines_with_softmax_apart(capacity, snr):
    half = capacity.tables["capacity_n50"].set_index("label")
    # the fixture's law predicts half the N the runs hold, its baselines a quarter: the law wins
    for label in ("elu", "favor m=16", "dpfp ν=1", "deltanet additive"):
        assert half.loc[label, "law_beats_baseline"] is True or half.loc[label, "law_beats_baseline"] == 1.0, label
        assert half.loc[label, "err_law_logodds"] < half.loc[label, "err_nominal_logodds"]
    assert not half.loc["softmax", "counted_in_mean"] and half.loc["elu", "counted_in_mean"]
    versus = capacity.tables["capacity_law_baseline"].set_index("label")
    mean = versus.loc["mean (softmax apart)"]
    counted = versus[versus["counted_in_mean"] & (versus.index != "mean (softmax apart)")]
    assert mean["err_law_logodds"] == pytest.approx(counted["err_law_logodds"].mean())
    assert (versus["tolerance_logodds"] == LAW_TOLERANCE).all()   # from the runs' config
    table = snr.tables["snr_out_of_sample"]
    assert {"nominal_mean", "anchored_mean", "err_law_logodds", "err_anchored_acc"} <= set(table.columns)
    assert "snr_law_baseline" in snr.tables


def test_law_baseline_table_without_a_tolerance_leaves_the_verdict_open():
    rows = pd.DataFrame({"label": ["a", "s"], "config.model.d_model": [8, 8], "summary.family": ["linear", "softmax"],
                         "model": ["a", "s"], "accuracy": [0.5, 0.9], "acc_predicted_from_train": [0.5, 1.0],
                         "acc_baseline_nominal": [0.2, 0.5], "acc_baseline_anchored": [0.6, 0.5]})
    got = law_baseline_table(rows).set_index("label")
    assert got.loc["a", "law_beats_baseline"] == 1.0 and got.loc["a", "counted_in_mean"]
    assert not got.loc["s", "counted_in_mean"]
    assert got.loc["mean (softmax apart)", "err_law_logodds"] == 0.0
    assert got["law_within_tolerance"].isna().all()


def test_a_law_that_loses_is_reported_as_losing_and_a_tie_is_no_win():
    from analysis.plots.capacity import LAW_MARGIN_LOGODDS, verdict

    m = LAW_MARGIN_LOGODDS
    assert verdict(0.5, 1.5, 1.2, m) == "law"
    assert verdict(1.5, 0.8, 1.5, m) == "nominal"                         # elu's quick numbers: the law loses
    assert verdict(1.0, 1.3, 1.0 + m / 2, m) == "tie"                      # within the margin: no win either way
    assert verdict(0.54, 1.30, 0.54 + 1e-16, m) == "tie"                   # favor_m16's 1e-16 "win"
    assert verdict(0.54, 1.30, 0.54, m, identity=True) == "identity"       # the law is the anchored baseline
    assert verdict(float("nan"), 1.0, 1.0, m) == ""


def test_the_table_counts_no_win_where_the_law_is_the_anchored_baseline_by_algebra():
    rows = pd.DataFrame({"label": ["elu", "retnet"], "config.model.d_model": [8, 8], "summary.family": ["linear", "decay"],
                         "model": ["elu", "retnet"], "accuracy": [0.5, 0.5], "acc_predicted_from_train": [0.5, 0.5],
                         "acc_baseline_nominal": [0.2, 0.2], "acc_baseline_anchored": [0.5, 0.3],
                         "config.analysis.law_margin_logodds": [0.25, 0.25],
                         "train_stats.law": ["additive", "additive"], "train_stats.kernel_target": [(2.0,), (1.0, 1.0)],
                         "train_stats.log_decay": [((0.0,),), ((-0.03,), (-0.01,))],
                         "train_stats.target_write_gain": [(1.0,), (1.0, 1.0)]})
    got = law_baseline_table(rows).set_index("label")
    assert got.loc["elu", "law_anchored_by_algebra"] and got.loc["elu", "verdict"] == "identity"
    assert not got.loc["elu", "law_beats_baseline"]
    assert not got.loc["retnet", "law_anchored_by_algebra"] and got.loc["retnet", "verdict"] == "law"
    assert got.loc["retnet", "law_beats_baseline"] and got["margin_logodds"].eq(0.25).all()
