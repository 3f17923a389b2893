"""Generation loops: plain autoregressive sampling (the baseline) and speculative sampling.

Both write into a preallocated token buffer and the target's KV cache by position. The last
committed char is never in the cache yet: it is the first input of the next pass. Rejected
drafts are discarded by rewinding the position; their stale cache slots lie beyond every
later query's causal mask until they are overwritten.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .drafts.base import Draft
from .model import Transformer
from .sampling import overlap, probs_from_logits, sample, speculative_accept


@dataclass
class Generation:
    tokens: list[int]          # the n_chars generated after the prompt
    target_passes: int         # target forward passes after the prompt's prefill
    chars_emitted: int = 0     # chars the passes produced (>= n_chars: the last pass may overshoot)
    proposed: int = 0          # drafted chars sent to verification
    accepted: int = 0          # drafted chars accepted
    tested: int = 0            # drafted chars whose acceptance test ran (up to the first rejection)
    draft_calls: int = 0
    accepted_at: list[int] = field(default_factory=list)  # [i]: passes whose draft i+1 was accepted
    overlap_sum: float = 0.0   # sum over tested positions of sum_x min(p, q)


def check_fits(model: Transformer, prompt_len: int, n_chars: int, k: int = 0) -> None:
    """Refuse a request past the trained context window: those chars would be garbage."""
    need = prompt_len + n_chars + k
    if need > model.cfg.block_size:
        raise ValueError(f"prompt ({prompt_len}) + n_chars ({n_chars}) + k ({k}) = {need} chars exceeds "
                         f"the model's context window of {model.cfg.block_size}")


def _prefill(target: Transformer, prompt: torch.Tensor):
    """Cache the prompt except its last char; return (token buffer, positions)."""
    if prompt.numel() < 1:
        raise ValueError("the prompt must have at least one character")
    block = target.cfg.block_size
    device = prompt.device
    tokens = torch.zeros(block, dtype=torch.long, device=device)
    tokens[: len(prompt)] = prompt
    positions = torch.arange(block, device=device)
    target.setup_cache(1)
    if len(prompt) > 1:
        target(prompt[:-1].unsqueeze(0), positions[: len(prompt) - 1])
    return tokens, positions


@torch.no_grad()
def generate_baseline(target: Transformer, prompt: torch.Tensor, n_chars: int, temperature: float,
                      gen: torch.Generator) -> Generation:
    """n_chars target passes, one char each."""
    check_fits(target, len(prompt), n_chars)
    tokens, positions = _prefill(target, prompt)
    L = len(prompt)
    for _ in range(n_chars):
        logits = target(tokens[L - 1:L].unsqueeze(0), positions[L - 1:L])  # (1, 1, V)
        tokens[L] = sample(probs_from_logits(logits[0, -1], temperature), gen)
        L += 1
    out = tokens[len(prompt):L].tolist()
    return Generation(out, target_passes=n_chars, chars_emitted=n_chars)


@torch.no_grad()
def generate_speculative(target: Transformer, draft: Draft, prompt: torch.Tensor, n_chars: int, k: int,
                         temperature: float, gen: torch.Generator, track_overlap: bool = True) -> Generation:
    """Speculative sampling until n_chars are emitted; the output is truncated to n_chars.

    track_overlap: also sum the analytic acceptance sum_x min(p, q) over tested positions (a
    counter; timed runs switch it off so they do only what a decoder does).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    check_fits(target, len(prompt), n_chars, k)
    tokens, positions = _prefill(target, prompt)
    draft.reset()
    g = Generation([], 0, accepted_at=[0] * k)
    L = len(prompt)
    while L - len(prompt) < n_chars:
        drafts, q = draft.propose(tokens, L, k, temperature, gen)           # k ids, (k, V)
        tokens[L:L + k] = torch.tensor(drafts, device=tokens.device)
        logits = target(tokens[L - 1:L + k].unsqueeze(0), positions[L - 1:L + k])  # (1, k+1, V)
        p = probs_from_logits(logits[0], temperature)                       # (k+1, V)
        n, nxt = speculative_accept(p, q, drafts, gen)
        tokens[L + n] = nxt
        tested = min(n + 1, k)
        if track_overlap:
            g.overlap_sum += float(overlap(p[:tested], q[:tested]).sum())
        g.target_passes += 1
        g.draft_calls += 1
        g.proposed += k
        g.accepted += n
        g.tested += tested
        for i in range(n):
            g.accepted_at[i] += 1
        draft.rewind(L + n)
        L += n + 1
    g.chars_emitted = L - len(prompt)
    g.tokens = tokens[len(prompt):len(prompt) + n_chars].tolist()
    return g
