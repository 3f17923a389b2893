"""Bigram draft: the next char depends on the previous one only (the seed's part-1 baseline).

q(b | a) = (count(a b) + alpha) / (count(a) + alpha * V) over the training split. With
alpha > 0 every q is positive, so q > 0 wherever the target can put mass. At temperature T
the table becomes q^(1/T) renormalized (the same temperature rule as the target's logits,
applied to log q).

The hot loop avoids per-char tensor work: k uniforms are drawn in one call, each char is an
inverse-CDF lookup (bisect on a precomputed float64 row), and q is one gather at the end.
"""
from __future__ import annotations

import bisect

import torch

from ..sampling import probs_from_logits, uniforms
from .base import Draft


class BigramDraft(Draft):
    name = "bigram"
    batched = True   # a proposal reads only the last char and its uniforms: rows draft on their own
    folder_targets = True

    def __init__(self, target, train_ids: torch.Tensor, name: str | None = None, *, alpha: float):
        super().__init__(target, train_ids, name)
        self.check_options(alpha=alpha)
        V = self.vocab_size
        counts = torch.zeros(V * V, dtype=torch.float64)
        counts.index_add_(0, train_ids[:-1] * V + train_ids[1:], torch.ones(len(train_ids) - 1, dtype=torch.float64))
        counts = counts.view(V, V) + alpha
        self.alpha = alpha
        self.log_q = (counts / counts.sum(-1, keepdim=True)).log().float()  # (V, V) row = previous char
        self._temperature = None

    @classmethod
    def check_options(cls, *, alpha, **_) -> None:
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
            raise ValueError(f"bigram alpha must be > 0 so that q > 0 everywhere, got {alpha!r}")

    def _tables(self, temperature: float):
        if temperature != self._temperature:
            self._q = probs_from_logits(self.log_q, temperature)  # (V, V) float32, what we sample from
            cdf = self._q.double().cumsum(-1)
            cdf /= cdf[:, -1:].clone()
            # From each row's last nonzero entry on, set the CDF to exactly 1 so that rounding
            # can never select a char of probability 0.
            last = (self._q > 0).double().cumsum(-1).argmax(-1)
            cols = torch.arange(self.vocab_size)
            cdf[cols.unsqueeze(0) >= last.unsqueeze(1)] = 1.0
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
        return q_table.to(idx.device)[idx]

    def describe(self):
        return {"alpha": self.alpha, "table_bytes": self.log_q.numel() * 4}
