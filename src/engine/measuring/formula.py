"""The seed study's two formulas, one copy each: the trial's `predicted_speedup` (src/trial) and
the analysis (analysis/formula.py, cost_models.py, predict.py) call these.

- `seed_speedup(cpp, n, c)`: the seed's speedup = cpp / (1 + n c), cpp the chars per target
  pass, n the chars drafted per pass (k, a policy's mean drafted length, a tree's nodes), c the
  draft's cost per drafted char in one-char target passes.
- `iid_chars_per_pass(a, k)`: chars per pass when every position is accepted with probability a
  independently, 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a); k + 1 at a = 1.

Both are elementwise over numbers and numpy arrays (and pandas Series, whose index they keep).
"""
from __future__ import annotations

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
