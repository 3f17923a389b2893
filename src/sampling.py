"""The sampling math, as small pure functions: tensors and an explicit generator in.

Notation: p = target distribution, q = draft distribution, both already at the sampling
temperature. Speculative sampling (Leviathan et al. 2023, Chen et al. 2023): accept drafted x
with probability min(1, p(x)/q(x)); at the first rejection emit one sample from
normalize(max(0, p - q)) and stop; if all k are accepted emit a bonus sample from p at k+1.
The emitted chars are then distributed exactly as the target's.
"""
from __future__ import annotations

import torch


def probs_from_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """(..., V) logits -> (..., V) float32 probabilities; temperature 0 means greedy (one-hot)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    logits = logits.float()
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return torch.softmax(logits / temperature, dim=-1)


def sample(probs: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One draw per row: (..., V) -> (...,) long."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=gen).view(probs.shape[:-1])


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """normalize(max(0, p - q)) over the last dim, (..., V).

    Where p <= q everywhere (p == q up to rounding) the normalizer is 0; a rejection then had
    probability 0, so any distribution is correct: fall back to p rather than emit NaN.
    """
    r = (p - q).clamp_min(0.0)
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > 0, r / mass.clamp_min(torch.finfo(r.dtype).tiny), p)


def overlap(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """sum_x min(p(x), q(x)) = 1 - TVD(p, q): the exact acceptance probability at a position."""
    return torch.minimum(p, q).sum(-1)


def speculative_accept(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, gen: torch.Generator):
    """Verify k drafted chars in a batch of B independent sequences.

    p: (B, k+1, V) target probabilities at the k+1 verified positions.
    q: (B, k, V) the exact distributions the k drafts were sampled from.
    drafts: (B, k) long.
    Returns (n_accepted (B,) long in 0..k, next_char (B,) long): each sequence keeps
    drafts[:n] and then next_char (the correction at position n+1, or the bonus when n == k).
    """
    B, k = drafts.shape
    px = p[:, :k].gather(-1, drafts.unsqueeze(-1)).squeeze(-1)  # (B, k)
    qx = q.gather(-1, drafts.unsqueeze(-1)).squeeze(-1)          # (B, k), > 0: x was drawn from q
    u = torch.rand((B, k), generator=gen, device=p.device)
    accepted = u * qx < px                                       # u < p/q without dividing; q <= p: always
    n = accepted.long().cumprod(-1).sum(-1)                      # leading accepts, (B,)
    rows = torch.arange(B, device=p.device)
    p_next = p[rows, n]                                          # (B, V) target at position n+1
    q_next = q[rows, n.clamp(max=k - 1)]                         # (B, V) draft there (unused if n == k)
    dist = torch.where((n < k).unsqueeze(-1), residual(p_next, q_next), p_next)
    return n, sample(dist, gen)


def tvd(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Total variation distance between an empirical histogram (V,) and a distribution (V,)."""
    emp = counts.double() / counts.sum()
    return 0.5 * (emp - probs.double()).abs().sum().item()
