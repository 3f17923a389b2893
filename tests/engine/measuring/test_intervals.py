"""The order-statistic interval for a median (src/engine/measuring/intervals.py): its coverage by
the binomial formula against exact values and enumeration, and by Monte-Carlo on a skewed law."""
from __future__ import annotations

import math
import random
from fractions import Fraction
from itertools import product

import pytest

from src.engine.measuring.intervals import median_interval, median_rank, rank_coverage, relative_width
from tests.engine.measuring.test_timing import RATIO, TRIALS


# the order-statistic interval's coverage: the binomial formula against exact values ------

def test_rank_coverage_exact_small_n():
    assert rank_coverage(5, 1) == 0.9375           # [min, max] of 5
    assert rank_coverage(6, 1) == 1 - 2 / 64       # 96.875%
    assert rank_coverage(7, 1) == 1 - 2 / 128      # 98.4375%
    assert rank_coverage(9, 2) == 1 - 2 * 10 / 512  # [X_(2), X_(8)]: 96.09375%
    assert rank_coverage(1, 1) == 0.0 and rank_coverage(2, 1) == 0.5


@pytest.mark.parametrize("n", range(1, 13))
def test_rank_coverage_by_enumeration(n):
    """Each of n draws of a continuous distribution lies below its median with probability 1/2,
    independently: enumerate the 2^n below/above patterns. [X_(j), X_(n+1-j)] contains the
    median iff at least j draws lie below it and at least j above."""
    for j in range(1, (n + 1) // 2 + 1):
        covered = sum(1 for signs in product((0, 1), repeat=n) if j <= sum(signs) <= n - j)
        assert Fraction(rank_coverage(n, j)).limit_denominator(2 ** n) == Fraction(covered, 2 ** n)


def test_median_rank_takes_the_narrowest_interval_at_the_level():
    assert median_rank(5, 0.90) == (1, 0.9375)
    assert median_rank(5, 0.95) == (1, 0.9375)      # even [min, max] falls short: said as it is
    assert median_rank(9, 0.95) == (2, 1 - 2 * 10 / 512)
    for n in range(1, 40):
        j, coverage = median_rank(n, 0.95)
        assert coverage == rank_coverage(n, j)
        if j > 1:
            assert coverage >= 0.95
        if j < (n + 1) // 2:
            assert rank_coverage(n, j + 1) < 0.95  # the largest such j
    assert median_interval([3.0, 1.0, 2.0, 5.0, 4.0], 0.90) == (1.0, 5.0, 0.9375)


# Monte-Carlo: the interval covers the true median as often as stated ---------------------

@pytest.mark.parametrize("n", [5, 6, 11, 24])
def test_interval_coverage_monte_carlo(n):
    """2000 samples of n ratios from a skewed distribution with a known median (lognormal x
    RATIO: median RATIO). The hit count is Binomial(2000, c), c the stated coverage; we require
    it within 3 standard errors of c (hence >= c - 3 se >= the level - 3 se). A correct
    implementation fails this with probability about 0.27% (two-sided normal tail at 3 se) for
    an arbitrary seed; the seed is fixed, so the test is deterministic."""
    rng = random.Random(1000 + n)
    level = 0.95
    _, c = median_rank(n, level)
    hits = 0
    for _ in range(TRIALS):
        xs = [RATIO * rng.lognormvariate(0.0, 0.5) for _ in range(n)]
        lo, hi, coverage = median_interval(xs, level)
        assert coverage == c
        hits += lo <= RATIO <= hi
    se = math.sqrt(c * (1 - c) / TRIALS)
    assert abs(hits / TRIALS - c) <= 3 * se, (hits / TRIALS, c, se)


def test_relative_width_is_inf_with_too_few_values():
    assert relative_width([1.0, 1.1, 0.9], 0.95) == math.inf   # [min, max] of 3 covers at 75%
    assert relative_width([1.0] * 6 + [2.0], 0.95) == 1.0     # [min, max] of 7 at 98.4%: (2 - 1) / 1
