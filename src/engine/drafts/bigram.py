"""Bigram draft: the next char depends on the previous one only (the seed's part-1 baseline).

q(b | a) = (count(a b) + alpha) / (count(a) + alpha * V) over the training split. With
alpha > 0 every q is positive, so q > 0 wherever the target can put mass. At temperature T
the table becomes q^(1/T) renormalized (the same temperature rule as the target's logits,
applied to log q).

The hot loop avoids per-char tensor work: k uniforms are drawn in one call, each char is an
inverse-CDF lookup (bisect on a precomputed float64 row), and q is one gather at the end.

A vocabulary above DENSE_MAX tokens (a model from a folder with a subword tokenizer: GPT-2's
50,257 would make a V x V table of 10 GB) keeps the counts sparse (the pairs that occur, per
previous token) and builds a row the first time its previous token is met, by the same
arithmetic, memoizing the last ROW_MEMO rows.
"""
from __future__ import annotations

import bisect
from collections import OrderedDict

import torch

from ..sampling import probs_from_logits, uniforms
from .base import Draft


DENSE_MAX = 4096    # tokens: above, the counts stay sparse and rows are built when met
ROW_MEMO = 512      # rows kept built (sparse tables)


def q_and_cdf(log_q: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q at `temperature` from log q (rows: (..., V)) and its float64 CDF, each row's CDF exactly 1
    from its last nonzero entry on, so that rounding can never select a char of probability 0."""
    q = probs_from_logits(log_q, temperature)
    cdf = q.double().cumsum(-1)
    cdf /= cdf[..., -1:].clone()
    last = (q > 0).double().cumsum(-1).argmax(-1)
    cols = torch.arange(q.shape[-1])
    cdf[cols >= last.unsqueeze(-1)] = 1.0
    return q, cdf


class SparseRows:
    """The bigram's rows at one temperature, built from sparse counts when first asked for:
    rows[prev] -> a list of V floats (q), or with cdf=True its CDF."""

    def __init__(self, draft: "BigramDraft", temperature: float, cdf: bool):
        self.draft, self.temperature, self.cdf = draft, temperature, cdf

    def __getitem__(self, prev: int) -> list[float]:
        q, cdf = self.draft.sparse_row(prev, self.temperature)
        return cdf if self.cdf else q


class BigramDraft(Draft):
    name = "bigram"
    batched = True   # a proposal reads only the last char and its uniforms: rows draft on their own
    folder_targets = True

    def __init__(self, target, train_ids: torch.Tensor, name: str | None = None, *, alpha: float,
                 dense_max: int = DENSE_MAX):
        super().__init__(target, train_ids, name)
        self.check_options(alpha=alpha)
        V = self.vocab_size
        self.alpha = alpha
        self._temperature = None
        self.sparse = V > dense_max
        if self.sparse:   # (prev, next) pairs that occur, grouped by prev: CSR
            pairs, n = torch.unique(train_ids[:-1].long() * V + train_ids[1:].long(), return_counts=True)
            self.next_ids, self.next_counts = pairs % V, n.double()
            self.row_start = torch.searchsorted(pairs // V, torch.arange(V + 1))
            self._memo: OrderedDict = OrderedDict()
            return
        counts = torch.zeros(V * V, dtype=torch.float64)
        counts.index_add_(0, train_ids[:-1] * V + train_ids[1:], torch.ones(len(train_ids) - 1, dtype=torch.float64))
        counts = counts.view(V, V) + alpha
        self.log_q = (counts / counts.sum(-1, keepdim=True)).log().float()  # (V, V) row = previous char

    def log_row(self, prev: int) -> torch.Tensor:
        """log q(. | prev), (V,) float32: the dense table's row, or built from the sparse counts
        by the same arithmetic."""
        if not self.sparse:
            return self.log_q[prev]
        a, b = int(self.row_start[prev]), int(self.row_start[prev + 1])
        counts = torch.full((self.vocab_size,), float(self.alpha), dtype=torch.float64)
        counts[self.next_ids[a:b]] += self.next_counts[a:b]
        return (counts / counts.sum()).log().float()

    def sparse_row(self, prev: int, temperature: float) -> tuple[list[float], list[float]]:
        key = (prev, temperature)
        hit = self._memo.get(key)
        if hit is None:
            q, cdf = q_and_cdf(self.log_row(prev), temperature)
            hit = self._memo[key] = (q.tolist(), cdf.tolist())
            if len(self._memo) > ROW_MEMO:
                self._memo.popitem(last=False)
        else:
            self._memo.move_to_end(key)
        return hit

    @classmethod
    def check_options(cls, *, alpha, **_) -> None:
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
            raise ValueError(f"bigram alpha must be > 0 so that q > 0 everywhere, got {alpha!r}")

    def _tables(self, temperature: float):
        if temperature != self._temperature:
            if self.sparse:
                self._q = None
                self._cdf, self._rows = SparseRows(self, temperature, True), SparseRows(self, temperature, False)
            else:
                self._q, cdf = q_and_cdf(self.log_q, temperature)   # (V, V) float32, what we sample from
                self._cdf = cdf.tolist()
                self._rows = self._q.tolist()  # q as Python rows: handed to the verifier as is
            self._temperature = temperature
        return self._q, self._cdf

    def propose(self, seq, k, temperature, gen, stop=None):
        _, cdf = self._tables(temperature)
        prev, drafts, q = seq[-1], [], []
        for ui in uniforms(k, gen):
            row = self._rows[prev]
            q.append(row)
            prev = bisect.bisect_right(cdf[prev], ui)  # cdf rows end at exactly 1 > ui
            drafts.append(prev)
            if stop is not None and stop(row[prev]):
                break
        return drafts, q                               # q: a row of V floats per drafted char

    def next_probs(self, context, temperature):
        """A lookup: the row of the last char, the very list `propose` hands over (read-only)."""
        self._tables(temperature)
        return self._rows[context[-1]]

    @torch.no_grad()
    def probs(self, idx, temperature):
        q_table, _ = self._tables(temperature)
        if not self.sparse:
            return q_table.to(idx.device)[idx]
        out = torch.empty(*idx.shape, self.vocab_size)
        for prev in idx.unique().tolist():
            out[idx == prev] = torch.tensor(self.sparse_row(prev, temperature)[0])
        return out.to(idx.device)

    def describe(self):
        if self.sparse:
            return {"alpha": self.alpha, "table_bytes": self.next_ids.numel() * 16 + self.row_start.numel() * 8,
                    "sparse": True}
        return {"alpha": self.alpha, "table_bytes": self.log_q.numel() * 4}
