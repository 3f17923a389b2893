"""A transformer draft with its own KV cache, written by position.

`pos` counts the leading tokens whose keys/values in the draft's cache are valid. After a
verification only the accepted drafts stay valid; when all k were accepted the draft has not
seen d_k yet, so the next proposal catches up on it (feeds 2 tokens instead of 1).
"""
from __future__ import annotations

import torch

from ..model import Transformer
from ..sampling import probs_from_logits, sample
from .base import Draft


class ModelDraft(Draft):
    name = "model"

    def __init__(self, target: Transformer, train_ids, name: str | None = None, model: Transformer | None = None):
        super().__init__(target, train_ids, name)
        if model is None:
            raise ValueError("ModelDraft needs a draft model")
        if model.cfg.vocab_size != target.cfg.vocab_size or model.cfg.block_size < target.cfg.block_size:
            raise ValueError("the draft model must share the target's vocabulary and context window")
        self.model = model.eval()
        self.model.setup_cache(1)
        self.positions = torch.arange(self.block_size, device=next(model.parameters()).device)
        self.pos = 0

    def reset(self):
        self.pos = 0

    @torch.no_grad()
    def propose(self, seq, k, temperature, gen):
        length = len(seq)
        device = self.positions.device
        x = torch.tensor([seq[self.pos:]], device=device)              # (1, T): 1, or 2 after a full accept
        logits = self.model(x, self.positions[self.pos:length])[0, -1]  # (V,)
        drafts, qs = [], []
        for i in range(k):
            q = probs_from_logits(logits, temperature)                  # (V,)
            d = sample(q, gen)
            drafts.append(d)
            qs.append(q)
            if i < k - 1:  # d_k is not fed now: the target verifies it, the draft catches up later
                x = torch.tensor([[d]], device=device)
                logits = self.model(x, self.positions[length + i:length + i + 1])[0, -1]
        self.pos = length + k - 1
        return drafts, torch.stack(qs)

    def rewind(self, length):
        self.pos = min(self.pos, length)

    @torch.no_grad()
    def probs(self, idx, temperature):
        self.pos = 0  # the cache is replaced: the next proposal starts from scratch
        with self.model.cache_set_aside():
            return probs_from_logits(self.model(idx), temperature)

    def describe(self):
        return {"params": self.model.n_params()}
