"""The speedup formula for predictions: predict and the pays map (and its figure) use these; the
report takes the map's k grid (MAP_KS).

Pure functions of numbers (elementwise over numpy arrays): chars per pass from the per-position
survival S_i or from an i.i.d. acceptance a (`iid_chars_per_pass`, from src/engine/measuring/formula.py, the
one copy the trial uses too), the speedup of the extended cost model with its loop overheads
(analysis/cost_models.py fits them), and the pays map's best chain speedup over k. With no
overheads and tv = t1 the speedup is the seed's cpp / (1 + k c) (`seed_speedup`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from src.engine.measuring.formula import iid_chars_per_pass, seed_speedup  # noqa: F401  (one copy, used from here too)

MAP_KS = tuple(range(1, 17))    # the pays map's chain picks its best k among these


@dataclass(frozen=True)
class Overheads:
    """The extended cost model's loop overheads; all 0 = no overhead (the formula alone)."""
    o_base: float = 0.0   # us per baseline pass beyond the target pass
    o_pass: float = 0.0   # us per speculative pass beyond the verify pass
    gamma: float = 0.0    # in-loop excess of a drafted char, a fraction of td
    source: str = "none (no --fit-sweep: loop overheads taken as 0)"


def chars_per_pass(survival, k: int) -> float:
    """cpp(k) = 1 + S_1 + ... + S_k: mean chars a chain of k drafts emits per target pass, from
    S_i = P(drafts 1..i all accepted) (the bonus or residual char is the 1)."""
    s = np.asarray(survival, dtype=float)
    if k > len(s):
        raise ValueError(f"k = {k} needs S_1..S_{k}; {len(s)} given")
    return 1.0 + float(s[:k].sum())


def speedup(cpp, t1, tv, td, n, overheads: Overheads = Overheads()):
    """cpp (t1 + o_base) / (tv + o_pass + n td (1 + gamma)): the baseline's time per char over the
    speculative loop's (one verify pass tv, n drafted chars or nodes at td each, per cpp chars).
    Times in any one unit (us, or multiples of t1); elementwise over arrays."""
    o = overheads
    return cpp * (t1 + o.o_base) / (tv + o.o_pass + n * td * (1 + o.gamma))


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
