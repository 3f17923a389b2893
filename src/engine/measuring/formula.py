"""The speedup formulas, one copy each: the trial's `predicted_speedup` (src/trial) and the analysis
(analysis/cost_models.py, pays.py, predict.py) call these.

- `seed_speedup(cpp, n, c)`: the seed's speedup = cpp / (1 + n c), cpp the chars per target
  pass, n the chars drafted per pass (k, a policy's mean drafted length, a tree's nodes), c the
  draft's cost per drafted char in one-char target passes.
- `iid_chars_per_pass(a, k)`: chars per pass when every position is accepted with probability a
  independently, 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a); k + 1 at a = 1.
- `chars_per_pass(survival, k)`: chars per pass from the per-position survival S_i.
- `speedup(cpp, t1, tv, td, n, overheads)`: the extended cost model's speedup with its loop
  overheads (`Overheads`; analysis/cost_models.py fits them). With no overheads and tv = t1 it is
  the seed's cpp / (1 + k c).

All are elementwise over numbers and numpy arrays (and pandas Series, whose index the first two keep).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def seed_speedup(cpp, n, c):
    """cpp / (1 + n c)."""
    return cpp / (1 + n * c)


def iid_chars_per_pass(a, k):
    """(1 - a^(k+1)) / (1 - a) = 1 + a + ... + a^k; k + 1 at a = 1 (k may be a real mean length)."""
    aa, kk = np.asarray(a, dtype=float), np.asarray(k, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(aa < 1, (1 - aa ** (kk + 1)) / (1 - aa), kk + 1.0)
    if hasattr(a, "index") and hasattr(a, "where"):   # a pandas Series: keep its index
        return type(a)(out, index=a.index)
    return float(out) if out.ndim == 0 else out


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
