"""Cells: trials aggregated across seeds.

Counters and component times of a cell are the median over its seeds. Speedup is pooled over
ALL timed pairs of all seeds of the cell (the pair ratios baseline time / speculative time):
their median, the distribution-free interval for that median at the trials' configured
confidence (`timing.confidence`, order statistics as src/engine/timing.py computes per trial:
[X_(j), X_(n+1-j)] of the n pooled ratios with the largest j whose coverage
1 - 2 BinomCDF(j - 1; n, 1/2) is at least the level), its exact coverage for those n pairs,
and their [min, max] (the range, kept for the figures' reading of the scatter). The median of
the per-seed medians is given beside them.

With adaptive pairs the seeds of a cell contribute different numbers of pairs (a noisy trial
adds more), so the pooled median weighs each seed by its pairs; the interval treats the pooled
ratios as draws from one distribution, which the seeds (same cell, different sampled text)
approximate.
"""
from __future__ import annotations

import pandas as pd

from src.engine.timing import median_interval

from .load import CELL, FINISHED, KEY

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
    """draft, k, pairs, median, lo, hi, confidence (the interval for the median at `level` and its
    coverage), min, max (pooled over every pair of every seed), seed_median."""
    rows = []
    for cell, ratios in pairs.groupby(CELL, sort=True)["ratio"]:
        xs = ratios.tolist()
        lo, hi, coverage = median_interval(xs, level)
        rows.append((*cell, len(xs), ratios.median(), lo, hi, coverage, min(xs), max(xs)))
    out = pd.DataFrame(rows, columns=CELL + ["pairs", "median", "lo", "hi", "confidence", "min", "max"])
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
