"""Statistics, checked against published values: Student's t table, Welch's worked example, and the
log-scale interval of a positive, skewed metric (perplexity) that a plain t-interval sends below 0."""

import math
import statistics

import pytest

from posenc.report.setup import describe_varied, fixed_and_varied
from posenc.report.stats import (BETTER, NO_DIFFERENCE, NO_ERROR_BARS, WORSE, Scale, aggregate, compare_to_baseline,
                                 scale_of)

# two-sided 95% critical values t_{0.975, df} from any statistics textbook's t table
T_TABLE = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 10: 2.228, 30: 2.042}


@pytest.mark.parametrize("df,t", T_TABLE.items())
def test_interval_is_mean_plus_minus_the_textbook_t_times_standard_error(df, t):
    values = [1.0 + 0.5 * i + (0.3 if i % 2 else 0.0) for i in range(df + 1)]
    s = aggregate(values)
    half = t * statistics.stdev(values) / math.sqrt(len(values))
    assert s.mean == pytest.approx(statistics.fmean(values))
    assert s.high - s.mean == pytest.approx(half, rel=2e-4) and s.mean - s.low == pytest.approx(half, rel=2e-4)


def test_welch_matches_the_published_worked_example():
    """Welch's t-test, Wikipedia's first example (two samples of 15, unequal variances):
    t = -2.46, ν = 24.99, p = 0.021; the 95% interval is diff ± t_{0.975, 25} · se with t_{0.975, 25} = 2.060."""
    a1 = [27.5, 21.0, 19.0, 23.6, 17.0, 17.9, 16.9, 20.1, 21.9, 22.6, 23.1, 19.6, 19.0, 21.7, 21.4]
    a2 = [27.1, 22.0, 20.8, 23.4, 23.4, 23.5, 25.8, 22.0, 24.8, 20.2, 21.9, 22.1, 22.9, 20.5, 24.4]
    d = compare_to_baseline(a1, a2, higher_is_better=True)
    assert d.df == pytest.approx(24.99, abs=0.01)
    se = abs(d.diff) / 2.46
    assert (d.high - d.low) / 2 == pytest.approx(2.060 * se, rel=3e-3) and d.low < d.diff < d.high
    assert d.verdict == WORSE and d.high < 0  # p = 0.021 < 0.05: the interval excludes 0


def test_perplexity_of_two_skewed_seeds_has_a_positive_interval_the_loss_interval_mapped_back():
    """The issue's base-100 RoPE runs: 9.79 and 12.09. A plain t-interval with n = 2 reaches below
    0 (the issue saw 10.940 [-3.629, 25.509]); perplexity is e^loss, so its interval is the loss's,
    exponentiated."""
    ppl = [9.79, 12.09]
    plain = aggregate(ppl, Scale())
    assert plain.mean == pytest.approx(10.94) and plain.low < 0
    s = aggregate(ppl, scale_of("val/ppl"))
    assert s.low > 0 and s.low < min(ppl) and s.high > max(ppl)
    loss = aggregate([math.log(p) for p in ppl], scale_of("val/loss"))
    assert (s.mean, s.low, s.high) == pytest.approx((math.exp(loss.mean), math.exp(loss.low), math.exp(loss.high)))
    assert s.mean == pytest.approx(math.sqrt(9.79 * 12.09))  # the geometric mean: the perplexity of the mean loss
    for key in ("extrapolation/ppl@1024", "convergence/tokens_to_loss@2.5", "tokens_per_s"):
        assert aggregate(ppl, scale_of(key)).low > 0, key


def test_bounded_metrics_are_clipped_to_what_they_can_take():
    accuracy = aggregate([0.9, 1.0], scale_of("tasks/flip_flop/accuracy@64"))
    assert accuracy.high == 1.0 and accuracy.low < 0.9
    assert aggregate([0.05, 1.0], scale_of("val/loss")).low == 0.0


def test_identical_values_have_zero_width_and_one_seed_none():
    s = aggregate([2.5, 2.5, 2.5])
    assert s.low == s.high == s.mean == 2.5 and s.n == 3
    one = aggregate([3.0])
    assert one.mean == 3.0 and one.low is None and one.high is None and one.errors == (0.0, 0.0)
    d = compare_to_baseline([3.0], [2.0, 2.1, 2.2], higher_is_better=False)
    assert d.verdict == NO_ERROR_BARS and d.low is None and d.diff == pytest.approx(0.9)


def test_a_seed_without_a_value_leaves_the_group_without_a_mean():
    s = aggregate([1.0, None, 2.0])
    assert s.mean is None and s.reached == 2 and s.n == 3 and s.values == (1.0, None, 2.0)


def test_verdict_flips_when_the_difference_crosses_the_interval():
    baseline = [2.0, 2.1, 2.2]
    spread = [-0.1, 0.0, 0.1]
    d = compare_to_baseline(spread, baseline, True)
    half = d.high - d.diff  # the interval's half-width; a shift of the group does not change it
    inside = [2.1 - 0.9 * half + s for s in spread]
    outside = [2.1 - 1.1 * half + s for s in spread]
    assert compare_to_baseline(inside, baseline, higher_is_better=False).verdict == NO_DIFFERENCE
    assert compare_to_baseline(outside, baseline, higher_is_better=False).verdict == BETTER  # lower loss
    assert compare_to_baseline(outside, baseline, higher_is_better=True).verdict == WORSE  # lower accuracy
    above = [2.1 + 1.1 * half + s for s in spread]
    assert compare_to_baseline(above, baseline, higher_is_better=True).verdict == BETTER


def test_on_a_log_scale_the_difference_is_a_ratio():
    d = compare_to_baseline([10.0, 10.5, 11.0], [20.0, 21.0, 22.0], higher_is_better=False, scale=scale_of("val/ppl"))
    assert d.ratio and d.diff == pytest.approx(math.exp(statistics.fmean(map(math.log, [10, 10.5, 11]))
                                                        - statistics.fmean(map(math.log, [20, 21, 22]))))
    assert d.low < d.diff < d.high < 1 and d.verdict == BETTER


def test_exact_equal_groups_are_no_difference_and_exact_unequal_ones_are_not():
    assert compare_to_baseline([1.0, 1.0], [1.0, 1.0], True).verdict == NO_DIFFERENCE
    assert compare_to_baseline([1.0, 1.0], [0.5, 0.5], True).verdict == BETTER


def test_fixed_and_varied():
    runs = [{"encoding.name": "rope", "encoding.base": 10000, "seed": 0, "trainer.lr": 1e-3},
            {"encoding.name": "alibi", "seed": 1, "trainer.lr": 1e-3}]
    fixed, varied = fixed_and_varied(runs)
    assert fixed == {"trainer.lr": 1e-3}
    assert varied == {"encoding.base": ["10000", "<absent>"], "encoding.name": ["alibi", "rope"], "seed": ["0", "1"]}


def test_varied_lists_an_option_only_some_runs_have_only_where_it_takes_several_values():
    runs = [{"encoding.name": "rope", "encoding.base": 10000.0, "encoding.style": "half"},
            {"encoding.name": "rope", "encoding.base": 100.0, "encoding.style": "half"},
            {"encoding.name": "alibi"}]
    text = describe_varied(fixed_and_varied(runs)[1])
    assert text == "encoding.base ∈ {100, 10000} (where set); encoding.name ∈ {alibi, rope}"  # style: rope's only value


def test_varied_values_are_listed_in_numeric_order():
    runs = [{"encoding.base": b} for b in (500000.0, 100.0, 10000.0, 1000.0)]
    assert fixed_and_varied(runs)[1] == {"encoding.base": ["100.0", "1000.0", "10000.0", "500000.0"]}
