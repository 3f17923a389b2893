"""The sampling math, as small pure functions: tensors and an explicit generator in.

Notation: p = target distribution, q = draft distribution, both already at the sampling
temperature. Speculative sampling (Leviathan et al. 2023, Chen et al. 2023): accept drafted x
with probability min(1, p(x)/q(x)); at the first rejection emit one sample from
normalize(max(0, p - q)) and stop; if all k are accepted emit a bonus sample from p at k+1.
The emitted chars are then distributed exactly as the target's.

The per-pass work runs on Python floats after one `.tolist()` per tensor: with one sequence,
each tensor op costs microseconds of dispatch, and this code runs once per target pass in the
timed loop (baseline and speculative alike, so neither arm is handicapped).
"""
from __future__ import annotations

import bisect
from itertools import accumulate

import torch


def probs_from_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """(..., V) logits -> (..., V) float32 probabilities; temperature 0 means greedy (one-hot)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    if temperature != 1.0:
        logits = logits / temperature
    # the method without dtype=: the least dispatch for float32 logits, the loop's case
    return (logits if logits.dtype == torch.float32 else logits.float()).softmax(-1)


class UniformBuffer:
    """The uniforms of a generator drawn `block` at a time and handed out in order: one torch
    call per block instead of one per target pass (a call costs microseconds of dispatch, tens
    right after a forward pass has evicted the caches). Other users of the same generator (a
    draft's proposals) keep drawing from it directly, between blocks: every uniform is still a
    distinct draw of the generator's stream, so all are independent and a seed still fixes the
    run. A refill drops the block's unused tail, whose values decided nothing."""

    def __init__(self, gen: torch.Generator, block: int = 256):
        self.gen, self.block = gen, block
        self._values: list[float] = []
        self._next = 0

    def take(self, n: int) -> list[float]:
        if self._next + n > len(self._values):
            self._values = torch.rand(max(n, self.block), generator=self.gen, dtype=torch.float64,
                                      device=self.gen.device).tolist()
            self._next = 0
        self._next += n
        return self._values[self._next - n:self._next]


def uniforms(n: int, source: torch.Generator | UniformBuffer) -> list[float]:
    """n float64 uniforms in [0, 1 - 2^-53] from the run's generator, or from its buffer."""
    if isinstance(source, UniformBuffer):
        return source.take(n)
    return torch.rand(n, generator=source, dtype=torch.float64, device=source.device).tolist()


def draw(weights: list[float], u: float) -> int:
    """Inverse-CDF draw from nonnegative `weights` (unnormalized is fine) with uniform u.

    The first index whose CDF exceeds u * total. A zero-weight char has an empty interval and is
    never chosen; u <= 1 - 2^-53 makes u * total < total exactly in float64, so the draw never
    runs past the last char with weight.
    """
    cdf = list(accumulate(weights))
    return bisect.bisect_right(cdf, u * cdf[-1])


def sample(probs: torch.Tensor, gen: torch.Generator | UniformBuffer) -> int:
    """One draw from a (V,) distribution."""
    return draw(probs.tolist(), uniforms(1, gen)[0])


def draw_rows(probs: torch.Tensor, u: list[float]) -> torch.Tensor:
    """One inverse-CDF draw per row of (B, V) nonnegative weights, row b with uniform u[b]: the
    rule of `draw` for a whole batch in three tensor ops (B rows of `draw` in Python cost B times
    V list operations). Returns (B,) long ids. As in `draw`, a zero-weight char has an empty
    interval (its CDF equals the one before) and u <= 1 - 2^-53 keeps u * total < total, so the
    draw never lands on a char of weight 0 or past the last char."""
    cdf = probs.double().cumsum(-1)                                                     # (B, V)
    at = torch.tensor(u, dtype=torch.float64, device=probs.device)[:, None] * cdf[:, -1:]  # (B, 1)
    return torch.searchsorted(cdf, at, right=True)[:, 0]


def residual_weights(p_row: list[float], q_row: list[float]) -> list[float]:
    """max(0, p - q), unnormalized. Where p <= q everywhere (p == q up to rounding) it is all
    zero; a rejection then had probability ~0 and any distribution is correct: use p, never NaN."""
    r = [a - b if a > b else 0.0 for a, b in zip(p_row, q_row)]
    return r if any(r) else p_row


def speculative_accept(p, q, drafts: list[int], gen: torch.Generator | UniformBuffer):
    """Verify k drafted chars of one sequence.

    p: (k+1, V) target probabilities at the k+1 verified positions: a tensor, or its rows as
       lists of floats (the loop converts once and reuses them).
    q: (k, V) the exact distributions the k drafts were sampled from: a tensor, or k sequences of
       V floats (a table draft hands over its rows without building a tensor; at T = 1 they are
       `MixtureRow`s: Q[n][x] computes one char's q, and only the rejected row is built whole).
    drafts: the k drafted char ids.
    Returns (n_accepted in 0..k, next_char): the sequence keeps drafts[:n] and then next_char
    (the correction at position n+1, or the bonus from p[k] when n == k).
    """
    k = len(drafts)
    u = uniforms(k + 1, gen)                                  # k acceptance tests + 1 draw
    P = p.tolist() if isinstance(p, torch.Tensor) else p
    Q = q.tolist() if isinstance(q, torch.Tensor) else q
    n = 0
    while n < k and u[n] * Q[n][drafts[n]] < P[n][drafts[n]]:  # u < p/q without dividing
        n += 1
    weights = residual_weights(P[n], Q[n]) if n < k else P[k]
    return n, draw(weights, u[k])


def accept_rows(p: torch.Tensor, q, drafts: list[list[int]], sources: list, rows: list[int]) -> dict[int, tuple[int, int]]:
    """`speculative_accept` for the rows of a batch, each on its own uniforms.

    p: (B, k+1, V) target probabilities of the batch's verify pass.
    q: (B, k, V) tensor, or B per-row sequences of k rows (a table draft's lists or MixtureRows;
       None for a row not verified): q[b][i] is the law drafts[b][i] was drawn from.
    drafts: B lists of k ids. sources: row b's uniform source (its own generator or buffer).
    rows: the rows to verify (a finished sequence's row is padding: not verified, no uniform drawn).
    Returns {b: (n_accepted, next_char)}, the same rule with the same uniforms as
    `speculative_accept` on row b alone: u[i] * q(d_i) < p(d_i) accepts draft i, the first
    rejection draws from max(0, p - q) at its own position with u[k], all accepted draws the
    bonus from p[k]. Only the values the rule reads leave the tensors: p and q of the drafted
    chars (B, k) and one whole row per sequence, the one its draw is from."""
    k = p.shape[1] - 1
    ids = torch.tensor(drafts, device=p.device)                                      # (B, k)
    p_d = p[:, :k].gather(-1, ids[..., None])[..., 0].tolist()                        # (B, k)
    dense = isinstance(q, torch.Tensor)
    q_d = q.gather(-1, ids[..., None])[..., 0].tolist() if dense else None           # (B, k)
    n_of, u_of = {}, {}
    for b in rows:
        u = uniforms(k + 1, sources[b])
        qb = q_d[b] if dense else [q[b][i][d] for i, d in enumerate(drafts[b])]
        n = 0
        while n < k and u[n] * qb[n] < p_d[b][n]:   # u < p/q without dividing
            n += 1
        n_of[b], u_of[b] = n, u[k]
    if not rows:
        return {}
    at = torch.tensor(rows, device=p.device)
    ns = torch.tensor([n_of[b] for b in rows], device=p.device)
    p_rows = p[at, ns].tolist()                                                       # (R, V): each row's draw
    q_rows = q[at, ns.clamp(max=k - 1)].tolist() if dense else None                  # (R, V)
    out = {}
    for j, b in enumerate(rows):
        n = n_of[b]
        if n < k:
            weights = residual_weights(p_rows[j], q_rows[j] if dense else q[b][n])
        else:
            weights = p_rows[j]
        out[b] = n, draw(weights, u_of[b])
    return out


def overlap(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """sum_x min(p(x), q(x)) = 1 - TVD(p, q): the exact acceptance probability at a position."""
    return torch.minimum(p, q).sum(-1)


def kept_probs(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """r_j = min(1, p_j(d_j) / q_j(d_j)): (B, k), the probability the acceptance test keeps drawn
    draft j once it is reached. p, q: (B, k, V), the target's and the draft's distributions at
    drafted position j (q the law d_j was drawn from); drafts: (B, k) ids."""
    pick = drafts.unsqueeze(-1)                                                        # (B, k, 1)
    return (p.gather(-1, pick) / q.gather(-1, pick)).clamp(max=1.0).squeeze(-1)        # (B, k)


def survival(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """S_i = P(drafts 1..i all accepted), i = 1..k, averaged over B chains.

    p, q: (B, k, V), the target's and the draft's distributions at drafted position i (q the
    law d_i was drawn from); drafts: (B, k) ids. Given the drawn chain, draft j is accepted with
    probability r_j = min(1, p_j(d_j) / q_j(d_j)) (`kept_probs`), independently of the others (its
    own uniform), and, given d_1..d_{i-1}, draft i with probability beta_i = sum_x min(p_i(x), q_i(x))
    (d_i averaged out). So
        S_i = mean over chains of  r_1 ... r_{i-1} beta_i,
    an unbiased estimate of the probability the loop keeps draft i (the last factor exact)."""
    r = kept_probs(p, q, drafts)                                                       # (B, k)
    before = torch.cumprod(torch.cat([torch.ones_like(r[:, :1]), r[:, :-1]], 1), 1)    # (B, k): prod_{j<i} r_j
    return (before * overlap(p, q)).mean(0)                                            # (k,)


def tvd(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Total variation distance between an empirical histogram (V,) and a distribution (V,)."""
    emp = counts.double() / counts.sum()
    return 0.5 * (emp - probs.double()).abs().sum().item()
