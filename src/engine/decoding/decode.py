"""Generation loops: plain autoregressive sampling (the baseline) and speculative sampling.

The committed chars live in a Python list; the target's KV cache is written by position. The
last committed char is never in the cache yet: it is the first input of the next pass.
Rejected drafts are discarded by rewinding the position; their stale cache slots lie beyond
every later query's causal mask until they are overwritten.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..drafts.base import Draft
from ..models.model import Transformer
from .policy import Policy
from ..sampling import UniformBuffer, overlap, probs_from_logits, sample, speculative_accept, survival


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
    drafted_at: list[int] = field(default_factory=list)   # [i]: passes that drafted i+1 chars or more
    passes_log: list[tuple[int, int]] = field(default_factory=list)  # per pass: (chars drafted, kept)
    overlap_sum: float = 0.0   # sum over tested positions of sum_x min(p, q)
    survival_sum: list[float] = field(default_factory=list)  # [i]: sum over passes of S_{i+1} of the
                               # pass's drawn chain (sampling.survival; chains, with track_survival)


def _summed(lists: list[list]) -> list:
    """Elementwise sums of lists of different lengths (a missing entry counts 0)."""
    width = max((len(x) for x in lists), default=0)
    return [sum(x[i] for x in lists if i < len(x)) for i in range(width)]


def pooled(gens: list[Generation]) -> Generation:
    """Several runs' counters as one run's (a workload's prompts): every count summed, the pass
    logs joined; the tokens are the first run's. One run pools to itself. Any extra count a loop
    sets on its Generation (transformers' `assistant_forwards`) is summed too."""
    if len(gens) == 1:
        return gens[0]
    first = gens[0]
    out = Generation(list(first.tokens), sum(g.target_passes for g in gens),
                     chars_emitted=sum(g.chars_emitted for g in gens), proposed=sum(g.proposed for g in gens),
                     accepted=sum(g.accepted for g in gens), tested=sum(g.tested for g in gens),
                     draft_calls=sum(g.draft_calls for g in gens),
                     accepted_at=_summed([g.accepted_at for g in gens]),
                     drafted_at=_summed([g.drafted_at for g in gens]),
                     passes_log=[p for g in gens for p in g.passes_log],
                     overlap_sum=sum(g.overlap_sum for g in gens),
                     survival_sum=_summed([g.survival_sum for g in gens]))
    for name in set(vars(first)) - set(Generation.__dataclass_fields__):
        setattr(out, name, sum(getattr(g, name) for g in gens))
    return out


def check_fits(model: Transformer, prompt_len: int, n_chars: int, k: int = 0) -> None:
    """Refuse a request past the trained context window: those chars would be garbage."""
    need = prompt_len + n_chars + k
    if need > model.cfg.block_size:
        raise ValueError(f"prompt ({prompt_len}) + n_chars ({n_chars}) + k ({k}) = {need} chars exceeds "
                         f"the model's context window of {model.cfg.block_size}")


def prefill(target: Transformer, prompt: list[int], extra: int = 0, return_hidden: bool = False):
    """Cache the prompt except its last char, in a cache with `extra` scratch slots beyond
    block_size (a tree's nodes); return the positions tensor (block_size + extra,), whose
    entries serve as positions and as cache slots alike.

    return_hidden: return (positions, the hidden row (d_model,) at input P-2, whose
    distribution predicts the prompt's last char; None for a 1-char prompt: nothing to prefill).
    """
    if len(prompt) < 1:
        raise ValueError("the prompt must have at least one character")
    device = target.causal.device
    target.setup_cache(1, extra)
    positions = torch.arange(target.cfg.block_size + extra, device=device)
    hidden = None
    if len(prompt) > 1:
        out = target(torch.tensor([prompt[:-1]], device=device), positions[: len(prompt) - 1],
                     return_hidden=return_hidden)
        if return_hidden:
            hidden = out[1][0, -1]
    return (positions, hidden) if return_hidden else positions


def observe_prompt(target: Transformer, draft: Draft, seq: list[int], positions: torch.Tensor,
                   hidden: torch.Tensor | None, temperature: float, gen: torch.Generator) -> int:
    """Hand a hidden-state draft the prefill's last hidden row and the prompt's last char.
    A 1-char prompt has no prefill: one plain target pass emits the next char (appended to
    `seq`) and gives the row. Returns the target passes made (0 or 1)."""
    if hidden is not None:
        draft.observe(hidden, seq[-1])
        return 0
    x = torch.tensor([seq[-1:]], device=positions.device)                                # (1, 1)
    logits, h = target(x, positions[len(seq) - 1:len(seq)], return_hidden=True)         # (1, 1, V), (1, 1, d)
    seq.append(sample(probs_from_logits(logits[0, -1], temperature), gen))
    draft.observe(h[0, -1], seq[-1])
    return 1


class PassInputs:
    """A generation's pass inputs of one width (k + 1 ids): the ids are written in place into
    one int64 buffer, item by item through a memoryview of it, and the positions are views made
    up front, so a pass builds them without a torch or numpy call (each costs microseconds of
    dispatch, tens right after a forward has evicted the caches). Off the CPU the ids take one
    host-to-device copy. A pass's forward has read the buffer before the next pass rewrites it."""

    def __init__(self, positions: torch.Tensor, width: int):
        self.windows = positions.unfold(0, width, 1).unbind(0)  # [s]: positions s..s+width-1, (width,)
        self.device = positions.device
        self.ids = torch.zeros(1, width, dtype=torch.long) if self.device.type == "cpu" else None
        self._slots = memoryview(self.ids.numpy().reshape(-1)) if self.ids is not None else None

    def __call__(self, ids: list[int], start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """ids (width of them) at positions start.. -> ((1, width) ids, (width,) positions)."""
        if self.ids is None:
            return torch.tensor([ids], device=self.device), self.windows[start]
        slots = self._slots
        for i, x in enumerate(ids):
            slots[i] = x
        return self.ids, self.windows[start]


def _rows_tensor(q, n: int) -> torch.Tensor:
    """The first n of a draft's q rows (a tensor, or rows that iterate over V floats) as (n, V)."""
    if isinstance(q, torch.Tensor):
        return q[:n].float().cpu()
    return torch.tensor([list(row) for row in q[:n]])


def id_list(prompt) -> list[int]:
    return prompt.tolist() if isinstance(prompt, torch.Tensor) else list(prompt)


@torch.no_grad()
def generate_baseline(target: Transformer, prompt, n_chars: int, temperature: float,
                      gen: torch.Generator) -> Generation:
    """n_chars target passes, one char each."""
    seq = id_list(prompt)
    P = len(seq)
    check_fits(target, P, n_chars)
    positions = prefill(target, seq)
    inputs, u = PassInputs(positions, 1), UniformBuffer(gen)
    for L in range(P, P + n_chars):
        logits = target(*inputs([seq[-1]], L - 1))                                      # (1, 1, V)
        seq.append(sample(probs_from_logits(logits[0, -1], temperature), u))
    return Generation(seq[P:], target_passes=n_chars, chars_emitted=n_chars)


@torch.no_grad()
def generate_speculative(target: Transformer, draft: Draft, prompt, n_chars: int, k: int,
                         temperature: float, gen: torch.Generator, track_overlap: bool = True,
                         track_survival: bool = False, policy: Policy | None = None) -> Generation:
    """Speculative sampling until n_chars are emitted; the output is truncated to n_chars.

    track_overlap: also sum the analytic acceptance sum_x min(p, q) over tested positions (a
    counter; timed runs switch it off so they do only what a decoder does).
    track_survival: also sum per position i the survival S_i of each pass's drawn chain
    (sampling.survival; acceptance.loop_survival's counter, about 0.1 ms a pass, so off by default).
    policy: the draft-length policy (src/engine/decoding/policy.py); None drafts k chars every pass. With
    an adaptive one, k is the cap and each pass's verify is as wide as its drafts plus one.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    seq = id_list(prompt)
    P = len(seq)
    check_fits(target, P, n_chars, k)
    hidden = draft.uses_target_hidden  # the draft reads the target's hidden rows (heads)
    if hidden:
        positions, h = prefill(target, seq, return_hidden=True)
    else:
        positions = prefill(target, seq)
    draft.reset()
    policy = policy or Policy()   # fixed: k chars every pass
    policy.reset(k)
    inputs = {k: PassInputs(positions, k + 1)}   # per width drafted: a policy's passes vary
    u = UniformBuffer(gen)  # the acceptance tests' uniforms; the draft draws from gen itself
    g = Generation([], 0, accepted_at=[0] * k, survival_sum=[0.0] * k)
    if hidden:
        g.target_passes += observe_prompt(target, draft, seq, positions, h, temperature, gen)
    passes = accepted = tested = proposed = 0  # counters in locals inside the loop: it is timed
    accepted_at, log = g.accepted_at, g.passes_log
    while len(seq) - P < n_chars:
        L = len(seq)
        stop = policy.stopper()   # None: the pass drafts policy.length() chars, the interface without stop
        drafts, q = (draft.propose(seq, policy.length(), temperature, gen) if stop is None else
                     draft.propose(seq, policy.length(), temperature, gen, stop=stop))      # j <= k ids, (j, V)
        j = len(drafts)
        x, pos = (inputs.get(j) or inputs.setdefault(j, PassInputs(positions, j + 1)))([seq[-1]] + drafts, L - 1)
        if hidden:
            logits, h = target(x, pos, return_hidden=True)                  # (1, j+1, V), (1, j+1, d)
        else:
            logits = target(x, pos)                                         # (1, j+1, V)
        p = probs_from_logits(logits, temperature).tolist()[0]             # j+1 rows of V floats
        n, nxt = speculative_accept(p, q, drafts, u)
        seq += drafts[:n]
        seq.append(nxt)
        draft.rewind(L + n)
        if hidden:  # nxt came from the distribution at verify row n (input position L-1+n)
            draft.observe(h[0, n], nxt)
        policy.update(j, n)
        passes += 1
        accepted += n
        proposed += j
        t = min(n + 1, j)  # positions whose acceptance test ran (up to the first rejection)
        tested += t
        log.append((j, n))
        for i in range(n):
            accepted_at[i] += 1
        if track_overlap:
            g.overlap_sum += float(overlap(torch.tensor(p[:t]), _rows_tensor(q, t)).sum())
        if track_survival:
            s = survival(torch.tensor(p[:j])[None], _rows_tensor(q, j)[None], torch.tensor([drafts]))  # (j,)
            g.survival_sum = [a + b for a, b in zip(g.survival_sum, s.tolist() + [0.0] * (k - j))]
    g.target_passes += passes
    g.draft_calls, g.proposed, g.accepted, g.tested = passes, proposed, accepted, tested
    g.drafted_at = [sum(j > i for j, _ in log) for i in range(k)]   # after the timed loop: from its log
    g.chars_emitted = len(seq) - P
    g.tokens = seq[P:P + n_chars]
    return g
