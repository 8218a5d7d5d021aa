"""analysis.stats: no interval below five seeds, a covering one from five, the paired test and
the ranking that follow from them."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from analysis import stats


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_no_interval_below_five_seeds(n):
    values = [0.5, 0.9, 0.7, 0.6][:n]
    est = stats.estimate(values, [256] * n)
    assert est.n == n and est.mean == pytest.approx(np.mean(values)) and est.values == tuple(values)
    assert math.isnan(est.low) and math.isnan(est.high) and not est.has_interval
    assert est.method == stats.NO_INTERVAL
    rows = pd.DataFrame({"label": "m", stats.SEED: range(n), "accuracy": values, "count": 256})
    summary = stats.summarize(rows, ["label"], "accuracy", count="count").iloc[0]
    assert summary["n"] == n and np.isnan(summary["low"]) and summary["interval_method"] == stats.NO_INTERVAL
    assert list(stats.seed_values(summary)) == pytest.approx(values)


def test_missing_seeds_do_not_count():
    assert stats.estimate([0.5, np.nan, 0.7, 0.6, 0.8, 0.9]).n == 5
    assert stats.estimate([0.5, np.nan, 0.7, 0.6, 0.8]).method == stats.NO_INTERVAL


def test_the_interval_covers_a_known_mean_at_five_seeds():
    """Each seed's accuracy p ~ Beta(mean 0.8, SD 0.11), its test accuracy Binomial(256, p)/256:
    the figures' 95% interval covers 0.8 in 90-99% of 200 repetitions at n = 5 (fixed seeds)."""
    values, counts, truth = stats.hierarchical_draws(np.random.default_rng(1), 200, 5)
    covered = stats.coverage("figures", values, counts, truth)
    assert 0.90 <= covered <= 0.99, covered
    # why not scipy's percentile or BCa bootstrap: at five seeds they undercover the same draws
    assert stats.coverage("percentile", values, counts, truth, n_resamples=999) < 0.90
    assert stats.coverage("BCa", values, counts, truth, n_resamples=999) < 0.90


def test_the_interval_stays_near_its_seeds_where_the_studentized_one_ran_away():
    """Five seeds all at least 0.45 (deltanet at N = 4 in the quick capacity sweep): the
    studentized bootstrap gave [0.00, 0.95]; the t interval stays within a few SDs of the mean
    and above 0.4, and an N at 50% stays near its seeds, not [-45.7, 11.8]."""
    seeds = np.array([0.45, 0.52, 0.61, 0.66, 0.93])
    est = stats.estimate(seeds, [768] * 5)
    assert est.method == stats.METHOD and 0.4 < est.low < est.mean < est.high < 1.0
    half = scipy_stats.t.ppf(0.975, 4) * seeds.std(ddof=1) / np.sqrt(5)
    assert est.low == pytest.approx(seeds.mean() - half) and est.high == pytest.approx(seeds.mean() + half)
    n50 = stats.estimate([6.2, 7.9, 8.4, 9.1, 10.3])
    assert n50.method == stats.METHOD_SEEDS and 5.0 < n50.low < n50.high < 12.0
    values, counts, _ = stats.one_seed_fails(np.random.default_rng(1), 200, 5)
    assert stats.overreach("figures", values, counts) < stats.overreach("studentized", values, counts, n_resamples=999)


def test_tied_seeds_take_the_named_fallback():
    same = [0.5] * 5
    low, high, method = stats.interval(np.array(same), np.full(5, 100.0))
    assert low < 0.5 < high and method == stats.FALLBACK  # 500 queries pooled: Wilson's interval
    seeds_only = stats.estimate(same)
    assert seeds_only.low == seeds_only.high == 0.5 and seeds_only.method == stats.FALLBACK_SEEDS
    ceiling = stats.estimate([1.0] * 5, [256] * 5)
    assert ceiling.method == stats.FALLBACK and 0.99 < ceiling.low < 1.0 and ceiling.high == pytest.approx(1.0)
    # five seeds that all recall everything: the interval holds its mean exactly (its upper end
    # had landed a rounding step below 1.0, and an error bar below zero broke the figure)
    for value in (1.0, 0.0):
        for count in (2, 5, 16, 128):
            low, high, _ = stats.interval(np.full(5, value), np.full(5, count))
            assert low <= value <= high
    assert stats.interval(np.ones(5), np.full(5, 2))[1] >= 1.0
    plain = stats.estimate([0.9, 0.92, 0.95, 0.91, 0.88], [256] * 5)
    assert plain.method == stats.METHOD and plain.low < plain.mean < plain.high


def test_an_accuracy_interval_stays_within_what_a_fraction_can_be():
    """Three seeds that did not learn and two that did (gated_deltanet at N = 24 in the quick
    capacity sweep): the interval is cut to [0, 1] and spans the seeds' mean."""
    est = stats.estimate([0.004, 0.004, 0.456, 0.433, 0.004], [768] * 5)
    assert est.low == 0.0 and 0.4 < est.high <= 1.0 and est.method == stats.METHOD
    assert "within [0, 1]" in est.method
    entropy = stats.estimate([0.1, 0.1, 3.0, 2.9, 0.1])  # no query count: not a fraction, not cut
    assert entropy.high > 1.0 and entropy.low < 0.0
    rows = pd.DataFrame({"label": "m", stats.SEED: range(5), "w": [0.05, 0.05, 0.9, 0.85, 0.05]})
    cut = stats.summarize(rows, ["label"], "w", bounds=(0.0, 1.0)).iloc[0]
    assert 0.0 <= cut["low"] and cut["high"] <= 1.0 and cut["interval_method"].endswith("within [0, 1]")


def test_summarize_batches_points_as_estimate_does_one():
    """The same interval up to resampling noise (a batch draws its resamples in another order)."""
    rng = np.random.default_rng(0)
    rows = pd.DataFrame({"label": np.repeat(["a", "b", "c"], 5), stats.SEED: np.tile(range(5), 3),
                         "accuracy": rng.uniform(0.3, 0.9, 15), "count": 128})
    summary = stats.summarize(rows, ["label"], "accuracy", count="count").set_index("label")
    for label, grp in rows.groupby("label"):
        one = stats.estimate(grp["accuracy"], grp["count"])
        width = one.high - one.low
        assert abs(summary.loc[label, "low"] - one.low) < 0.1 * width
        assert abs(summary.loc[label, "high"] - one.high) < 0.1 * width
        assert summary.loc[label, "n"] == 5 and summary.loc[label, "interval_method"] == stats.METHOD
    assert [c for c in summary.columns if c.startswith("seed_")] == [f"seed_{s}" for s in range(5)]


def test_rows_of_one_seed_are_pooled_by_their_counts():
    rows = pd.DataFrame({"label": "m", stats.SEED: [0, 0, 1], "accuracy": [1.0, 0.0, 0.5], "count": [30, 10, 8]})
    pooled = stats.per_seed(rows, ["label"], "accuracy", count="count").set_index(stats.SEED)
    assert pooled.loc[0, "accuracy"] == pytest.approx(0.75) and pooled.loc[0, "count"] == 40


def test_paired_test_across_seeds():
    seeds = pd.Index(range(5))
    a = pd.Series([0.50, 0.60, 0.55, 0.70, 0.65], index=seeds)
    shifted = stats.paired_test(a, a - 0.05 + pd.Series([0.001, -0.001, 0.0, 0.002, -0.002], index=seeds))
    assert shifted["diff"] == pytest.approx(-0.05) and shifted["p_value"] < 1e-4 and shifted["n_paired"] == 5
    noisy = stats.paired_test(a, a + pd.Series([0.1, -0.1, 0.05, -0.08, 0.02], index=seeds))
    assert noisy["p_value"] > 0.5
    assert stats.paired_test(a, a - 0.1)["p_value"] == 0.0              # the same difference in every seed
    assert math.isnan(stats.paired_test(a.iloc[:1], a.iloc[:1])["p_value"])  # one pair: no test


def test_ranking_is_called_only_where_intervals_separate():
    summary = pd.DataFrame({"label": ["a", "b", "c", "d"], "n": [5, 5, 5, 2], "mean": [0.9, 0.8, 0.78, 0.5],
                            "low": [0.88, 0.75, 0.74, np.nan], "high": [0.92, 0.82, 0.81, np.nan]})
    verdicts = {(r.a, r.b): r.verdict for r in stats.ranking(summary).itertuples()}
    assert verdicts[("a", "b")] == "a above b"
    assert verdicts[("b", "c")] == "not separated (intervals overlap)"
    assert verdicts[("a", "d")] == "no interval (n < 5)"


def test_caption_names_n_and_the_method():
    few = pd.DataFrame({"n": [2, 2], "interval_method": [stats.NO_INTERVAL] * 2})
    assert stats.caption(few) == "n = 2 seeds per point: each seed drawn, mean line; no interval (n < 5)"
    five = pd.DataFrame({"n": [5, 3], "interval_method": [stats.METHOD, stats.NO_INTERVAL]})
    line = stats.caption(five)
    assert line.startswith("n = 3-5 seeds per point") and stats.METHOD in line and "n < 5: seeds only" in line
