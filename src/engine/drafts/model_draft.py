"""A transformer draft with its own KV cache, written by position.

`pos` counts the leading tokens whose keys/values in the draft's cache are valid. After a
verification only the accepted drafts stay valid; when all k were accepted the draft has not
seen d_k yet, so the next proposal catches up on it (feeds 2 tokens instead of 1).

For a batch (`propose_batch`) the cache has a row per sequence, and every proposal after the
first feeds each row its last two committed chars at their own positions: that covers both
cases (after a rejection only the last char is new, after a full accept the last two), so no
row needs its own width; a slot written again gets keys and values computed from the same
prefix. Rows draw with `draw_rows`, each from its own uniforms.
"""
from __future__ import annotations

import torch

from ..models.model import Transformer
from ..sampling import draw, draw_rows, probs_from_logits, uniforms
from .base import Draft


class ModelDraft(Draft):
    name = "model"
    batched = True
    library = "assistant"   # engine=transformers: converted to a GPT2LMHeadModel, the assistant_model

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
        self.rows = 0   # a batch's rows in the cache, 0 until a batch's first proposal

    def reset(self):
        self.pos = 0
        self.rows = 0

    @torch.no_grad()
    def propose(self, seq, k, temperature, gen, stop=None):
        length = len(seq)
        device = self.positions.device
        if self.pos == 0:
            self.model.setup_cache(1)   # a batch run may have left a cache of several rows
        x = torch.tensor([seq[self.pos:]], device=device)              # (1, T): 1, or 2 after a full accept
        logits = self.model(x, self.positions[self.pos:length])[0, -1]  # (V,)
        drafts, qs = [], []
        for i in range(k):
            q = probs_from_logits(logits, temperature)                  # (V,)
            row = q.tolist()
            d = draw(row, uniforms(1, gen)[0])
            drafts.append(d)
            qs.append(q)
            if stop is not None and stop(row[d]):
                break
            if i < k - 1:  # d_k is not fed now: the target verifies it, the draft catches up later
                x = torch.tensor([[d]], device=device)
                logits = self.model(x, self.positions[length + i:length + i + 1])[0, -1]
        self.pos = length + len(drafts) - 1   # the last drafted char is not fed: the catch-up covers it
        return drafts, torch.stack(qs)

    def rewind(self, length):
        self.pos = min(self.pos, length)

    @torch.no_grad()
    def propose_batch(self, seqs, rows, k, temperature, sources):
        """k drafts for each of B sequences: k passes of the draft model over all B rows (shapes
        never depend on which rows are padding), each row drawing from its own uniforms (a
        padding row draws none). Returns (B lists of k ids, q (B, k, V))."""
        B, device = len(seqs), self.positions.device
        lengths = torch.tensor([len(s) for s in seqs], device=device)[:, None]        # (B, 1)
        if self.rows != B:   # a run's first proposal: cache the prompts (one length for all)
            self.model.setup_cache(B)
            self.rows = B
            x = torch.tensor(seqs, device=device)                                     # (B, P)
            logits = self.model(x, self.positions[:x.shape[1]])[:, -1]                # (B, V)
        else:
            x = torch.tensor([s[-2:] for s in seqs], device=device)                   # (B, 2)
            logits = self.model(x, lengths + self.positions[:2] - 2)[:, -1]           # (B, V)
        todo = set(rows)
        drafts, qs = [], []
        for i in range(k):
            q = probs_from_logits(logits, temperature)                                # (B, V)
            d = draw_rows(q, [uniforms(1, sources[b])[0] if b in todo else 0.0 for b in range(B)])  # (B,)
            drafts.append(d)
            qs.append(q)
            if i < k - 1:  # d_k is not fed now: the target verifies it, the next proposal catches up
                logits = self.model(d[:, None], lengths + i)[:, -1]
        return torch.stack(drafts, 1).tolist(), torch.stack(qs, 1)

    @torch.no_grad()
    def probs(self, idx, temperature):
        self.pos = 0  # the cache is replaced: the next proposal starts from scratch
        with self.model.cache_set_aside():
            return probs_from_logits(self.model(idx), temperature)

    def describe(self):
        return {"params": self.model.n_params()}
