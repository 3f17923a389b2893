"""The pays map: the formula's best chain speedup over per-position acceptance and draft cost
(`pays_grid`; the report takes its k grid, MAP_KS), and what a target's map needs from a sweep:
its verify-cost line, loop overheads and cells.

The map itself (analysis/figures.py: pays_map) is `pays_grid` with every chain cell of the sweep
drawn at its (median acceptance, median c), and for a workload of several categories each
category's point (its own acceptance, the cell's c).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from src.engine.measuring.formula import Overheads, iid_chars_per_pass, speedup

from .aggregate import pooled_speedup
from .cost_models import EXTENDED_INPUTS, fit_extended

MAP_KS = tuple(range(1, 17))    # the pays map's chain picks its best k among these


@dataclass
class PaysInputs:
    """What one target's pays map needs from a sweep (`pays_inputs`)."""
    target_key: str
    b: float                  # tv(k) / t1 = 1 + b k, the extended model's verify-cost line
    t1: float                 # median one-char target pass, us
    overheads: Overheads
    points: pd.DataFrame      # one chain cell per row: draft, k, a (median per-position acceptance),
                              # c (median), measured (pooled median speedup; NaN without pairs)
    categories: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["draft", "k", "category", "a", "c"]))
                              # a workload's categories of the chain cells: draft, k, category, a (its
                              # median per-position acceptance), c (the cell's median)

    def verify_ratio(self, k):
        return 1.0 + self.b * k


def category_points(chain: pd.DataFrame) -> pd.DataFrame:
    """Per chain cell of a workload of several categories and per category: (median
    position_acceptance.<category>, median c)."""
    names = [c.removeprefix("position_acceptance.") for c in chain.columns if c.startswith("position_acceptance.")]
    rows = []
    for (draft, k), g in chain.groupby(["draft", "k"], sort=True):
        present = [n for n in names if g[f"position_acceptance.{n}"].notna().any()]
        if len(present) < 2:   # one category: the cell's own point
            continue
        rows += [{"draft": draft, "k": k, "category": n, "a": g[f"position_acceptance.{n}"].median(),
                  "c": g["c"].median()} for n in present]
    return pd.DataFrame(rows, columns=["draft", "k", "category", "a", "c"])


def pays_inputs(finished: pd.DataFrame, pairs: pd.DataFrame, level: float) -> list[PaysInputs]:
    """Per target (`target_key`) of a sweep's finished trials: the extended model fitted on that
    target's trials (all drafts, trees included: b prices a verify pass by its node count) and
    its chain cells (drafts without `+tree`) as points at (median position_acceptance, median c)."""
    out = []
    if any(c not in finished.columns for c in EXTENDED_INPUTS + ["position_acceptance", "c", "target_key"]):
        return out
    for key, t in finished.groupby("target_key", sort=True):
        fit = fit_extended(t, free_loop=False)  # the (o_pass, gamma) form: no free loop runs here
        chain = t[t["tree"] == ""] if "tree" in t else t
        pts = chain.groupby(["draft", "k"], sort=True)[["position_acceptance", "c"]].median()
        pts = pts.rename(columns={"position_acceptance": "a"}).reset_index()
        own = pairs[pairs["run_id"].isin(chain["run_id"])] if "run_id" in chain else pairs.iloc[0:0]
        meas = pooled_speedup(own, level)[["draft", "k", "median"]] if len(own) else pd.DataFrame(
            columns=["draft", "k", "median"])
        pts = pts.merge(meas.rename(columns={"median": "measured"}), on=["draft", "k"], how="left")
        out.append(PaysInputs(str(key), fit.b, float(t["target_pass_us"].median()),
                              Overheads(fit.o_base, fit.o_pass, fit.gamma,
                                        f"extended model fitted on the {fit.trials} trials of target {key}"), pts,
                              category_points(chain)))
    return out


def pays_grid(a, c, ks, verify_ratio, overheads: Overheads = Overheads(), t1: float = 1.0):
    """Best predicted chain speedup over ks at each (a, c), and the k that gives it.

    a, c: broadcastable arrays (per-position acceptance, draft cost td / t1); verify_ratio(k) =
    tv(k) / t1; overheads in us with t1 in us (t1 = 1: overheads in units of t1). Per k the
    speedup is iid_chars_per_pass(a, k) (1 + o_base/t1) / (v(k) + o_pass/t1 + k c (1 + gamma)).
    Returns (speedup, k) arrays of the broadcast shape; ties go to the smaller k."""
    a, c = np.broadcast_arrays(np.asarray(a, float), np.asarray(c, float))
    rel = Overheads(overheads.o_base / t1, overheads.o_pass / t1, overheads.gamma)
    per_k = np.stack([speedup(iid_chars_per_pass(a, k), 1.0, verify_ratio(k), c, k, rel) for k in ks])
    best = per_k.argmax(0)
    return np.take_along_axis(per_k, best[None], 0)[0], np.asarray(ks)[best]
