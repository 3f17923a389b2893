"""Draft-length policies against the best fixed k (src/engine/decoding/policy.py; cells "<draft>~<policy>",
k their cap).

- `policies_table`: per draft, its best fixed k and each adaptive policy at its best cap, with
  their intervals (aggregate.py: the seed bootstrap's), the gain (policy median / fixed median - 1) and its interval from a
  bootstrap over seeds (seed_bootstrap.py), which tells them apart or not.
- `drafted_table`: how long an adaptive policy's passes were (the mean and the share of passes
  drafting j chars) and the acceptance of char i among the passes that drafted it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .sweep_data import cell_labels
from .seed_bootstrap import best_gain_interval, seed_groups
from .tables import Table


def _parts(cells: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """(each cell's label less its policy, its policy): from the cells' columns (sweep_data.CELL_PARTS)."""
    return cell_labels(cells, leave_out=("policy",)), cells["policy"]


def best_cell(g: pd.DataFrame) -> pd.Series | None:
    g = g.dropna(subset=["measured"])
    return None if g.empty else g.loc[g["measured"].idxmax()]


def _cell_groups(groups: dict, labels: pd.Series, ks: pd.Series) -> list[list[np.ndarray]]:
    """The per-seed ratio arrays of the cells (label, k), those with pairs."""
    return [groups[key] for key in zip(labels, ks.astype(int)) if key in groups]


def told_apart(lo: float, hi: float) -> str:
    if np.isnan(lo):
        return "no pairs to tell"
    return "better" if lo > 0 else "worse" if hi < 0 else "no (the gain's interval spans 0)"


def policies_table(cells: pd.DataFrame, pairs: pd.DataFrame, level: float) -> Table | None:
    """None when the cells hold no adaptive policy. `cells`: with their columns (sweep_data.with_cell_parts);
    `pairs`: the sweep's timed pairs (draft, k, seed, ratio) for the gain's seed-bootstrap interval at `level`."""
    base, policy = _parts(cells)
    if (policy == "fixed").all():
        return None
    groups = seed_groups(pairs)
    rows = []
    for draft in sorted(base.unique()):
        fixed_cells = cells[(base == draft) & (policy == "fixed")]
        fixed = best_cell(fixed_cells)
        for name in sorted(set(policy[base == draft]) - {"fixed"}):
            arm_cells = cells[(base == draft) & (policy == name)]
            best = best_cell(arm_cells)
            if best is None:
                continue
            row = {"draft": draft, "policy": name, "best cap": int(best["k"]), "speedup": best["measured"],
                   "lo": best["lo"], "hi": best["hi"]}
            if fixed is not None:
                arm = _cell_groups(groups, arm_cells["draft"], arm_cells["k"])
                against = _cell_groups(groups, fixed_cells["draft"], fixed_cells["k"])
                lo, hi = best_gain_interval(arm, against, level) if arm and against else (np.nan, np.nan)
                row |= {"best fixed k": int(fixed["k"]), "fixed speedup": fixed["measured"], "fixed lo": fixed["lo"],
                        "fixed hi": fixed["hi"], "gain": best["measured"] / fixed["measured"] - 1,
                        "gain lo": lo, "gain hi": hi, "told apart": told_apart(lo, hi)}
            rows.append(row)
    df = pd.DataFrame(rows)
    fmt = ({c: ".2f" for c in ("speedup", "lo", "hi", "fixed speedup", "fixed lo", "fixed hi")}
           | {c: "+.1%" for c in ("gain", "gain lo", "gain hi")})
    return Table("policies", "Draft-length policies against the best fixed k", df, fmt,
                 "Each adaptive policy at its best measured cap and the draft's best measured fixed k (pooled medians "
                 "over all pairs of the cells' seeds, lo-hi their intervals); gain: the policy's median over the "
                 f"fixed median, minus 1; gain lo-hi: its {level:.0%} interval from a bootstrap over seeds, then "
                 "pairs, with both bests re-chosen in each replicate (analysis/seed_bootstrap.py); told apart: "
                 "better or worse where that interval excludes 0.")


def drafted_table(finished: pd.DataFrame) -> Table | None:
    """Per adaptive-policy cell, the medians over its trials of the drafted length's mean and
    distribution, and of the acceptance among the passes that drafted char i."""
    if "drafted_mean" not in finished or finished["drafted_mean"].isna().all():
        return None
    t = finished.dropna(subset=["drafted_mean"])
    lens = sorted((c for c in t.columns if c.startswith("drafted_len_")), key=lambda c: int(c.rsplit("_", 1)[1]))
    acc = sorted((c for c in t.columns if c.startswith("acceptance_given_drafted_")),
                 key=lambda c: int(c.rsplit("_", 1)[1]))
    df = t.groupby(["draft", "k"], sort=True)[["drafted_mean", "chars_per_pass", *lens, *acc]].median().reset_index()
    df = df.rename(columns={"k": "cap", "drafted_mean": "drafted mean", "chars_per_pass": "chars per pass"}
                   | {c: f"P(len {c.rsplit('_', 1)[1]})" for c in lens}
                   | {c: f"a{c.rsplit('_', 1)[1]}" for c in acc})
    df = df.dropna(axis=1, how="all")
    return Table("drafted", "Drafted length and acceptance per position under each policy", df,
                 {c: ".2f" for c in df.columns if c not in ("draft", "cap")},
                 "Medians over each cell's trials: the mean drafted length, the share of passes drafting j chars "
                 "(P(len j)), and a_i: among the passes that drafted char i, the share that kept it.")
