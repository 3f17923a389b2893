"""A chi-square test of categorical draws whose exact distribution differs from draw to draw.

Draw b is a char x_b with exact distribution p_b (V,) under the null hypothesis. Observed
counts O = sum_b onehot(x_b), expected E = sum_b p_b, covariance S = sum_b (diag(p_b) - p_b p_b^T).
The Wald statistic (O - E)^T S^-1 (O - E), with one cell dropped (S is singular: counts sum to
N), is asymptotically chi-square with (cells - 1) degrees of freedom. Cells with expected count
below `min_expected` are pooled into one cell first (and that cell too, if still below, is
merged into the smallest regular cell), so the asymptotics hold.
"""
from __future__ import annotations

import torch


def chi2_sf(x: float, df: int) -> float:
    """Survival function of the chi-square distribution: P(X >= x)."""
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(x / 2, dtype=torch.float64)))


def varying_multinomial_test(chars: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0):
    """chars: (N,) long, probs: (N, V) exact distributions. Returns (statistic, df, p_value)."""
    probs = probs.double()
    N, V = probs.shape
    E = probs.sum(0)
    rare = E < min_expected
    # cell index per char: regular cells keep their own id, rare ones share cell `pool`
    keep = (~rare).nonzero().flatten()
    cell_of = torch.full((V,), len(keep), dtype=torch.long)
    cell_of[keep] = torch.arange(len(keep))
    n_cells = len(keep) + int(rare.any())
    if rare.any() and E[rare].sum() < min_expected and len(keep) > 1:
        smallest = keep[E[keep].argmin()]
        cell_of[rare] = cell_of[smallest]
        n_cells -= 1
    if n_cells < 2:
        return 0.0, 0, 1.0
    agg = torch.zeros(V, n_cells, dtype=torch.float64)
    agg[torch.arange(V), cell_of] = 1.0
    P = probs @ agg                                                       # (N, cells)
    O = torch.bincount(cell_of[chars], minlength=n_cells).double()
    Ec = P.sum(0)
    S = torch.diag(Ec) - P.T @ P
    d = (O - Ec)[:-1]
    stat = float(d @ torch.linalg.solve(S[:-1, :-1], d))
    df = n_cells - 1
    return stat, df, chi2_sf(stat, df)
