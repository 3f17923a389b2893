"""Cells: trials aggregated across seeds.

Counters and component times of a cell are the median over its seeds. Speedup is pooled over
ALL timed pairs of all seeds of the cell (the pair ratios baseline time / speculative time):
their median, an interval for it at the trials' configured confidence (`timing.confidence`),
and their [min, max] (the range, kept for the figures' reading of the scatter). The median of
the per-seed medians is given beside them.

The interval holds the seeds' spread as well as the timing noise. A seed draws its own text, and
its chars per pass (so its speedup) moves with it: pooled pairs are not draws from one
distribution, and an interval that treats them so calls equal cells apart far too often
(tests/analysis/test_seed_bootstrap.py). So with two seeds or more the interval is the seed
bootstrap's (analysis/seed_bootstrap.median_interval_seeds: seeds resampled, then each drawn
seed's pairs; its percentile interval at the level, widened for few seeds as Student's t is
wider than the normal), `interval` = "seed bootstrap" and `confidence` the level. A cell of one seed says nothing of the seeds' spread; its interval is the
distribution-free one for the median of its pairs (order statistics, src/engine/measuring/intervals.py, as the timing
computes per trial: [X_(j), X_(n+1-j)] with the largest j whose coverage
1 - 2 BinomCDF(j - 1; n, 1/2) is at least the level), `interval` = "pairs (1 seed)" and
`confidence` its exact coverage for those n pairs: the timing noise of one text only.

With adaptive pairs the seeds of a cell contribute different numbers of pairs (a noisy trial
adds more), so the pooled median weighs each seed by its pairs; the bootstrap gives each drawn
seed its own number of pairs, as the pooled median does.
"""
from __future__ import annotations

import pandas as pd

from src.engine.measuring.intervals import median_interval

from .sweep_data import CELL, FINISHED, KEY
from .seed_bootstrap import median_interval_seeds, seed_groups

DEFAULT_LEVEL = 0.95  # timing.confidence of runs that did not log one


def cell_medians(finished: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """draft, k, seeds, and the median over seeds of each column present."""
    present = [c for c in columns if c in finished.columns]
    g = finished.groupby(CELL, sort=True)
    out = g[present].median()
    out.insert(0, "seeds", g.size())
    return out.reset_index()


def configured_level(finished: pd.DataFrame) -> float:
    """The trials' timing.confidence (the highest, should they differ); DEFAULT_LEVEL if none logged one."""
    if "confidence" not in finished.columns or finished["confidence"].isna().all():
        return DEFAULT_LEVEL
    return float(finished["confidence"].max())


def pooled_speedup(pairs: pd.DataFrame, level: float = DEFAULT_LEVEL) -> pd.DataFrame:
    """draft, k, pairs, seeds, median, lo, hi, confidence, interval (the interval for the median at
    `level`, its confidence and its kind: module docstring), min, max (pooled over every pair of
    every seed), seed_median."""
    rows, seeds = [], seed_groups(pairs)
    for cell, g in pairs.groupby(CELL, sort=True):
        xs = g["ratio"].tolist()
        per_seed = seeds[(cell[0], int(cell[1]))]
        if len(per_seed) >= 2:
            (lo, hi), coverage, kind = median_interval_seeds(per_seed, level), level, "seed bootstrap"
        else:
            (lo, hi, coverage), kind = median_interval(xs, level), "pairs (1 seed)"
        rows.append((*cell, len(xs), len(per_seed), g["ratio"].median(), lo, hi, coverage, kind, min(xs), max(xs)))
    out = pd.DataFrame(rows, columns=CELL + ["pairs", "seeds", "median", "lo", "hi", "confidence", "interval", "min",
                                             "max"])
    per_seed = pairs.groupby(KEY)["ratio"].median().groupby(CELL).median().rename("seed_median")
    return out.merge(per_seed.reset_index(), on=CELL, how="left") if len(out) else out.assign(seed_median=[])


def trial_status(trials: pd.DataFrame) -> pd.DataFrame:
    """Per cell: seeds in the sweep's grid, finished, failed and missing trials.

    The grid is every draft x k x seed the sweep's runs name. A grid point is finished if it
    has a FINISHED run, failed if it only has runs that ended otherwise (FAILED, KILLED, or
    RUNNING: a killed worker), and missing if it has no FINISHED run (failed ones included).
    """
    grid = pd.MultiIndex.from_product([sorted(trials["draft"].unique()), sorted(trials["k"].unique()),
                                       sorted(trials["seed"].unique())], names=KEY)
    done = trials.groupby(KEY)["status"].agg(lambda s: (s == FINISHED).any()).reindex(grid)
    finished = done.fillna(False).astype(bool)
    failed = done.notna() & ~finished  # has runs, none finished
    out = pd.DataFrame({"seeds": 1, "finished": finished.astype(int), "failed": failed.astype(int),
                        "missing": (~finished).astype(int)}, index=grid)
    return out.groupby(CELL).sum().reset_index()
