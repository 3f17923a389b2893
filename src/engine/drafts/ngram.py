"""Character n-gram draft: interpolated modified Kneser-Ney over the training split.

`order` is the number of context chars (order 4: 5-grams). Chen & Goodman's interpolated modified
Kneser-Ney: for a context h of length j with suffix h' (h without its oldest char),

    P(w | h) = max(c(h w) - D_j(c(h w)), 0) / c(h .) + gamma(h) P(w | h'),
    gamma(h) = (D_j1 N1(h .) + D_j2 N2(h .) + D_j3 N3+(h .)) / c(h .)

where c is the raw count at the longest level (j = order) and the continuation count
N1+(. h w) (distinct chars seen before h w) below it; Nr(h .) counts the entries of h whose count
is r; each level has its own discounts D_j1, D_j2, D_j3+ from its counts of counts (n1..n4):
Y = n1 / (n1 + 2 n2), D1 = 1 - 2Y n2/n1, D2 = 2 - 3Y n3/n2, D3+ = 3 - 4Y n4/n3. The empty
context (unigram continuation counts) interpolates with the uniform distribution, so q > 0 for
every char. A context never seen backs off to its suffix with weight 1. This is exactly the
table recurrence of table.py: lam = gamma(h), vals = the discounted counts / c(h .).
"""
from __future__ import annotations

import torch

from .table import TableDraft, assemble


def gram_codes(x: torch.Tensor, m: int, base: int) -> torch.Tensor:
    """x (N,) digits 1..V -> (N - m + 1,) int64 codes of every m-gram, oldest char most significant."""
    n = len(x) - m + 1
    code = torch.zeros(max(n, 0), dtype=torch.int64)
    for i in range(m):
        code = code * base + x[i:i + n]
    return code


def discounts(counts: torch.Tensor) -> tuple[float, float, float]:
    """Modified Kneser-Ney discounts (D1, D2, D3+) from a level's counts. Where a count of counts
    is zero (tiny corpora) the estimate is undefined: each D_r is kept within [0.05, r]."""
    n1, n2, n3, n4 = (float((counts == r).sum()) for r in (1, 2, 3, 4))
    y = n1 / (n1 + 2 * n2) if n1 + n2 > 0 else 0.5
    raw = (1 - 2 * y * n2 / n1 if n1 else 0.5,
           2 - 3 * y * n3 / n2 if n2 else 1.0,
           3 - 4 * y * n4 / n3 if n3 else 1.5)
    return tuple(min(max(d, 0.05), r) for r, d in zip((1, 2, 3), raw))


def kn_level(grams: torch.Tensor, counts: torch.Tensor, base: int) -> tuple:
    """One level of the table from its unique (context, char) codes (ascending) and their counts."""
    ctx, w = grams // base, grams % base - 1
    ctx_codes, n_entries = torch.unique_consecutive(ctx, return_counts=True)
    seg = torch.arange(len(ctx_codes)).repeat_interleave(n_entries)        # (E,) context of each entry
    c = counts.double()
    d1, d2, d3 = discounts(counts)
    d = torch.where(counts == 1, d1, torch.where(counts == 2, d2, d3)).double()
    total = torch.zeros(len(ctx_codes), dtype=torch.float64).index_add_(0, seg, c)
    gamma = torch.zeros_like(total).index_add_(0, seg, d)                  # sum of the discounts = D1 N1 + D2 N2 + D3 N3+
    vals = (c - d).clamp(min=0) / total[seg]
    return ctx_codes, gamma / total, n_entries, w, vals


class NgramDraft(TableDraft):
    name = "ngram"

    def __init__(self, target, train_ids: torch.Tensor, name: str | None = None, *, order: int,
                 cache_dir=None, target_key: str | None = None):
        super().__init__(target, train_ids, name, order, cache_dir, target_key)

    def settings(self) -> dict:
        return {"order": self.order, "smoothing": "interpolated modified Kneser-Ney"}

    def _build(self, target, train_ids):
        B, n = self.base, self.order
        x = train_ids.cpu().long() + 1
        levels = []
        # unique m-grams (ascending) and their counts, m = 2..order+1
        unique = {m: torch.unique(gram_codes(x, m, B), return_counts=True) for m in range(2, n + 2)}
        for j in range(n + 1):                       # context length j: (j+1)-grams
            if j == n:
                grams, counts = unique[n + 1]        # raw counts
            else:
                # continuation count of (h w): distinct chars seen before it = unique (j+2)-grams ending in it
                grams, counts = torch.unique(unique[j + 2][0] % B ** (j + 1), return_counts=True)
            levels.append(kn_level(grams, counts, B))
        return assemble(levels, self.vocab_size)

    def describe(self):
        return {"smoothing": "modified Kneser-Ney", **super().describe()}
