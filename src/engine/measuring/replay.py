"""A free draft: the speculative loop re-run with a recorded run's proposals, at no drafting cost.

What it is for: the loop's own cost per pass (the verify pass as it runs inside the loop, the
acceptance test, the bookkeeping) measured directly, without any draft's time in it. Fitted
instead, it was not determined where the drafts left in a fit all cost about the same (the
quantized copies): the fit could not tell a per-pass overhead of the loop from a per-pass cost
of a slow draft, and a held-out cheap draft (bigram) inherited the wrong split.

`ProposalRecorder` wraps a chain draft for one run: every call passes through, and each
proposal is kept with the generator's state right after it. `ReplayDraft` hands the kept
proposals back in order and restores that state, so the acceptance tests draw the same
uniforms (the loop's buffer shares the generator with the draft) and the replayed run makes the
same passes and emits the same chars as the recorded one (tests/engine/measuring/test_replay.py checks it).
Replaying costs a list lookup and one `Generator.set_state` per pass.

A batch (src/engine/decoding/batch.py) is recorded and replayed the same way through `propose_batch`: each
call is kept with, per row, its uniform source's state right after it (a `UniformBuffer`'s block,
its position and its generator's state), and the replay restores them all, so every row's
acceptance tests draw what they drew (tests/engine/measuring/test_replay.py checks it for a batch too).

Row objects (table drafts' lazily built `MixtureRow`s) are handed back as copies without their
dense form (`MixtureRow.__copy__`), so the dense row the acceptance test builds on a rejection is
built again each run, as in the real loop (a tensor or plain lists of floats hold no such state
and go back as they are). Before 2026-12-04 the copies kept the recorded run's dense rows, and the
free loop of the table drafts (ngram, distilled) left that work out of the loop's own time.
Chains only: a tree draws its candidates in `build_tree`, outside the draft.
"""
from __future__ import annotations

import copy

import torch

from ..drafts.base import Draft
from ..sampling import UniformBuffer


class ProposalRecorder(Draft):
    """`draft` with its proposals recorded: (drafts, q, the generator's state after the call)."""

    def __init__(self, draft: Draft):
        self.draft = draft
        self.name, self.uses_target_hidden = draft.name, draft.uses_target_hidden
        self.batched = draft.batched
        self.vocab_size, self.block_size = draft.vocab_size, draft.block_size
        self.proposals: list[tuple[list[int], object, torch.Tensor]] = []

    def reset(self) -> None:
        self.proposals = []
        self.draft.reset()

    def propose(self, seq, k, temperature, gen, stop=None):
        drafts, q = (self.draft.propose(seq, k, temperature, gen) if stop is None else
                     self.draft.propose(seq, k, temperature, gen, stop=stop))
        self.proposals.append((list(drafts), q, gen.get_state()))
        return drafts, q

    def propose_batch(self, seqs, rows, k, temperature, sources):
        drafts, q = self.draft.propose_batch(seqs, rows, k, temperature, sources)
        self.proposals.append(([list(d) for d in drafts], q, [source_state(s) for s in sources]))
        return drafts, q

    def observe(self, hidden, emitted):
        self.draft.observe(hidden, emitted)

    def rewind(self, length):
        self.draft.rewind(length)


class ReplayDraft(Draft):
    """The recorded proposals, in order, at no cost: `reset` (called when a run starts) goes back
    to the first. Asked for more proposals than were recorded, or for another k, it raises:
    the run it replays has diverged from the recorded one."""

    def __init__(self, recorder: ProposalRecorder):
        if not recorder.proposals:
            raise ValueError("nothing recorded to replay: run the loop with the ProposalRecorder first")
        self.name, self.uses_target_hidden = f"replay of {recorder.name}", recorder.uses_target_hidden
        self.vocab_size, self.block_size = recorder.vocab_size, recorder.block_size
        self.proposals = recorder.proposals
        self.batched = recorder.batched
        self.next = 0

    def reset(self) -> None:
        self.next = 0

    def propose(self, seq, k, temperature, gen, stop=None):
        """The next recorded proposal (a policy's stop was applied when it was recorded: `stop`,
        which would now be fed the same chars, is not called again)."""
        n = len(self.proposals[self.next][0]) if self.next < len(self.proposals) else None
        if n is None or n > k or (stop is None and n != k):
            raise RuntimeError("the replayed run diverged from the recorded one")
        drafts, q, state = self.proposals[self.next]
        self.next += 1
        gen.set_state(state)
        if isinstance(q, torch.Tensor):
            return drafts, q
        return drafts, [row if isinstance(row, (list, tuple)) else copy.copy(row) for row in q]

    def propose_batch(self, seqs, rows, k, temperature, sources):
        """The next recorded batch proposal, every row's uniform source restored to its state then."""
        if self.next >= len(self.proposals) or len(self.proposals[self.next][2]) != len(sources) \
                or any(len(d) != k for d in self.proposals[self.next][0]):
            raise RuntimeError("the replayed run diverged from the recorded one")
        drafts, q, states = self.proposals[self.next]
        self.next += 1
        for source, state in zip(sources, states):
            restore_source(source, state)
        if isinstance(q, torch.Tensor):
            return drafts, q
        return drafts, [None if rows_b is None else [row if isinstance(row, (list, tuple)) else copy.copy(row)
                                                      for row in rows_b] for rows_b in q]


def source_state(source):
    """A uniform source's state: a generator's, or a UniformBuffer's (its block, position, generator)."""
    if isinstance(source, UniformBuffer):
        return source._values, source._next, source.gen.get_state()
    return source.get_state()


def restore_source(source, state) -> None:
    if isinstance(source, UniformBuffer):
        source._values, source._next, gen_state = state   # a refill replaces the block, never edits it
        source.gen.set_state(gen_state)
    else:
        source.set_state(state)
