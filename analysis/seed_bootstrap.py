"""Intervals that hold the seeds' spread: a two-stage bootstrap, seeds then pairs.

An interval for a cell's median read off its pooled pairs (order statistics) treats all pairs of
all its seeds as draws from one distribution. That holds the timing noise of each trial's own text, but not the sampling noise of
the texts: a seed draws its own text, and its chars per pass (so its speedup) moves with it
(docs/results-history.md, "The whole grid" of the policies, gives the seed-to-seed spread of chars
per pass in the policies sweep). Two arms whose pooled intervals do not overlap can still be one
arm's lucky seeds;
tests/analysis/test_seed_bootstrap.py measures how often the overlap rule calls equal arms apart.

Here a replicate of a cell's speedup resamples its seeds with replacement, then each drawn seed's
pairs with replacement (as many as that seed had), and takes the median of the pooled resampled
ratios: it varies as the pooled median of a new set of seeds would. Cells are resampled
independently (an adaptive arm and a fixed k at the same seed draw different texts: a pass of
another length uses other uniforms).

`median_interval_seeds` is a cell's interval in every table of the report (analysis/aggregate.py:
the verdicts, the recommendation's "above 1", the regime and batch tables read it) where the cell
has two seeds or more. `best_cell_interval_seeds` is the interval of a draft's best cell among its k
(the regime and batch tables): the largest of bounds that hold for all its k at once
(`simultaneous_bounds`), which the recommendation reads too. `best_gain_interval` compares an arm's best cell with another arm's best cell (a policy at its
best cap against the best fixed k) and re-chooses both bests in every replicate, so the interval
holds the luck of picking the largest of several noisy cells.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from src.engine.measuring.intervals import small_sample_widening

REPS = 2000   # replicates: the 2.5% / 97.5% percentiles rest on about 50 replicates each
SEED = 0      # the bootstrap's own generator: the report is the same on every run


def seed_groups(pairs: pd.DataFrame) -> dict[tuple[str, int], list[np.ndarray]]:
    """(draft label, k) -> one array of pair ratios per seed (seeds in order)."""
    out: dict[tuple[str, int], list[np.ndarray]] = {}
    for (draft, k, _), ratios in pairs.groupby(["draft", "k", "seed"], sort=True)["ratio"]:
        out.setdefault((draft, int(k)), []).append(ratios.to_numpy(dtype=float))
    return out


def replicate_medians(groups: list[np.ndarray], reps: int, rng: np.random.Generator) -> np.ndarray:
    """(reps,) bootstrap replicates of the pooled median of `groups` (one array of ratios per seed):
    seeds drawn with replacement, then each drawn seed's own number of pairs drawn from its pairs."""
    groups = [g for g in groups if len(g)]
    if not groups:
        raise ValueError("no pairs to resample")
    n_seeds, width = len(groups), max(len(g) for g in groups)
    padded = np.full((n_seeds, width), np.nan)                     # (S, W): a seed's ratios, NaN after them
    lengths = np.array([len(g) for g in groups])                   # (S,)
    for i, g in enumerate(groups):
        padded[i, :len(g)] = g
    seeds = rng.integers(0, n_seeds, size=(reps, n_seeds))         # (R, S): the seeds drawn
    drawn_len = lengths[seeds]                                     # (R, S): their pair counts
    picks = (rng.random((reps, n_seeds, width)) * drawn_len[..., None]).astype(int)   # (R, S, W) < its count
    values = padded[seeds[..., None], picks]                       # (R, S, W)
    values[np.arange(width)[None, None, :] >= drawn_len[..., None]] = np.nan   # a seed gives its own count
    return row_medians(values.reshape(reps, -1))


def row_medians(values: np.ndarray) -> np.ndarray:
    """np.nanmedian(values, axis=1), the same numbers, for rows that each hold a value: each row
    sorted (NaN last), the mean of its middle two of n values (one when n is odd). A tenth of
    nanmedian's time on the bootstrap's small rows, which it sorts as masked arrays."""
    ordered = np.sort(values, axis=1)
    n = np.count_nonzero(~np.isnan(values), axis=1)[:, None]
    return ((np.take_along_axis(ordered, (n - 1) // 2, 1) + np.take_along_axis(ordered, n // 2, 1)) / 2)[:, 0]


def few_seeds_widening(seeds: int, level: float) -> float:
    """sqrt(S / (S - 1)) t_{S-1} / z at the level's upper quantile: how much wider (in log ratio)
    `median_interval_seeds` makes the percentile interval of S >= 2 seeds. The bootstrap spreads
    the seeds by their plug-in variance ((S - 1) / S of the unbiased one) and reads normal-like
    quantiles, where the mean of S seeds follows Student's t with S - 1 degrees of freedom: unwidened,
    a 95% interval calls a planted cell of speedup 1 faster 22% of the time at 2 seeds and 7% at 5
    (nominal 2.5%; tests/analysis/test_seed_bootstrap.py). src/engine/measuring/intervals.py's
    small_sample_widening for one kind of unit."""
    return small_sample_widening([(1.0, seeds)], level)


def median_interval_seeds(groups: list[np.ndarray], level: float, reps: int = REPS,
                          seed: int = SEED) -> tuple[float, float]:
    """The interval at `level` for a cell's pooled median m (one array of ratios per seed, at least
    two seeds): the percentile interval [q_lo, q_hi] of the replicates (`replicate_medians`: seeds,
    then pairs, resampled), its ends' distances from m in log ratio widened by
    `few_seeds_widening`: [m (q_lo / m)^w, m (q_hi / m)^w]. The same generator seed for every cell,
    so a report prints the same interval on every run."""
    groups = [g for g in groups if len(g)]
    if len(groups) < 2:
        raise ValueError("the seed bootstrap needs two seeds or more")
    meds = replicate_medians(groups, reps, np.random.default_rng(seed))
    q_lo, q_hi = np.quantile(meds, [(1 - level) / 2, (1 + level) / 2])
    m, w = float(np.median(np.concatenate(groups))), few_seeds_widening(len(groups), level)
    return float(m * (q_lo / m) ** w), float(m * (q_hi / m) ** w)


def t_tail(c: float, seeds: int | None) -> float:
    """A bootstrap's standardized critical value c carried to few seeds: the Student-t quantile with
    seeds - 1 degrees of freedom of c's normal tail probability, times sqrt(S / (S - 1)) (the
    plug-in variance), as `few_seeds_widening` does at the level's own quantile; c itself for None.
    Far in the tail (the best of several cells needs it) t is much wider than the normal: at 5 seeds
    the factor is 1.42 at the 97.5% quantile and 2.0 at 99.7%."""
    if seeds is None or c == 0:
        return c
    from scipy import stats
    return float(np.sign(c) * np.sqrt(seeds / (seeds - 1)) * stats.t.ppf(stats.norm.cdf(abs(c)), seeds - 1))


def joint_tail(dev: np.ndarray, share: float, side: int) -> tuple[np.ndarray, float]:
    """Per-cell deviations beyond which the cells go, jointly, in a `share` of the replicates: dev
    (K, R) the cells' log deviations per replicate, side +1 (upper) or -1 (lower). The cells share
    one tail count j: each cell's threshold is its own (j+1)-th most extreme replicate, and j is the
    largest count whose thresholds some cell passes in at most `share` of the replicates. Returns
    (the K thresholds, j / R: the tail probability of each cell's own quantile there)."""
    d = side * dev                                   # the tail to look at, made the upper one
    K, R = d.shape
    top = -np.sort(-d, axis=1)                       # (K, R): each cell's replicates, largest first
    lo, hi = 0, R - 1                                # bisection on j: the joint share grows with j

    def share_at(j):
        return float(np.mean((d > top[:, j:j + 1]).any(axis=0)))
    if share_at(0) > share:                          # ties at the top: no threshold is passed less often
        return side * top[:, 0], 0.0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if share_at(mid) <= share:
            lo = mid
        else:
            hi = mid - 1
    return side * top[:, lo], lo / R


def simultaneous_bounds(points, replicates, level: float, seeds: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Bounds that hold for several cells at once, so that the cell that looks best is not read as
    better than it is: points (K,) the cells' estimates, replicates (K, R) their bootstrap
    replicates (drawn independently per cell). Each cell's deviations d_k = log(replicate_k /
    point_k); the upper thresholds are each cell's own quantile at one shared tail probability a,
    the largest a at which some cell passes its threshold in at most (1 - level) / 2 of the
    replicates (`joint_tail`), and the lower ones the same way. Each threshold is then carried to
    few seeds as `median_interval_seeds` carries one cell's (its log distance from the point times
    t_tail(z_a, seeds) / z_a, z_a the normal quantile at a: Student's t at the same tail
    probability; seeds: the fewest of a cell), and cell k's bounds are [point_k e^(lower_k), point_k
    e^(upper_k)]. With one cell, a = (1 - level) / 2 and the bounds are its widened percentile
    interval (`median_interval_seeds`, to the order statistic: no interpolation); with several, each cell's bounds are wider than its own
    interval, as much as the luck of picking among K noisy cells needs. Each cell keeps its own
    quantiles, so one cell's skewed or lumpy replicates (a few seeds make them so) widen only that
    cell's bounds: the tail probability, not a deviation in units of a spread, is what is shared
    (scaled by each cell's standard deviation, a cell whose rare replicates lie 4 sds out set a
    4-sd tail for every cell, which t at 2 degrees of freedom carries to 200 sds). Then the
    contenders are narrowed: a cell whose upper bound lies below another contender's lower bound
    cannot be the best, and the bounds are taken again over the cells that can, until none drops
    out (a dropped cell keeps its last bounds). Only cells that could be the best widen the others;
    when all are equal none drops out. A cell without spread keeps its point."""
    from scipy import stats
    points = np.asarray(points, dtype=float)
    d = np.log(np.asarray(replicates, dtype=float) / points[:, None])     # (K, R)
    lo, hi = points.copy(), points.copy()
    contenders = np.ones(len(points), dtype=bool)
    R = d.shape[1]

    def carried(threshold, a):   # a threshold's log distance carried to few seeds at its tail probability
        z = float(stats.norm.isf(max(a, 0.5 / R)))
        return threshold * (t_tail(z, seeds) / z if z > 0 else 1.0)
    while True:
        up, a_up = joint_tail(d[contenders], (1 - level) / 2, +1)
        down, a_down = joint_tail(d[contenders], (1 - level) / 2, -1)
        with np.errstate(over="ignore"):   # t's tail at 2 seeds can be unbounded: an upper bound of inf
            lo[contenders] = points[contenders] * np.exp(carried(down, a_down))
            hi[contenders] = points[contenders] * np.exp(carried(up, a_up))
        still = contenders & (hi >= lo[contenders].max())
        if still.sum() == contenders.sum():
            return lo, hi
        contenders = still


def best_of_interval(points, replicates, level: float, seeds: int | None = None) -> tuple[float, float]:
    """An interval for the best of several cells' true values: [max_k lower_k, max_k upper_k] of
    their `simultaneous_bounds`. The chosen cell's own interval instead calls a draft whose k are all
    equal "faster" about as often as the best of K independent tries
    (tests/analysis/test_seed_bootstrap.py plants it)."""
    lo, hi = simultaneous_bounds(points, replicates, level, seeds)
    return float(lo.max()), float(hi.max())


def cell_bounds_seeds(cells: list[list[np.ndarray]], level: float, reps: int = REPS,
                      seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """`simultaneous_bounds` of cells of two seeds or more each (a cell: one array of ratios per
    seed): each cell's pooled median and its `replicate_medians`, carried to the fewest seeds of a
    cell."""
    counts = [len([g for g in c if len(g)]) for c in cells]
    if not cells or min(counts) < 2:
        raise ValueError("the seed bootstrap needs two seeds or more in every cell")
    rng = np.random.default_rng(seed)
    points = [float(np.median(np.concatenate(c))) for c in cells]
    reps_ = np.stack([replicate_medians(c, reps, rng) for c in cells])
    return simultaneous_bounds(points, reps_, level, min(counts))


def best_cell_interval_seeds(cells: list[list[np.ndarray]], level: float, reps: int = REPS,
                             seed: int = SEED) -> tuple[float, float]:
    """The interval for the best of cells (each of two seeds or more): the largest of their
    `cell_bounds_seeds`, lower and upper."""
    lo, hi = cell_bounds_seeds(cells, level, reps, seed)
    return float(lo.max()), float(hi.max())


def best_gain_interval(arm_cells: list[list[np.ndarray]], against_cells: list[list[np.ndarray]], level: float,
                       reps: int = REPS, seed: int = SEED) -> tuple[float, float]:
    """The percentile interval at `level` of max(arm) / max(against) - 1, each max over its cells'
    replicate medians (a cell: one array of ratios per seed)."""
    if not arm_cells or not against_cells:
        raise ValueError("each arm needs a cell")
    rng = np.random.default_rng(seed)
    best_arm = np.max([replicate_medians(c, reps, rng) for c in arm_cells], axis=0)          # (R,)
    best_against = np.max([replicate_medians(c, reps, rng) for c in against_cells], axis=0)  # (R,)
    gain = best_arm / best_against - 1
    lo, hi = np.quantile(gain, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)
