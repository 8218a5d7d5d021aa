"""analysis.scaling: the ratio and the exponent of break points, with intervals over seeds, on
draws whose answer is known."""
import math

import numpy as np
import pytest

from analysis import scaling


def _seeds(rng, mean, n=5, cv=0.2):
    """n positive values around ``mean`` (lognormal, coefficient of variation about cv)."""
    sigma = math.sqrt(math.log(1 + cv ** 2))
    return mean * rng.lognormal(-sigma ** 2 / 2, sigma, n)


def test_the_ratio_covers_its_true_value_at_five_seeds():
    rng = np.random.default_rng(1)
    hits, widths = 0, []
    for rep in range(300):
        r = scaling.ratio(_seeds(rng, 24.0), _seeds(rng, 12.0), seed=rep)
        hits += r.low <= 2.0 <= r.high
        widths.append(r.high / r.low)
        assert r.low < r.value < r.high and r.seeds == 10
    # a 95% interval: 0.95 +- 3 binomial SE at 300 draws is 0.91-0.99
    assert 0.90 <= hits / 300 <= 0.995, hits
    assert np.median(widths) < 2.2  # and informative: at a 20% spread, t(8) x SE of the log ratio gives about 1.8


@pytest.mark.parametrize("truth", [1.0, 2.0])
def test_the_exponent_covers_its_true_value_and_tells_one_from_two(truth):
    rng = np.random.default_rng(2)
    keys = [4, 8, 16]
    hits, excludes_one = 0, 0
    for rep in range(300):
        values = [_seeds(rng, 1.5 * d ** truth) for d in keys]
        e = scaling.exponent(keys, values, seed=rep)
        hits += e.low <= truth <= e.high
        excludes_one += not (e.low <= 1.0 <= e.high)
        assert e.seeds == 15
    assert 0.90 <= hits / 300 <= 0.995, hits
    if truth == 2.0:
        assert excludes_one == 300  # an exponent of 2 is never read as the law's 1


def test_a_break_that_holds_past_the_grid_gives_no_number():
    held = scaling.ratio([20.0, math.inf, 22.0], [10.0, 11.0, 9.0])
    assert math.isnan(held.value) and "holds past the tested N" in held.method
    assert "fewer than two settings" in scaling.exponent([8, 8], [[1.0, 2.0], [1.5, 2.5]]).method
    assert "fewer than 2 seeds" in scaling.ratio([3.0], [1.0, 2.0]).method
    row = scaling.ratio([2.0, 2.2, 1.8], [1.0, 1.1, 0.9]).as_row("n50_16_over_8")
    assert set(row) == {"n50_16_over_8", "n50_16_over_8_low", "n50_16_over_8_high", "n50_16_over_8_method",
                        "n50_16_over_8_seeds"}
    assert row["n50_16_over_8"] == pytest.approx(2.0)
