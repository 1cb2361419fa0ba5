"""Statistics: t-intervals over seeds, Welch differences and verdicts, the n=1 flag."""

import math
import statistics

import pytest

from posenc.report.stats import (BETTER, NO_DIFFERENCE, NO_ERROR_BARS, WORSE, compare_to_baseline, fixed_and_varied,
                                 format_summary, mean_interval, t_cdf, t_quantile, welch_interval)

# two-sided 95% critical values from any statistics textbook's t table
T_TABLE = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 10: 2.228, 30: 2.042, 120: 1.980}


@pytest.mark.parametrize("df,t", T_TABLE.items())
def test_t_quantile_matches_the_textbook_table(df, t):
    assert t_quantile(0.975, df) == pytest.approx(t, abs=1e-3)


def test_t_tends_to_the_normal_and_is_symmetric():
    assert t_quantile(0.975, 1e6) == pytest.approx(1.95996, abs=1e-4)
    assert t_cdf(-1.3, 4.5) == pytest.approx(1 - t_cdf(1.3, 4.5)) and t_cdf(0.0, 3) == pytest.approx(0.5)


def test_interval_of_identical_values_has_zero_width():
    s = mean_interval([2.5, 2.5, 2.5])
    assert s.low == s.high == s.mean == 2.5 and s.n == 3


def test_interval_is_mean_plus_minus_t_times_standard_error():
    values = [1.0, 2.0, 4.0]
    s = mean_interval(values)
    half = 4.303 * statistics.stdev(values) / math.sqrt(3)
    assert s.low == pytest.approx(s.mean - half, rel=1e-3) and s.high == pytest.approx(s.mean + half, rel=1e-3)


def test_one_seed_gives_no_interval_and_says_so():
    s = mean_interval([3.0])
    assert s.low is None and s.high is None and s.note == NO_ERROR_BARS
    assert format_summary(s) == "3 (n=1)"
    d = compare_to_baseline([3.0], [2.0, 2.1, 2.2], higher_is_better=False)
    assert d.verdict == NO_ERROR_BARS and d.low is None and d.diff == pytest.approx(0.9)


def test_verdict_flips_when_the_difference_crosses_the_interval():
    baseline = [2.0, 2.1, 2.2]
    spread = [-0.1, 0.0, 0.1]
    diff, _, high, _ = welch_interval(spread, baseline)
    half = high - diff  # the interval's half-width; a shift of the group does not change it
    inside = [2.1 - 0.9 * half + s for s in spread]
    outside = [2.1 - 1.1 * half + s for s in spread]
    assert compare_to_baseline(inside, baseline, higher_is_better=False).verdict == NO_DIFFERENCE
    assert compare_to_baseline(outside, baseline, higher_is_better=False).verdict == BETTER  # lower loss
    assert compare_to_baseline(outside, baseline, higher_is_better=True).verdict == WORSE  # lower accuracy
    above = [2.1 + 1.1 * half + s for s in spread]
    assert compare_to_baseline(above, baseline, higher_is_better=True).verdict == BETTER


def test_exact_equal_groups_are_no_difference_and_exact_unequal_ones_are_not():
    assert compare_to_baseline([1.0, 1.0], [1.0, 1.0], True).verdict == NO_DIFFERENCE
    assert compare_to_baseline([1.0, 1.0], [0.5, 0.5], True).verdict == BETTER


def test_fixed_and_varied():
    runs = [{"encoding": {"name": "rope", "base": 10000}, "seed": 0, "trainer": {"lr": 1e-3}},
            {"encoding": {"name": "alibi"}, "seed": 1, "trainer": {"lr": 1e-3}}]
    fixed, varied = fixed_and_varied(runs)
    assert fixed == {"trainer.lr": 1e-3}
    assert varied == {"encoding.base": ["10000", "<absent>"], "encoding.name": ["alibi", "rope"], "seed": ["0", "1"]}


def test_varied_values_are_listed_in_numeric_order():
    runs = [{"encoding": {"base": b}} for b in (500000.0, 100.0, 10000.0, 1000.0)]
    assert fixed_and_varied(runs)[1] == {"encoding.base": ["100.0", "1000.0", "10000.0", "500000.0"]}
