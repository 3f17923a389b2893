"""Intervals that hold the seeds' spread: a two-stage bootstrap, seeds then pairs.

An interval for a cell's median read off its pooled pairs (order statistics) treats all pairs of
all its seeds as draws from one distribution. That holds the timing noise of each trial's own text, but not the sampling noise of
the texts: a seed draws its own text, and its chars per pass (so its speedup) moves with it
(docs/results.md gives the seed-to-seed spread of chars per pass in the policies sweep). Two arms
whose pooled intervals do not overlap can still be one arm's lucky seeds;
tests/analysis/test_seed_bootstrap.py measures how often the overlap rule calls equal arms apart.

Here a replicate of a cell's speedup resamples its seeds with replacement, then each drawn seed's
pairs with replacement (as many as that seed had), and takes the median of the pooled resampled
ratios: it varies as the pooled median of a new set of seeds would. Cells are resampled
independently (an adaptive arm and a fixed k at the same seed draw different texts: a pass of
another length uses other uniforms).

`median_interval_seeds` is a cell's interval in every table of the report (analysis/aggregate.py:
the verdicts, the recommendation's "above 1", the regime and batch tables read it) where the cell
has two seeds or more. `best_gain_interval` compares an arm's best cell with another arm's best cell (a policy at its
best cap against the best fixed k) and re-chooses both bests in every replicate, so the interval
holds the luck of picking the largest of several noisy cells.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

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
    return np.nanmedian(values.reshape(reps, -1), axis=1)


def few_seeds_widening(seeds: int, level: float) -> float:
    """sqrt(S / (S - 1)) t_{S-1} / z at the level's upper quantile: how much wider (in log ratio)
    `median_interval_seeds` makes the percentile interval of S >= 2 seeds. The bootstrap spreads
    the seeds by their plug-in variance ((S - 1) / S of the unbiased one) and reads normal-like
    quantiles, where the mean of S seeds follows Student's t with S - 1 degrees of freedom: unwidened,
    a 95% interval calls a planted cell of speedup 1 faster 22% of the time at 2 seeds and 7% at 5
    (nominal 2.5%; tests/analysis/test_seed_bootstrap.py)."""
    from scipy import stats
    q = (1 + level) / 2
    return float(np.sqrt(seeds / (seeds - 1)) * stats.t.ppf(q, seeds - 1) / stats.norm.ppf(q))


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
