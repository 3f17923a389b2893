"""Cells: trials aggregated across seeds.

Counters and component times of a cell are the median over its seeds. Speedup is pooled:
median, min and max over ALL timed pairs of all seeds of the cell (the pair ratios
baseline time / speculative time); the median of the per-seed medians is given beside it.
"""
from __future__ import annotations

import pandas as pd

from .load import CELL, FINISHED, KEY


def confidence_of_range(n: int) -> float:
    """Coverage of [min, max] of n i.i.d. ratios as an interval for their median: 1 - 2 / 2^n."""
    return 1.0 - 2.0 * 0.5 ** n if n > 0 else float("nan")


def cell_medians(finished: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """draft, k, seeds, and the median over seeds of each column present."""
    present = [c for c in columns if c in finished.columns]
    g = finished.groupby(CELL, sort=True)
    out = g[present].median()
    out.insert(0, "seeds", g.size())
    return out.reset_index()


def pooled_speedup(pairs: pd.DataFrame) -> pd.DataFrame:
    """draft, k, pairs, median, min, max (pooled over every pair of every seed), seed_median, confidence."""
    g = pairs.groupby(CELL, sort=True)["ratio"]
    out = pd.DataFrame({"pairs": g.size(), "median": g.median(), "min": g.min(), "max": g.max()})
    per_seed = pairs.groupby(KEY)["ratio"].median().groupby(CELL).median()
    out["seed_median"] = per_seed
    out["confidence"] = out["pairs"].map(confidence_of_range)
    return out.reset_index()


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
