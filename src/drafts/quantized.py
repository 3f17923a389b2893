"""A fake-quantized copy of the target as the draft (int8 / int4 in the seed).

It keeps its own KV cache, written by position. `pos` counts the leading tokens whose
keys/values in that cache are valid; after a verification only the accepted drafts stay
valid, and when all k were accepted the draft has not yet seen d_k, so the next proposal
catches up on it (feeds 2 tokens instead of 1).
"""
from __future__ import annotations

import torch

from ..quantize import quantized_copy
from ..sampling import probs_from_logits, sample
from .base import Draft


class QuantizedDraft(Draft):
    name = "quantized"

    def __init__(self, target, train_ids, name: str | None = None, bits: int = 8,
                 granularity: str = "channel", group_size: int = 32):
        super().__init__(target, train_ids, name)
        self.bits, self.granularity, self.group_size = bits, granularity, group_size
        target_cache = target._cache_batch
        target.drop_cache()  # do not deep-copy the target's cache buffers
        self.model, self.memory = quantized_copy(target, bits, granularity, group_size)
        if target_cache:
            target.setup_cache(target_cache)
        self.model.eval()
        self.model.setup_cache(1)
        device = next(self.model.parameters()).device
        self.positions = torch.arange(self.block_size, device=device)
        self.pos = 0

    def reset(self):
        self.pos = 0

    @torch.no_grad()
    def propose(self, tokens, length, k, temperature, gen):
        # catch up on committed tokens not yet in the cache (1, or 2 after a full accept)
        x = tokens[self.pos:length].unsqueeze(0)                       # (1, T)
        logits = self.model(x, self.positions[self.pos:length])[0, -1]  # (V,)
        drafts, qs = [], []
        for i in range(k):
            q = probs_from_logits(logits, temperature)                  # (V,)
            d = sample(q, gen)                                          # () long
            drafts.append(d)
            qs.append(q)
            if i < k - 1:  # d_k is never fed: the target verifies it, the draft catches up later
                logits = self.model(d.view(1, 1), self.positions[length + i:length + i + 1])[0, -1]
        self.pos = length + k - 1
        return torch.stack(drafts), torch.stack(qs)

    def rewind(self, length):
        self.pos = min(self.pos, length)

    @torch.no_grad()
    def probs(self, idx, temperature):
        saved = self.model._cache_batch
        self.model.drop_cache()  # full-sequence forward, no cache
        try:
            return probs_from_logits(self.model(idx), temperature)
        finally:
            self.model.setup_cache(saved)
            self.pos = 0

    def describe(self):
        return {"bits": self.bits, "granularity": self.granularity, "group_size": self.group_size,
                "float32_bytes": self.memory["float32_bytes"], "packed_bytes": self.memory["packed_bytes"]}
