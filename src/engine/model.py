"""Decoder-only character transformer whose forward runs over a preallocated KV cache.

`forward(idx, input_pos)` writes keys/values at the given positions and returns logits at
every input position, so one pass can verify k+1 drafted positions, and rejecting drafts is
only a rewind of the position (nothing is copied or concatenated), as in gpt-fast.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    block_size: int = 256  # context window: prompt + generated chars must fit
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    dropout: float = 0.0


class KVCache(nn.Module):
    """Keys and values for one layer, written by position. Shapes (B, H, block_size, Dh)."""

    def __init__(self, batch: int, n_head: int, block_size: int, head_dim: int, dtype, device):
        super().__init__()
        shape = (batch, n_head, block_size, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        # input_pos: (T,), k/v: (B, H, T, Dh) -> full cache tensors (B, H, block_size, Dh)
        self.k[:, :, input_pos] = k
        self.v[:, :, input_pos] = v
        return self.k, self.v


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        assert cfg.d_model % cfg.n_head == 0
        self.n_head, self.head_dim = cfg.n_head, cfg.d_model // cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.dropout = cfg.dropout
        self.kv_cache: KVCache | None = None

    def forward(self, x, mask, input_pos):
        B, T, C = x.shape  # (B, T, d_model)
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, self.head_dim).transpose(1, 2) for t in (q, k, v))
        if self.kv_cache is not None:
            # attend over the whole cache; `mask` hides positions after each query's own
            k, v = self.kv_cache.update(input_pos, k, v)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
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

    def forward(self, x, mask, input_pos):
        x = x + self.attn(self.ln1(x), mask, input_pos)
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
        # causal mask over the cache: row i may see columns 0..i. (block_size, block_size)
        causal = torch.tril(torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool))
        self.register_buffer("causal", causal, persistent=False)
        self._cache_batch = 0

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def setup_cache(self, batch: int = 1) -> None:
        """Allocate a KV cache for `batch` sequences (once; later calls reuse it)."""
        if self._cache_batch == batch:
            return
        p = next(self.parameters())
        for blk in self.blocks:
            blk.attn.kv_cache = KVCache(batch, blk.attn.n_head, self.cfg.block_size,
                                        blk.attn.head_dim, p.dtype, p.device)
        self._cache_batch = batch

    def drop_cache(self) -> None:
        for blk in self.blocks:
            blk.attn.kv_cache = None
        self._cache_batch = 0

    @contextmanager
    def cache_set_aside(self):
        """For full-sequence forwards (evaluation, exactness checks) on a model that has a
        cache: drop it, and on exit allocate a fresh one of the same batch (its contents are
        gone: the caller starts a new sequence afterwards)."""
        saved = self._cache_batch
        self.drop_cache()
        try:
            yield self
        finally:
            if saved:
                self.setup_cache(saved)

    def forward(self, idx: torch.Tensor, input_pos: torch.Tensor | None = None, return_hidden: bool = False):
        """idx: (B, T) token ids. input_pos: (T,) their positions, required with a cache.

        Returns logits (B, T, vocab) for every input position; with return_hidden, the pair
        (logits, hidden (B, T, d_model)): the last hidden state after ln_f, whose unembedding
        the logits are (drafts with heads on the target's hidden state read it).
        """
        B, T = idx.shape
        if input_pos is None:
            if self._cache_batch:
                raise ValueError("input_pos is required while a KV cache is set up")
            input_pos = torch.arange(T, device=idx.device)
            mask = None
        else:
            mask = self.causal[input_pos]  # (T, block_size)
        x = self.tok_emb(idx) + self.pos_emb(input_pos)
        for blk in self.blocks:
            x = blk(x, mask, input_pos)
        if return_hidden:
            x = self.ln_f(x)
            return self.head(x), x
        return self.head(self.ln_f(x))
