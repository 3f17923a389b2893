"""Prompt lookup (transformers' `prompt_lookup_num_tokens`): a draft of the library's loop only.

transformers drafts up to k tokens: those that followed the first occurrence, left to right, of
the text's last n-gram (n from `max_matching_ngram_size` down to 1) that has a continuation (none
where no n-gram recurs: the pass then verifies no draft), and verifies them by sampling the target at every drafted position
and keeping the drafts up to the first mismatch (exact: a draft d is kept with probability p(d),
and otherwise the pass emits the target's own sample, which is then not d). It runs under
engine=transformers only (src/engine/huggingface/library_loop.py); the tool's own engines refuse it before any work,
and its n-gram counterpart there is draft=ngram.
"""
from __future__ import annotations

from .base import Draft


class PromptLookupDraft(Draft):
    name = "prompt_lookup"
    library = "prompt_lookup"
    library_only = True

    def __init__(self, target, train_ids, name: str | None = None, *, max_matching_ngram_size: int):
        super().__init__(target, train_ids, name)
        self.check_options(max_matching_ngram_size=max_matching_ngram_size)
        self.max_matching_ngram_size = max_matching_ngram_size

    @classmethod
    def check_options(cls, *, max_matching_ngram_size, **_) -> None:
        m = max_matching_ngram_size
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"max_matching_ngram_size must be an integer >= 1, got {m!r}")

    def propose(self, seq, k, temperature, gen, stop=None):
        raise NotImplementedError("prompt lookup runs in transformers' loop only (engine=transformers)")

    def describe(self):
        return {"max_matching_ngram_size": self.max_matching_ngram_size}
