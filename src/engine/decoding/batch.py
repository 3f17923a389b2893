"""Batched decoding: B sequences decoded together, each exact on its own.

Sequence b has its own prompt (all prompts of one length), its own sampling stream (a generator
of its own, `stream_generators`), and, in the speculative loop, its own accepted count per pass,
length and cache positions (ragged). The target's KV cache has a row per sequence (B, H, S, Dh);
a pass writes row b's keys and values at row b's slots, and row b's queries attend only over row
b of the cache, so nothing of one sequence ever enters another's attention.

- `generate_baseline_batch`: one (B, 1) target pass per step; the sequences move in lockstep.
- `generate_speculative_batch`: per step the draft proposes k chars for every sequence
  (`Draft.propose_batch`), one (B, k+1) verify pass scores them at each row's own positions
  (B, k+1), and each row runs the acceptance rule on its own uniforms (`sampling.accept_rows`).

A static batch: a sequence that has its n_chars stays in the batch as padding until the last one
has them (a pass's shape never changes, as in a fixed-batch benchmark of a serving engine that
does not refill finished slots). A padding row is verified at its frozen end (its chars up to
n_chars, so no position runs past the context window), its output dropped, its counters stopped,
and it draws no uniform. The batch's passes are those of its slowest sequence: throughput counts
them, the per-sequence counters do not.

Both arms produce B x n_chars chars, so the throughput speedup (chars per second over all B
sequences) is the ratio of the arms' times, as at B = 1. At B = 1 the trial keeps the
one-sequence loops of decode.py (the counters of earlier runs stay as they were).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .decode import check_fits
from ..drafts.base import Draft
from ..sampling import UniformBuffer, accept_rows, draw_rows, overlap, probs_from_logits


STREAM_STEP = 0x9E3779B9   # odd: b -> b * STREAM_STEP is one-to-one modulo 2^32


def stream_seed(seed: int, b: int) -> int:
    """Sequence b's seed: the trial's seed for b = 0, and for a given seed distinct for every
    b < 2^32. Modulo 2^32 because torch's CPU generator keeps only a seed's low 32 bits (seeds
    seed + b * 2^40 gave every sequence the same stream: tests/engine/decoding/test_batch.py's
    independence test caught it)."""
    return (seed + b * STREAM_STEP) % 2 ** 32


def stream_generators(seed: int, batch: int, device: str = "cpu", first: int = 0) -> list[torch.Generator]:
    """Sequences first .. first + batch - 1's generators (a workload's later batches go on counting)."""
    return [torch.Generator(device=device).manual_seed(stream_seed(seed, b)) for b in range(first, first + batch)]


def check_prompts(prompts: list[list[int]]) -> int:
    """The prompts' common length (a batch starts in lockstep); one sentence if they differ."""
    if not prompts or any(len(p) != len(prompts[0]) for p in prompts) or not prompts[0]:
        raise ValueError("a batch needs one or more non-empty prompts, all of one length")
    return len(prompts[0])


def prefill_batch(target, prompts: list[list[int]]) -> torch.Tensor:
    """Cache the B prompts except their last char (one (B, P-1) pass, shared positions) in a
    cache of B rows; return the positions tensor (block_size,)."""
    P = check_prompts(prompts)
    device = target.causal.device
    target.setup_cache(len(prompts))
    positions = torch.arange(target.cfg.block_size, device=device)
    if P > 1:
        target(torch.tensor([p[:-1] for p in prompts], device=device), positions[:P - 1])
    return positions


@dataclass
class BatchGeneration:
    tokens: list[list[int]]          # per sequence, its n_chars generated chars
    target_passes: int               # the batch's passes after the prefill (its slowest sequence's)
    chars: list[int]                 # per sequence: chars its own passes emitted (>= n_chars)
    passes: list[int]                # per sequence: passes until it had n_chars
    accepted: list[int] = field(default_factory=list)   # per sequence: drafted chars accepted
    tested: list[int] = field(default_factory=list)     # per sequence: acceptance tests run
    accepted_at: list[list[int]] = field(default_factory=list)  # [b][i]: passes whose draft i+1 was kept
    overlap_sum: list[float] = field(default_factory=list)      # [b]: sum of sum_x min(p, q) over tested positions
    accepts: list[list[int]] = field(default_factory=list)      # [b]: n accepted at each of its passes
    sequences: list[list[int]] = field(default_factory=list)    # [b]: every char its passes emitted


@torch.no_grad()
def generate_baseline_batch(target, prompts: list[list[int]], n_chars: int, temperature: float,
                            gens: list[torch.Generator]) -> BatchGeneration:
    """n_chars (B, 1) target passes; row b draws from its own generator."""
    P = check_prompts(prompts)
    check_fits(target, P, n_chars)
    positions = prefill_batch(target, prompts)
    B, device = len(prompts), positions.device
    sources = [UniformBuffer(g) for g in gens]
    last = torch.tensor([p[-1] for p in prompts], device=device)[:, None]          # (B, 1)
    out = []
    for L in range(P, P + n_chars):
        logits = target(last, positions[L - 1:L])                                  # (B, 1, V)
        probs = probs_from_logits(logits[:, 0], temperature)                       # (B, V)
        last = draw_rows(probs, [s.take(1)[0] for s in sources])[:, None]          # (B, 1)
        out.append(last)
    chars = torch.cat(out, 1).tolist() if out else [[] for _ in range(B)]
    return BatchGeneration(chars, n_chars, [n_chars] * B, [n_chars] * B, sequences=chars)


@torch.no_grad()
def generate_speculative_batch(target, draft: Draft, prompts: list[list[int]], n_chars: int, k: int,
                               temperature: float, gens: list[torch.Generator],
                               track_overlap: bool = True) -> BatchGeneration:
    """Speculative sampling for B sequences until each has n_chars (module docstring).

    track_overlap: also sum sum_x min(p, q) over each sequence's tested positions (a counter;
    timed runs switch it off)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if draft.uses_target_hidden:
        raise ValueError(f"draft {draft.name!r} reads the target's hidden rows: it drafts one sequence at a time")
    P = check_prompts(prompts)
    check_fits(target, P, n_chars, k)
    positions = prefill_batch(target, prompts)
    device = positions.device
    draft.reset()
    B, end = len(prompts), P + n_chars
    seqs = [list(p) for p in prompts]
    accept_u = [UniformBuffer(g) for g in gens]   # each row's acceptance tests
    draft_u = [UniformBuffer(g) for g in gens]    # each row's drafts: blocks of the same stream
    offsets = positions[:k + 1]                   # (k+1,)
    g = BatchGeneration([], 0, [0] * B, [0] * B, [0] * B, [0] * B, [[0] * k for _ in range(B)],
                        [0.0] * B, [[] for _ in range(B)])
    active = [b for b in range(B) if len(seqs[b]) < end]
    while active:
        views = [s if len(s) < end else s[:end] for s in seqs]   # padding rows at their frozen end
        drafts, q = draft.propose_batch(views, active, k, temperature, draft_u)   # B x k ids, q
        starts = torch.tensor([len(v) - 1 for v in views], device=device)[:, None]  # (B, 1)
        x = torch.tensor([[v[-1]] + d for v, d in zip(views, drafts)], device=device)  # (B, k+1)
        logits = target(x, starts + offsets)                                       # (B, k+1, V)
        p = probs_from_logits(logits, temperature)                                 # (B, k+1, V)
        verdicts = accept_rows(p, q, drafts, accept_u, active)
        g.target_passes += 1
        for b, (n, nxt) in verdicts.items():
            seqs[b] += drafts[b][:n]
            seqs[b].append(nxt)
            g.passes[b] += 1
            g.accepted[b] += n
            g.accepts[b].append(n)
            t = min(n + 1, k)   # positions whose acceptance test ran (up to the first rejection)
            g.tested[b] += t
            for i in range(n):
                g.accepted_at[b][i] += 1
            if track_overlap:
                qb = q[b, :t].float().cpu() if isinstance(q, torch.Tensor) else torch.tensor([list(r) for r in q[b][:t]])
                g.overlap_sum[b] += float(overlap(p[b, :t].cpu(), qb).sum())
        active = [b for b in active if len(seqs[b]) < end]
    g.chars = [len(s) - P for s in seqs]
    g.sequences = [s[P:] for s in seqs]
    g.tokens = [s[P:end] for s in seqs]
    return g
