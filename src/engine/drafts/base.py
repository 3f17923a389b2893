"""The draft interface: what the speculative loop needs from a draft model.

A draft proposes k chars after the committed sequence and returns, with them, the exact
distributions it sampled them from, so the acceptance ratio p/q uses that very q.

To add a draft: subclass `Draft` in a module of `src/engine/drafts/`, then write
`conf/draft/NAME.yaml` with `_target_: src.engine.drafts.module.ClassName`, `name: NAME` and the
class's own keyword arguments. Every draft is built as `cls(target=..., train_ids=..., **cfg)`;
the trial adds `cache_dir` (where a draft that trains keeps the result) and `target_key` to a
class whose __init__ takes them.

A draft that reads the target's hidden state (heads) sets `uses_target_hidden`; the loop then
hands it, through `observe`, the hidden row that produced each pass's last emitted char.
"""
from __future__ import annotations

import torch

from ..models.model import Transformer


class Draft:
    name: str = "draft"
    # True for drafts that read the target's last hidden state (heads): only for them does the
    # decode loop ask the target for hidden states and call `observe` after every pass.
    uses_target_hidden: bool = False
    # True for drafts that can draft for a batch of sequences (`propose_batch`, src/engine/decoding/batch.py):
    # a draft whose proposal depends only on the committed chars and its uniforms (the table
    # drafts) with the default below, a draft with state per sequence by overriding it
    batched: bool = False
    # Its counterpart in transformers' loop (engine=transformers, src/engine/huggingface/library_loop.py): "assistant"
    # (a model draft whose `model` is a Transformer, passed as `assistant_model`), "prompt_lookup"
    # (transformers' prompt lookup), or None: no counterpart, refused there before any work.
    library: str | None = None
    # True for a draft that runs in transformers' loop only (prompt_lookup): refused on the tool's engines
    library_only: bool = False
    # True for a draft that drafts for a model from a folder (model=hf, src/engine/huggingface/folder_model.py): one that
    # reads only token ids and the target's forward (bigram, the table drafts), or copies the target as
    # any nn.Module (int8_kernels); the others read the tool's own Transformer (its layout, its hidden
    # state) and are refused with model=hf
    folder_targets: bool = False

    def __init__(self, target: Transformer, train_ids: torch.Tensor, name: str | None = None):
        self.name = name or self.name
        self.vocab_size = target.cfg.vocab_size
        self.block_size = target.cfg.block_size

    @classmethod
    def check_options(cls, **options) -> None:
        """Raise ValueError (one sentence) for an option value the class cannot take. Called by
        __init__ and, before any work, by the trial's spec (src/trial/spec.py): a bad value in
        conf/draft/NAME.yaml is refused before the target trains. What needs the target or the
        training text (a vocabulary, a width) is checked where the draft is built."""

    def reset(self) -> None:
        """Forget any state: a new sequence starts."""

    def propose(self, seq: list[int], k: int, temperature: float, gen: torch.Generator,
                stop=None) -> tuple[list[int], torch.Tensor | list[list[float]]]:
        """Draft k chars after the committed chars `seq`.

        Returns (drafts: k char ids, q: (k, V) float32 tensor or k sequences of V floats: lists, or
        a table draft's `MixtureRow`s, which build the whole row only when iterated): q[i] is the
        distribution drafts[i] was sampled from, at `temperature` (one-hot at 0).
        stop: a draft-length policy's rule (src/engine/decoding/policy.py), called with q(d) of each char
        d as it is drawn; True ends the proposal after that char (fewer than k chars, and no
        drafting work spent on the rest).
        """
        raise NotImplementedError

    def propose_batch(self, seqs: list[list[int]], rows: list[int], k: int, temperature: float, sources: list):
        """Draft k chars after each of B committed sequences (a batch: src/engine/decoding/batch.py).

        seqs: B lists of committed ids; rows: the rows to draft for (the others are padding, a
        finished sequence: their drafts are any k ids and are never verified); sources: row b's
        uniforms (its own generator, or a `UniformBuffer` of it), so each row draws only from its
        own stream. Returns (drafts: B lists of k ids, q: a (B, k, V) tensor, or B per-row
        sequences of k rows as `propose` returns them, None for a padding row).

        This default drafts each row on its own with `propose` (no tensor op per char): right for a
        draft whose proposal depends only on the sequence and its uniforms (`batched` is then
        True); a draft with state per sequence (a KV cache) overrides it."""
        if not self.batched:
            raise NotImplementedError(f"draft {self.name!r} cannot draft for a batch of sequences")
        drafts, qs, todo = [], [], set(rows)
        for b, seq in enumerate(seqs):
            if b in todo:
                d, q = self.propose(seq, k, temperature, sources[b])
            else:
                d, q = [seq[-1]] * k, None
            drafts.append(d)
            qs.append(q)
        return drafts, qs

    def observe(self, hidden: torch.Tensor, emitted: int) -> None:
        """For drafts with `uses_target_hidden`: the target's hidden row (d_model,) at the input
        position whose distribution produced `emitted`, now the last committed char; the next
        `propose` drafts the chars after it. Called after the prompt and after every pass."""

    def rewind(self, length: int) -> None:
        """Only the first `length` chars the draft has seen still stand (the rest were rejected)."""

    @torch.no_grad()
    def probs(self, idx: torch.Tensor, temperature: float) -> torch.Tensor:
        """(B, T) ids -> (B, T, V): the distribution of the next char after each prefix, exactly
        what `propose` samples from. Used by the exactness checks."""
        raise NotImplementedError

    @torch.no_grad()
    def next_probs(self, context: list[int], temperature: float) -> list[float]:
        """The distribution (V floats) of the next char after `context`, exactly what `propose`
        samples from there. Tree verification builds its candidates from it. This default runs
        `probs` over the whole context; table drafts override it with a lookup."""
        return self.probs(torch.tensor([context]), temperature)[0, -1].tolist()

    @torch.no_grad()
    def sample_chain(self, prefix: torch.Tensor, k: int, temperature: float,
                     gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """k drafts after each of B prefixes, batched, by the law `propose` uses: (B, P) ids ->
        (drafts (B, k) ids, q (B, k, V): q[:, i] is the distribution drafts[:, i] was drawn from).

        The exactness tests drive every draft through this with an independent sampler
        (torch.multinomial); `propose` is tied to it by its own test. This default is the
        autoregressive chain over `probs`; a draft whose i-th proposal does not condition on the
        earlier drafts (heads on the target's hidden state) overrides it. Rows with the same prefix
        (all of them at first, from one prompt) share one `probs` row: each row's law is its
        prefix's, and the draws are those of the full (B, V) q."""
        seq, qs = prefix, []
        for _ in range(k):
            rows, where = torch.unique(seq, dim=0, return_inverse=True)
            q = self.probs(rows, temperature)[:, -1][where]              # (B, V)
            seq = torch.cat([seq, torch.multinomial(q, 1, generator=gen)], 1)
            qs.append(q)
        return seq[:, prefix.shape[1]:], torch.stack(qs, 1)

    def describe(self) -> dict:
        """Draft facts worth logging (memory, smoothing, ...)."""
        return {}
