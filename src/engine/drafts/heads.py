"""Medusa-style heads on the target's last hidden state (Cai et al. 2024), distilled from the
frozen target and cached like it.

Positions: the target's hidden state h_j at input position j (after ln_f) has logits that
predict char j+1. Head i (1..n_heads) on h_j predicts char j+1+i. With `condition`, head i also
sees char j+1 (its own embedding, added to h_j): in the loop the drafts for the next pass are
proposed after the verify pass emitted that char, so it is known.

The loop: the verify pass that emitted char L-1 (from the distribution at input L-2) hands
over h_{L-2} and the char (`observe`); `propose` then drafts chars L..L+k-1 from heads 1..k.
So drafting costs no extra target call, only the heads' forward and k draws. Draft i is drawn
from q_i = head i's distribution at the sampling temperature; q_i does not depend on the
earlier drafts d_1..d_{i-1}, which keeps the speculative rule exact (the verifier needs the
law each draft was drawn from, and q_i is it).

Head i: u = h (+ emb_i[char]); `n_layers` residual blocks u += W2 silu(W1 u + b1) of width
hidden_mult * d_model; logits = u @ E^T with E the target's own unembedding (frozen, shared).
W2 and emb start at zero, so every head starts as the target's next-char distribution.

Training: minimize KL(target's distribution at j+1+i given the true prefix || head i on h_j)
over random rows of the training split (hidden rows of a pool of windows, computed once), the
target frozen, with every core, deterministic given the seed (and the thread count). The heads
are cached under <cache_dir>/heads-<key>.pt, key = the target's key and every setting here,
written atomically with a sha256 sidecar.
"""
from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from ..locks import BUILD_WAIT_S, file_lock
from ..models.model import Transformer
from ..sampling import probs_from_logits
from ..models.train import all_cores, random_windows, read_checkpoint, save_checkpoint, verify_checkpoint
from .base import Draft

log = logging.getLogger(__name__)

FORMAT = 1  # bump when the heads' architecture or training changes what a setting means


class Heads(nn.Module):
    """n_heads heads stacked along one dimension, so all run as one batched matmul per layer."""

    def __init__(self, d_model: int, vocab_size: int, n_heads: int, hidden: int, n_layers: int, condition: bool,
                 gen: torch.Generator):
        super().__init__()
        H, L, d, m = n_heads, n_layers, d_model, hidden
        # emb[c, i]: head i's embedding of the emitted char c. (V, H, d)
        self.emb = nn.Parameter(torch.zeros(vocab_size, H, d)) if condition else None
        self.w1 = nn.Parameter(torch.randn(L, H, d, m, generator=gen) * 0.02)   # (L, H, d, m)
        self.b1 = nn.Parameter(torch.zeros(L, H, m))
        self.w2 = nn.Parameter(torch.zeros(L, H, m, d))          # zero: each block starts as identity

    def forward(self, hidden: torch.Tensor, chars: torch.Tensor | None, unembed: torch.Tensor, k: int) -> torch.Tensor:
        """hidden (..., d), chars (...) ids (an int for one row): the emitted char after each
        hidden row (ignored without conditioning), unembed (V, d) -> logits (..., k, V) of heads 1..k."""
        u = hidden.unsqueeze(-2).expand(*hidden.shape[:-1], k, hidden.shape[-1])    # (..., k, d)
        if self.emb is not None:
            u = u + self.emb[chars, :k]                                            # (..., k, d)
        if u.dim() == 2:  # one row (the loop's propose): k small matmuls as one bmm, half einsum's cost
            u = u.unsqueeze(1)                                                     # (k, 1, d)
            for w1, b1, w2 in zip(self.w1, self.b1, self.w2):
                a = F.silu(torch.baddbmm(b1[:k].unsqueeze(1), u, w1[:k]))          # (k, 1, m)
                u = torch.baddbmm(u, a, w2[:k])                                    # (k, 1, d)
            u = u.squeeze(1)                                                       # (k, d)
        else:
            for w1, b1, w2 in zip(self.w1, self.b1, self.w2):
                a = F.silu(torch.einsum("...hd,hdm->...hm", u, w1[:k]) + b1[:k])   # (..., k, m)
                u = u + torch.einsum("...hm,hmd->...hd", a, w2[:k])                # (..., k, d)
        return u @ unembed.T                                                       # (..., k, V)


def heads_key(target_key: str, settings: dict) -> str:
    blob = json.dumps({"target": target_key, "format": FORMAT, **settings}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@torch.no_grad()
def hidden_pool(target: Transformer, train_ids: torch.Tensor, windows: int, gen: torch.Generator,
                batch: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """The frozen target's hidden rows over `windows` random windows of the training split,
    computed once: (x (W, T) ids, hidden (W, T, d)). The target's logits are hidden @ E^T (its
    unembedding has no bias), so its distributions need not be stored."""
    x = torch.cat([random_windows(train_ids, target.cfg.block_size, min(batch, windows - s), gen)[0]
                   for s in range(0, windows, batch)]).to(target.head.weight.device)     # (W, T)
    hid = torch.cat([target(x[s:s + batch], return_hidden=True)[1] for s in range(0, windows, batch)])
    return x, hid


def distill(heads: Heads, target: Transformer, train_ids: torch.Tensor, steps: int, rows: int, pool_windows: int,
            lr: float, seed: int) -> list[float]:
    """Train `heads` on the frozen `target` (a cache-free model): each step draws `rows` random
    hidden rows h_j from the pool and minimizes, for every head i, KL(target's distribution at
    row j+i || head i on h_j with char j+1). Returns the KL (nats) per head, averaged over the
    last tenth of the steps."""
    gen = torch.Generator().manual_seed(seed)
    H = heads.w1.shape[1]
    E = target.head.weight.detach()                                    # (V, d), frozen
    x, hid = hidden_pool(target, train_ids, pool_windows, gen)         # (W, T), (W, T, d)
    W, T = x.shape
    opt = torch.optim.AdamW(heads.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.99))
    warmup, tail, every = max(1, steps // 20), max(1, steps // 10), max(1, steps // 10)
    ahead = torch.arange(1, H + 1, device=x.device)                    # (H,) head i reads row j + i
    kl_tail = torch.zeros(H, dtype=torch.float64, device=x.device)
    for step in range(steps):
        frac = max(0.0, (step - warmup) / max(1, steps - warmup))
        for g in opt.param_groups:                                     # warmup, then cosine to lr / 10
            g["lr"] = lr * (step + 1) / warmup if step < warmup else lr * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))
        w = torch.randint(0, W, (rows,), generator=gen).to(x.device)   # (R,) window
        j = torch.randint(0, T - 1, (rows,), generator=gen).to(x.device)  # (R,) row: char j+1 is in the window
        tgt = j.unsqueeze(1) + ahead                                   # (R, H): row j+i, exists if <= T-1
        valid = (tgt <= T - 1).float()                                 # (R, H)
        logp = F.log_softmax(hid[w.unsqueeze(1), tgt.clamp(max=T - 1)] @ E.T, -1)   # (R, H, V)
        lq = F.log_softmax(heads(hid[w, j], x[w, j + 1], E, H), -1)    # (R, H, V)
        kl = (logp.exp() * (logp - lq)).sum(-1) * valid                # (R, H)
        kl_head = kl.sum(0) / valid.sum(0).clamp(min=1)                # (H,) mean KL per head
        opt.zero_grad(set_to_none=True)
        kl_head.mean().backward()
        opt.step()
        kl_head = kl_head.detach().double()
        if step >= steps - tail:
            kl_tail += kl_head / tail
        if (step + 1) % every == 0 or step + 1 == steps:
            log.info("heads step %d/%d  KL per head %s", step + 1, steps,
                     " ".join(f"{v:.3f}" for v in kl_head.tolist()))
    return kl_tail.tolist()


class HeadsDraft(Draft):
    name = "heads"
    uses_target_hidden = True

    @classmethod
    def check_options(cls, *, lr, **options) -> None:
        for arg in ("n_heads", "hidden_mult", "n_layers", "steps", "rows", "pool_windows"):
            v = options.get(arg)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"heads {arg} must be an integer >= 1, got {v!r}")
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
            raise ValueError(f"heads lr must be > 0, got {lr!r}")

    def __init__(self, target: Transformer, train_ids: torch.Tensor, name: str | None = None, *, n_heads: int,
                 hidden_mult: int, n_layers: int, condition: bool, steps: int, rows: int, pool_windows: int,
                 lr: float, seed: int, cache_dir: str | Path | None = None, target_key: str | None = None):
        """Settings as in conf/draft/heads.yaml. cache_dir and target_key (the trial passes
        both): load the heads from the cache, or train and save them there; without them the
        heads are trained and kept in memory only."""
        super().__init__(target, train_ids, name)
        self.check_options(n_heads=n_heads, hidden_mult=hidden_mult, n_layers=n_layers, steps=steps, rows=rows,
                           pool_windows=pool_windows, lr=lr)
        self.settings = {"n_heads": n_heads, "hidden_mult": hidden_mult, "n_layers": n_layers,
                         "condition": bool(condition), "steps": steps, "rows": rows, "pool_windows": pool_windows,
                         "lr": float(lr), "seed": seed}
        self.n_heads, self.condition = n_heads, bool(condition)
        # a private cache-free copy of the target for full-sequence forwards (training, probs,
        # sample_chain), so they never disturb the KV cache of the loop's target
        with target.cache_set_aside():
            self.frozen = copy.deepcopy(target).eval().requires_grad_(False)
        self.unembed = self.frozen.head.weight                        # (V, d), the target's own
        d = target.cfg.d_model
        self.heads = Heads(d, self.vocab_size, n_heads, hidden_mult * d, n_layers, self.condition,
                           torch.Generator().manual_seed(seed))
        self.heads.to(self.unembed.device)
        self.train_seconds, self.kl = self._load_or_train(train_ids, cache_dir, target_key)
        self.heads.eval().requires_grad_(False)
        self._hidden: torch.Tensor | None = None                      # (d,) the observed row
        self._char: int | None = None

    # -- training and cache --------------------------------------------------------------------
    def _train(self, train_ids) -> tuple[float, list[float]]:
        s = self.settings
        log.info("distilling %d heads (%d params) from the target, %d steps", self.n_heads,
                 sum(p.numel() for p in self.heads.parameters()), s["steps"])
        t0 = time.perf_counter()
        with all_cores(), torch.enable_grad():
            kl = distill(self.heads, self.frozen, train_ids, s["steps"], s["rows"], s["pool_windows"], s["lr"],
                         s["seed"])
        secs = time.perf_counter() - t0
        log.info("distilled heads in %.0f s: KL per head %s", secs, " ".join(f"{v:.3f}" for v in kl))
        return secs, kl

    def _load_or_train(self, train_ids, cache_dir, target_key) -> tuple[float, list[float]]:
        if cache_dir is None or target_key is None:
            return self._train(train_ids)
        path = Path(cache_dir) / f"heads-{heads_key(target_key, self.settings)}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(str(path) + ".lock", f"the heads {path.name}", BUILD_WAIT_S):  # the first trains, the others load
            if not path.is_file():
                secs, kl = self._train(train_ids)
                save_checkpoint(path, {"target_key": target_key, "settings": self.settings, "train_seconds": secs,
                                       "kl": kl, "state_dict": self.heads.state_dict()})
        verify_checkpoint(path)
        ckpt = read_checkpoint(path)
        self.heads.load_state_dict(ckpt["state_dict"])
        log.info("heads loaded from %s", path)
        return float(ckpt["train_seconds"]), list(ckpt["kl"])

    # -- the laws -------------------------------------------------------------------------------
    def head_probs(self, hidden: torch.Tensor, chars, k: int, temperature: float) -> torch.Tensor:
        """hidden (..., d), chars (...) ids (an int for one row) -> (..., k, V): q_1..q_k at
        `temperature`, the laws the drafts are drawn from (propose and sample_chain both go
        through here)."""
        if k > self.n_heads:
            raise ValueError(f"k = {k} exceeds the draft's {self.n_heads} heads")
        return probs_from_logits(self.heads(hidden, chars, self.unembed, k), temperature)

    def _prefix_hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """(B, P) ids -> (B, P, d): the target's hidden rows from a full forward (cache-free copy)."""
        return self.frozen(idx, return_hidden=True)[1]

    # -- the loop -------------------------------------------------------------------------------
    def reset(self):
        self._hidden = self._char = None

    def observe(self, hidden, emitted):
        self._hidden, self._char = hidden, emitted

    @torch.no_grad()
    def propose(self, seq, k, temperature, gen, stop=None):
        if self._char is None or seq[-1] != self._char:
            raise RuntimeError("heads propose from the hidden row `observe` gave for the last committed char; "
                               "observe was not called for this sequence")
        q = self.head_probs(self._hidden, self._char, k, temperature)                 # (k, V)
        # inverse-CDF draws, one per row, as `sampling.draw` does (bisect right on the float64 CDF)
        cdf = q.double().cumsum(-1)                                                    # (k, V)
        u = torch.rand(k, 1, generator=gen, dtype=torch.float64, device=gen.device)  # (k, 1)
        drafts = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)                  # (k, 1)
        drafts = drafts.view(-1).tolist()
        if stop is not None:  # one forward drafts all k heads: a stop only shortens the pass's verify
            qd = q.gather(-1, torch.tensor(drafts, device=q.device)[:, None])[:, 0].tolist()
            n = next((i + 1 for i, x in enumerate(qd) if stop(x)), k)
            return drafts[:n], q[:n]
        return drafts, q

    # -- whole sequences (exactness tests, the seed's TVD check) ---------------------------------
    @torch.no_grad()
    def probs(self, idx, temperature):
        """(B, T) -> (B, T, V). Row j >= 1: head 1 on the hidden row at j-1 with char j, the law of
        the first draft when idx[:, :j+1] is committed. Row 0: a 1-char sequence has no hidden
        row before it (the loop then makes one plain target pass, no draft): the target's own
        distribution there."""
        hid = self._prefix_hidden(idx)                                         # (B, T, d)
        out = torch.empty(*idx.shape, self.vocab_size, device=idx.device)
        out[:, 1:] = self.head_probs(hid[:, :-1], idx[:, 1:], 1, temperature)[..., 0, :]
        out[:, 0] = probs_from_logits(self.frozen.head(hid[:, 0]), temperature)
        return out

    @torch.no_grad()
    def sample_chain(self, prefix, k, temperature, gen):
        """q_i from the heads on the target's hidden row at P-2 (full forward) with char P-1,
        d_i ~ q_i by torch.multinomial; q_i does not depend on d_1..d_{i-1}."""
        B, P = prefix.shape
        if P < 2:
            raise ValueError("heads draft after a prefix of at least 2 chars (the first char is a plain target pass)")
        hid = self._prefix_hidden(prefix)[:, -2]                               # (B, d)
        q = self.head_probs(hid, prefix[:, -1], k, temperature)                # (B, k, V)
        drafts = torch.multinomial(q.reshape(B * k, -1), 1, generator=gen).view(B, k)
        return drafts, q

    def describe(self):
        out = {**self.settings, "params": sum(p.numel() for p in self.heads.parameters()),
               "train_seconds": round(self.train_seconds, 1)}
        out.update({f"kl_head_{i}": round(v, 4) for i, v in enumerate(self.kl, start=1)})
        return out
