"""Rank statistics as a script calls them: rank intervals by resampling seeds, the leader only where
detectable, Kendall's τ between rankings (scipy's) with a bootstrap interval, and the flips."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from posenc.report.ranking import leader, rank_agreement, rank_groups

FAR = {"a": [1.0, 1.01, 1.02], "b": [2.0, 2.01, 2.02], "c": [3.0, 3.01, 3.02]}
NOISY = {"a": [1.0, 1.5, 2.0], "b": [1.1, 1.6, 2.1], "c": [3.0, 3.01, 3.02]}


def intervals(ranking) -> dict[str, tuple[float, float, float]]:
    return {r.label: (r.rank, r.low, r.high) for r in ranking.ranks}


def test_groups_far_apart_have_point_rank_intervals_and_overlapping_ones_share_ranks():
    assert intervals(rank_groups(FAR, higher_is_better=False)) == {"a": (1, 1, 1), "b": (2, 2, 2), "c": (3, 3, 3)}
    noisy = intervals(rank_groups(NOISY, higher_is_better=False))
    assert noisy["a"][1:] == (1, 2) and noisy["b"][1:] == (1, 2)  # a and b trade places across resamples
    assert noisy["c"] == (3, 3, 3)
    reversed_ = intervals(rank_groups(FAR, higher_is_better=True))  # accuracy: the larger value ranks first
    assert reversed_["c"][0] == 1 and reversed_["a"][0] == 3


def test_two_seeds_that_tie_never_get_a_single_rank_and_the_ranks_agree_with_the_verdict():
    """Issue 36: 2 seeds each, 'alibi, rope tied' beside a rank table of alibi [1, 1], rope [2, 2]."""
    two = {"alibi": [2.30, 2.31], "rope": [2.33, 2.35]}  # alibi always lower, but n = 2: Welch cannot tell
    ranking = rank_groups(two, higher_is_better=False)
    assert ranking.leader.best is None and ranking.leader.tied == ("alibi", "rope")
    assert intervals(ranking) == {"alibi": (1, 1, 2), "rope": (2, 1, 2)}
    rng = np.random.default_rng(1)
    for _ in range(30):  # whatever the data: tied for best <=> the interval starts at 1; best <=> [1, 1]
        values = {k: list(rng.normal(rng.uniform(0, 1), rng.uniform(0.01, 0.3), size=rng.integers(2, 5)))
                  for k in "abcd"}
        r = rank_groups(values, higher_is_better=False)
        assert {x.label for x in r.ranks if x.low == 1} == set(r.leader.tied)
        assert (r.leader.best is not None) == (r.ranks[0].high == 1)
        assert all(x.low <= x.rank <= x.high for x in r.ranks)


def test_a_group_with_one_seed_can_take_any_rank():
    ranking = rank_groups({"a": [1.0, 1.01, 1.02], "b": [3.0, 3.01, 3.02], "c": [2.0]}, higher_is_better=False)
    assert intervals(ranking)["c"] == (2, 1, 3) and intervals(ranking)["b"] == (3, 2, 3)


def test_a_perplexity_ranks_by_its_geometric_mean():
    """a: seeds at 1 and 100 (arithmetic mean 50.5, geometric 10), b: 20 and 20."""
    values = {"a": [1.0, 100.0], "b": [20.0, 20.0]}
    assert rank_groups(values, False, log=True).ranks[0].label == "a"
    assert rank_groups(values, False, log=True).ranks[0].mean == pytest.approx(10.0)
    assert rank_groups(values, False, log=False).ranks[0].label == "b"


def test_the_leader_is_named_only_when_detectably_ahead_of_every_group():
    assert leader(FAR, higher_is_better=False).best == "a"
    noisy = leader(NOISY, higher_is_better=False)
    assert noisy.best is None and noisy.tied == ("a", "b")  # c is detectably behind: not tied
    single = leader({"a": [1.0], "b": [2.0]}, higher_is_better=False)
    assert single.best is None and "1 seed" in single.reason


def test_groups_missing_a_value_in_some_seed_are_not_ranked():
    ranking = rank_groups({"a": [1.0, 1.1], "b": [2.0, None], "c": [None, None]}, False)
    assert [r.label for r in ranking.ranks] == ["a"] and ranking.unranked == ["b", "c"]


def test_kendall_tau_is_scipys_on_the_group_means_with_a_bootstrap_interval():
    rng = np.random.default_rng(0)
    by_value = {size: {enc: list(rng.normal(loc, 0.3, size=3)) for enc, loc in zip("abcd", locs)}
                for size, locs in (("small", (1, 2, 3, 4)), ("large", (2, 1, 3.2, 3.8)))}
    [a] = rank_agreement(by_value, higher_is_better=False)
    means = {v: [np.mean(by_value[v][enc]) for enc in "abcd"] for v in by_value}
    assert a.tau == pytest.approx(stats.kendalltau(means["small"], means["large"]).statistic)
    assert (a.u, a.v, a.groups) == ("small", "large", ("a", "b", "c", "d"))
    assert a.low <= a.tau <= a.high


def test_the_same_order_everywhere_gives_tau_one_and_no_flips():
    shifted = {k: [v + 0.5 for v in vs] for k, vs in FAR.items()}
    [a] = rank_agreement({"x": FAR, "y": shifted}, higher_is_better=False)
    assert (a.tau, a.low, a.high, a.flips) == (pytest.approx(1.0), pytest.approx(1.0), pytest.approx(1.0), ())


def test_a_flip_is_confident_only_when_both_orders_are_detectable():
    swapped = {"a": FAR["b"], "b": FAR["a"], "c": FAR["c"]}
    [clear] = rank_agreement({"u": FAR, "v": swapped}, higher_is_better=False)
    assert [(f.first, f.second, f.confident) for f in clear.flips] == [("a", "b", True)]
    noise = {"a": [1.0, 1.6, 2.2], "b": [1.2, 1.5, 1.9], "c": FAR["c"]}  # b ahead of a by less than the noise
    [blurred] = rank_agreement({"u": FAR, "v": noise}, higher_is_better=False)
    assert [(f.first, f.second, f.confident) for f in blurred.flips] == [("a", "b", False)]
    assert blurred.low < blurred.high == 1.0  # the bootstrap sees the order of a and b both ways
