"""Target-distilled context table: rows are the target's own next-char distributions.

One batched forward of the target over the first `distill_chars` chars of the training split
(null: the whole split) gives p_t = p(. | chars up to t) at T=1 for each position t. A context h of n chars (n = 0..order)
then has the count n_h of positions whose last n chars are h and the sum S_h of their p_t. The
row of a context backs off to its suffix h' by count, one of:

  backoff=interpolate  row_h = (S_h + beta row_h') / (n_h + beta): count-weighted interpolation
                       (a Dirichlet prior of strength beta centred on the shorter context's row);
  backoff=longest      row_h = S_h / n_h for the longest context seen at least min_count times.

Contexts seen fewer than `min_count` times are left out (in both modes: they back off whole).
Entries below `prune` are dropped, so a row keeps the chars the target gives real mass to; a
floor of `floor` uniform mass is mixed in last, so q > 0 for every char. In the table recurrence
of table.py: interpolate has lam = beta / (n_h + beta), vals = S_h / (n_h + beta); longest has
lam = 0, vals = S_h / n_h.

Windows: the forward runs over windows of the target's block_size; each window but the first
starts an eighth of a block before the positions it contributes, so every distilled position sees
at least that much left context (the first window's positions see what precedes them). More
barely matters: on the default target (order 6, 100K chars) a quarter block gave the same
acceptance as an eighth (0.804) and no overlap 0.803; an eighth costs 8/7 of the forward
positions of no overlap, a quarter 4/3.
The forward uses all cores and restores the thread count after.
"""
from __future__ import annotations

import torch

from ..sampling import probs_from_logits
from ..models.train import all_cores
from .table import TableDraft, assemble

BACKOFFS = ("interpolate", "longest")


def window_starts(n: int, length: int, left: int) -> list[int]:
    """Starts of windows of `length` over n positions, each contributing the positions after its
    first `left` (the first window contributes all): together they cover 0..n-1 exactly once."""
    stride = length - left
    starts = list(range(0, n - length + 1, stride))
    if starts[-1] + length < n:
        starts.append(n - length)
    return starts


@torch.no_grad()
def target_probs(model, ids: torch.Tensor, batch: int = 32) -> torch.Tensor:
    """(N,) ids -> (N, V) float32: p_t, the target's T=1 distribution of the char after ids[t]."""
    N, block = len(ids), model.cfg.block_size
    length = min(block, N)
    left = length // 8
    device = next(model.parameters()).device
    out = torch.empty(N, model.cfg.vocab_size, dtype=torch.float32)
    starts = window_starts(N, length, left)
    done = 0                                                   # positions 0..done-1 are filled
    with model.cache_set_aside():
        for b in range(0, len(starts), batch):
            group = starts[b:b + batch]
            x = torch.stack([ids[s:s + length] for s in group]).to(device)      # (b, length)
            p = probs_from_logits(model(x), 1.0).cpu()                          # (b, length, V)
            for row, s in enumerate(group):
                out[done:s + length] = p[row, done - s:]
                done = s + length
    return out


class DistilledDraft(TableDraft):
    name = "distilled"
    dense_vocab_rows = True   # its build holds the target's distribution (V floats) after every training position

    def __init__(self, target, train_ids: torch.Tensor, name: str | None = None, *, order: int,
                 distill_chars: int | None, backoff: str, min_count: int, beta: float, prune: float, floor: float,
                 cache_dir=None, target_key: str | None = None):
        self.check_options(order=order, distill_chars=distill_chars, backoff=backoff, min_count=min_count,
                           beta=beta, prune=prune, floor=floor)
        self.distill_chars, self.backoff, self.min_count = distill_chars, backoff, min_count
        self.beta, self.prune, self.floor_mix = float(beta), float(prune), float(floor)
        super().__init__(target, train_ids, name, order, cache_dir, target_key)

    @classmethod
    def check_options(cls, *, distill_chars, backoff, min_count, beta, prune, floor, **options) -> None:
        super().check_options(**options)
        if distill_chars is not None and (isinstance(distill_chars, bool) or not isinstance(distill_chars, int)
                                          or distill_chars < 2):
            raise ValueError(f"distill_chars must be an integer >= 2 or null (the whole training split), "
                             f"got {distill_chars!r}")
        if backoff not in BACKOFFS:
            raise ValueError(f"backoff must be one of {', '.join(BACKOFFS)}, got {backoff!r}")
        if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
            raise ValueError(f"min_count must be an integer >= 1, got {min_count!r}")
        for key, value in (("beta", beta), ("prune", prune), ("floor", floor)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{key} must be a number, got {value!r}")
        if not beta > 0:
            raise ValueError(f"beta must be > 0, got {beta!r}")
        if not 0 <= prune < 1:
            raise ValueError(f"prune must be in [0, 1), got {prune!r}")
        if not 0 < floor < 1:
            raise ValueError(f"floor must be in (0, 1) so that q > 0 everywhere, got {floor!r}")

    def settings(self) -> dict:
        s = {"order": self.order, "distill_chars": self.distill_chars, "backoff": self.backoff,
             "min_count": self.min_count, "prune": self.prune, "floor": self.floor_mix}
        return {**s, "beta": self.beta} if self.backoff == "interpolate" else s

    def _build(self, target, train_ids):
        ids = (train_ids if self.distill_chars is None else train_ids[:self.distill_chars]).cpu().long()
        with all_cores():
            p = target_probs(target, ids)                                       # (N, V)
        return self.table_from(ids, p)

    def table_from(self, ids: torch.Tensor, p: torch.Tensor) -> dict:
        """The table from ids (N,) and the target's distributions after each of them, p (N, V)."""
        N, V, B = len(ids), p.shape[1], self.base
        codes = torch.zeros(N, dtype=torch.int64)
        levels, scale = [], 1
        for j in range(self.order + 1):              # contexts of the last j chars
            if j > 0:
                # code_j[t] = code_{j-1}[t] + (ids[t-j+1] + 1) B^(j-1); positions t < j-1 have no such context
                codes[j - 1:] += (ids[:N - j + 1] + 1) * scale
                scale *= B
            ctx, inverse, count = torch.unique(codes[max(j - 1, 0):], return_inverse=True, return_counts=True)
            sums = torch.zeros(len(ctx), V, dtype=torch.float32).index_add_(0, inverse, p[max(j - 1, 0):])
            keep = count >= self.min_count if j > 0 else torch.ones_like(count, dtype=torch.bool)
            n, sums = count[keep].double().unsqueeze(1), sums[keep].double()
            if self.backoff == "interpolate":
                lam, add = self.beta / (n.squeeze(1) + self.beta), sums / (n + self.beta)
            else:
                lam, add = torch.zeros(len(n), dtype=torch.float64), sums / n
            mask = add > self.prune if self.prune > 0 else torch.ones_like(add, dtype=torch.bool)
            rows, chars = mask.nonzero(as_tuple=True)                           # row-major: grouped by context
            levels.append((ctx[keep], lam, mask.sum(1), chars, add[rows, chars]))
        return assemble(levels, V)

    def describe(self):
        chars = "all" if self.distill_chars is None else self.distill_chars
        return {"distill_chars": chars, "backoff": self.backoff, "min_count": self.min_count,
                **({"beta": self.beta} if self.backoff == "interpolate" else {}), **super().describe()}
