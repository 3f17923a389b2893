"""Decoder-only character transformer whose forward runs over a preallocated KV cache.

`forward(idx, input_pos)` writes keys/values at the given positions and returns logits at
every input position, so one pass can verify k+1 drafted positions, and rejecting drafts is
only a rewind of the position (nothing is copied or concatenated), as in gpt-fast.

Tree verification (src/engine/decoding/tree.py) passes two more arguments: `slots`, the cache slots the
inputs' keys/values go to (tree nodes at the same depth share a position, so they get scratch
slots after the committed prefix, in a cache allocated with `extra` slots beyond block_size),
and an explicit boolean `mask` over the cache's slots. `move_cache` then copies the accepted
path's keys/values into place. The chain's forward is unchanged: both default to the position.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class ModelConfig:
    """A model's shape; the values come from conf/model/ (no defaults here: one source each)."""
    vocab_size: int
    block_size: int        # context window: prompt + generated chars must fit
    n_layer: int
    n_head: int
    d_model: int
    dropout: float


class KVCache(nn.Module):
    """Keys and values for one layer, written by slot (the position, unless a tree pass says
    otherwise). Shapes (B, H, slots, Dh), slots = block_size + extra scratch slots."""

    def __init__(self, batch: int, n_head: int, slots: int, head_dim: int, dtype, device):
        super().__init__()
        shape = (batch, n_head, slots, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        # slots: (T,) shared by the batch, or (B, T) per sequence; k/v: (B, H, T, Dh)
        # -> full cache tensors (B, H, S, Dh)
        if slots.dim() == 1:
            self.k[:, :, slots] = k
            self.v[:, :, slots] = v
        else:  # each sequence at its own slots: rows index (B, 1) x (B, T) -> (B, T, H, Dh)
            rows = torch.arange(k.shape[0], device=k.device)[:, None]
            self.k[rows, :, slots] = k.transpose(1, 2)
            self.v[rows, :, slots] = v.transpose(1, 2)
        return self.k, self.v

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy slots src (n,) to dst (n,). Advanced indexing gathers before it writes, so
        overlapping ranges are safe."""
        self.k[:, :, dst] = self.k[:, :, src]
        self.v[:, :, dst] = self.v[:, :, src]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        assert cfg.d_model % cfg.n_head == 0
        self.n_head, self.head_dim = cfg.n_head, cfg.d_model // cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.dropout = cfg.dropout
        self.kv_cache: KVCache | None = None

    def forward(self, x, mask, slots):
        B, T, C = x.shape  # (B, T, d_model)
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, self.head_dim).transpose(1, 2) for t in (q, k, v))
        if self.kv_cache is not None:
            # attend over the whole cache; `mask` (T, S), or (B, T, S) per sequence, hides every
            # slot a query may not see (a sequence only ever sees its own row of the cache)
            k, v = self.kv_cache.update(slots, k, v)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask if mask.dim() == 2 else mask[:, None])
        else:
            drop = self.dropout if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=False),
            nn.GELU(),
            nn.Linear(4 * cfg.d_model, cfg.d_model, bias=False),
        )

    def forward(self, x, mask, slots):
        x = x + self.attn(self.ln1(x), mask, slots)
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init)
        self._cache_batch = 0
        self.cache_extra = 0  # scratch slots beyond block_size in the current cache
        self._set_causal(cfg.block_size)

    def _set_causal(self, slots: int) -> None:
        # causal mask over the cache: row (position) i may see slots 0..i; the scratch slots
        # beyond block_size are never visible to a chain query. (block_size, slots)
        causal = torch.tril(torch.ones(self.cfg.block_size, slots, dtype=torch.bool))
        self.register_buffer("causal", causal.to(self.tok_emb.weight.device), persistent=False)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def setup_cache(self, batch: int = 1, extra: int = 0) -> None:
        """Allocate a KV cache for `batch` sequences with block_size + `extra` slots (the
        extra ones are scratch for tree nodes). Later calls with the same arguments reuse it;
        other arguments reallocate it (its contents are gone), so a chain or baseline run
        after a tree run attends over exactly block_size slots again."""
        if self._cache_batch == batch and self.cache_extra == extra:
            return
        p = next(self.parameters())
        slots = self.cfg.block_size + extra
        for blk in self.blocks:
            blk.attn.kv_cache = KVCache(batch, blk.attn.n_head, slots, blk.attn.head_dim, p.dtype, p.device)
        if self.causal.shape[1] != slots:
            self._set_causal(slots)
        self._cache_batch, self.cache_extra = batch, extra

    def drop_cache(self) -> None:
        for blk in self.blocks:
            blk.attn.kv_cache = None
        self._cache_batch = 0

    def move_cache(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy the keys/values of cache slots src (n,) to slots dst (n,) in every layer."""
        for blk in self.blocks:
            blk.attn.kv_cache.move(src, dst)

    @contextmanager
    def cache_set_aside(self):
        """For full-sequence forwards (evaluation, exactness checks) on a model that has a
        cache: drop it, and on exit allocate a fresh one of the same batch (its contents are
        gone: the caller starts a new sequence afterwards)."""
        saved, extra = self._cache_batch, self.cache_extra
        self.drop_cache()
        try:
            yield self
        finally:
            if saved:
                self.setup_cache(saved, extra)

    def forward(self, idx: torch.Tensor, input_pos: torch.Tensor | None = None,
                slots: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                *, return_hidden: bool = False):
        """idx: (B, T) token ids. input_pos: (T,) their positions, required with a cache, or (B, T)
        when each sequence of a batch is at its own position (src/engine/decoding/batch.py).
        slots: (T,) or (B, T), the cache slots their keys/values are written to (default: input_pos).
        mask: (T, S) or (B, T, S) bool, the cache slots each input attends to (default: causal by
        position).

        Returns logits (B, T, vocab) for every input position; with return_hidden, the pair
        (logits, hidden (B, T, d_model)): the last hidden state after ln_f, whose unembedding
        the logits are (drafts with heads on the target's hidden state read it).
        """
        B, T = idx.shape
        if input_pos is None:
            if self._cache_batch:
                raise ValueError("input_pos is required while a KV cache is set up")
            input_pos = torch.arange(T, device=idx.device)
        elif mask is None:
            mask = self.causal[input_pos]  # (T, S)
        x = self.tok_emb(idx) + self.pos_emb(input_pos)
        if slots is None:
            slots = input_pos
        for blk in self.blocks:
            x = blk(x, mask, slots)
        if return_hidden:
            x = self.ln_f(x)
            return self.head(x), x
        return self.head(self.ln_f(x))
