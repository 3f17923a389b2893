"""Distribution-free intervals for a median, from order statistics: what the paired timing
(timing.py) reports for a speedup, and the analysis for a cell with one seed.

With n i.i.d. values, [X_(j), X_(n+1-j)] covers their median with probability
1 - 2 * BinomCDF(j - 1; n, 1/2) (`rank_coverage`), e.g. [min, max] at 93.75% for n = 5, 96.9% for
n = 6; `median_interval` takes the narrowest such interval at a level.
"""
from __future__ import annotations

import math
import statistics
from math import comb


def rank_coverage(n: int, j: int) -> float:
    """P(X_(j) <= median <= X_(n+1-j)) for n i.i.d. draws of a continuous distribution:
    1 - 2 * BinomCDF(j - 1; n, 1/2), exact (integer arithmetic until the final division)."""
    if not 1 <= j <= (n + 1) // 2:
        raise ValueError(f"rank j must be in 1..{(n + 1) // 2} for n = {n}, got {j}")
    below = sum(comb(n, i) for i in range(j))  # 2^n * P(Binom(n, 1/2) <= j - 1)
    return 1.0 - 2.0 * below / 2 ** n


def confidence_of_range(n_pairs: int) -> float:
    """Coverage of [min, max] of n i.i.d. ratios as an interval for their median: 1 - 2 / 2^n."""
    return 1.0 - 2.0 * 0.5 ** n_pairs


def median_rank(n: int, level: float) -> tuple[int, float]:
    """(j, coverage): the largest rank j whose interval [X_(j), X_(n+1-j)] covers the median with
    probability >= level. When even [min, max] falls short (n too small), j = 1 and its coverage,
    below `level`, is returned as it is."""
    if n < 1:
        raise ValueError("no ratios")
    j = 1
    while j + 1 <= (n + 1) // 2 and rank_coverage(n, j + 1) >= level:
        j += 1
    return j, rank_coverage(n, j)


def median_interval(xs: list[float], level: float) -> tuple[float, float, float]:
    """(lo, hi, coverage): the distribution-free interval for the median of xs at `level`."""
    s = sorted(xs)
    j, coverage = median_rank(len(s), level)
    return s[j - 1], s[len(s) - j], coverage


def small_sample_widening(parts: list[tuple[float, int]], level: float) -> float:
    """How much wider (in log ratio) a bootstrap's percentile interval must be when it resamples few
    units. parts: per kind of unit resampled (prompts, seeds), (the variance of the log statistic
    over replicates resampling that kind alone, how many units of it there are); kinds of fewer than
    2 units or no variance add nothing. The bootstrap spreads n units by their plug-in variance
    ((n - 1) / n of the unbiased one) and reads normal quantiles, where a mean of n units follows
    Student's t: the factor is sqrt(unbiased / plug-in variance) x t_df / z at the level's upper
    quantile, df from Welch-Satterthwaite over the kinds. One kind of n units: sqrt(n / (n - 1))
    t_{n-1} / z (5 seeds: 1.58; 16 prompts: 1.12); 1 where nothing is resampled."""
    parts = [(v, n) for v, n in parts if n >= 2 and v > 0]
    if not parts:
        return 1.0
    from scipy.special import stdtrit   # t's quantile (scipy.stats costs a trial's process a second to import)
    plug_in = sum(v for v, _ in parts)
    unbiased = [v * n / (n - 1) for v, n in parts]
    df = sum(unbiased) ** 2 / sum(u * u / (n - 1) for u, (_, n) in zip(unbiased, parts))
    q = (1 + level) / 2
    return float(math.sqrt(sum(unbiased) / plug_in) * stdtrit(df, q) / statistics.NormalDist().inv_cdf(q))


def widened(m: float, lo: float, hi: float, w: float) -> tuple[float, float]:
    """[lo, hi] around m widened by w in log ratio: [m (lo / m)^w, m (hi / m)^w]."""
    return m * (lo / m) ** w, m * (hi / m) ** w


def relative_width(xs: list[float], level: float) -> float:
    """Width of the interval for the median of xs at `level`, over the median; inf when even
    [min, max] covers the median below `level` (too few values to say)."""
    lo, hi, coverage = median_interval(xs, level)
    return (hi - lo) / statistics.median(xs) if coverage >= level else math.inf
