"""The `onnx` engine: the target's cached passes in ONNX Runtime, one session per pass shape.

Why this runtime: per op, ONNX Runtime's CPU kernels are called from C++ with no Python in
between, where eager PyTorch pays a dispatch from Python per op (docs/results.md, "Engines",
has the measured passes of each engine against the machine's bound).

The exported graph (`Step`) is the Transformer's forward, written so that the KV cache stays
outside it: inputs are the pass's ids (T,) and positions (T,), the cache's keys, stored
transposed (L, H, Dh, S), and values (L, H, S, Dh), and two additive masks: `cmask` (T, S) over
the cache's slots and `smask` (T, T) over the pass's own inputs (a query attends to the slots
its mask allows and to the inputs before it; a tree's mask says which). Outputs: the logits
(T, V), the hidden rows (T, d) and, per layer, the pass's new keys (H, Dh, T) and values
(H, T, Dh), which the runner then writes into its cache at the pass's slots. The scores over the
cache and over the new inputs are taken apart and softmaxed together, so the cache is never
copied into the graph. The math is the eager forward's (softmax over the same scores, in
another order of additions): logits agree to float32 rounding (tests/engine/runtimes/test_engines.py).

A batch of B > 1 sequences (src/engine/decoding/batch.py: chains only) runs the same graph with a batch
axis in front: ids and positions (B, T), each row at its own positions; the cache (L, B, H, Dh, S)
and (L, B, H, S, Dh), a row per sequence; `cmask` (B, T, S), row b's queries seeing only the
slots before row b's first position, in row b's cache; `smask` (T, T) shared; new keys and
values (B, H, Dh, T) and (B, H, T, Dh), written into each row's own slots. Nothing of one row
enters another's attention (tests/engine/decoding/test_batch.py: each row's logits equal its pass alone).

One graph per (B, T, S): chains and trees of one width share it (their masks are inputs). Graphs
are exported once per host and kept in `cache_dir`, named by a hash of the model's weights and
shape, B (where above 1), T and S, each sealed with its sha256 (src/engine/atomic.py: a graph that
fails it, overwritten or truncated, is deleted and exported again, said in one line, never loaded);
ONNX Runtime loads them in a session per shape, untimed (the trial's counter run and warm-ups), and
the seconds it took are kept in `compile_s`. A forward without a cache (full sequences) runs eager.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import math
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from ..atomic import atomic_path, seal, sealed, unseal
from ..errors import SpecsweepError
from ..locks import BUILD_WAIT_S, file_lock
from ..models.model import Transformer

log = logging.getLogger(__name__)

FORMAT = 1          # bump when Step's inputs, outputs or math change
NEG = -1e30         # an additive mask's "may not attend" (exp underflows to exactly 0)


@functools.lru_cache(maxsize=None)
def causal_mask(T: int) -> np.ndarray:
    """smask (T, T): a pass's inputs seeing each other causally, additive; built once per T (read-only:
    the bindings copy it into their buffers)."""
    m = np.where(np.tril(np.ones((T, T), dtype=bool)), 0.0, NEG).astype(np.float32)
    m.setflags(write=False)
    return m


class Step(nn.Module):
    """One cached pass of `model` as a function of explicit cache tensors (module docstring)."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.m = model
        d, H = model.cfg.d_model, model.cfg.n_head
        self.H, self.Dh = H, d // H
        scale = 1.0 / math.sqrt(self.Dh)
        self.wq, self.wk, self.wv = nn.ParameterList(), nn.ParameterList(), nn.ParameterList()
        for blk in model.blocks:  # q, k, v weights apart, transposed, q pre-scaled: fewer ops per pass
            W = blk.attn.qkv.weight.detach()
            self.wq.append(nn.Parameter((W[:d] * scale).t().contiguous(), requires_grad=False))
            self.wk.append(nn.Parameter(W[d:2 * d].t().contiguous(), requires_grad=False))
            self.wv.append(nn.Parameter(W[2 * d:].t().contiguous(), requires_grad=False))

    def forward(self, idx, pos, kcT, vc, cmask, smask):
        m, H, Dh = self.m, self.H, self.Dh
        lead, T, S = idx.shape[:-1], idx.shape[-1], vc.shape[-2]   # lead: () one sequence, (B,) a batch
        n = len(lead)   # dims named from the front: the exporter takes no negative permutation
        if lead:
            cmask = cmask.unsqueeze(1)                                     # (B, 1, T, S): shared by a row's heads
        x = m.tok_emb(idx) + m.pos_emb(pos)                                # (*lead, T, d)
        new = []
        for layer, blk in enumerate(m.blocks):
            h = blk.ln1(x)
            q = (h @ self.wq[layer]).reshape(*lead, T, H, Dh).transpose(n, n + 1)     # (*lead, H, T, Dh)
            kT = (h @ self.wk[layer]).reshape(*lead, T, H, Dh).permute(*range(n), n + 1, n + 2, n)  # (*lead, H, Dh, T)
            v = (h @ self.wv[layer]).reshape(*lead, T, H, Dh).transpose(n, n + 1)     # (*lead, H, T, Dh)
            scores = torch.cat([q @ kcT[layer] + cmask, q @ kT + smask], -1)  # (*lead, H, T, S + T)
            p_cache, p_new = torch.softmax(scores, -1).split([S, T], -1)
            y = (p_cache @ vc[layer] + p_new @ v).transpose(n, n + 1).reshape(*lead, T, H * Dh)
            x = x + blk.attn.proj(y)
            x = x + blk.mlp(blk.ln2(x))
            new += [kT, v]
        hidden = m.ln_f(x)
        return (m.head(hidden), hidden, *new)


def weights_key(model: Transformer) -> str:
    """A hash of the model's shape and weights: the exported graphs' name."""
    h = hashlib.sha256(repr((FORMAT, sorted(vars(model.cfg).items()))).encode())
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def export(model: Transformer, T: int, S: int, path: Path, B: int = 1) -> None:
    """Export Step for passes of T inputs over S slots into `path` (atomically); B > 1: a batch of
    B sequences (the batch axis in front of every input but `smask`)."""
    L, H, d = model.cfg.n_layer, model.cfg.n_head, model.cfg.d_model
    Dh = d // H
    lead = (B,) if B > 1 else ()
    args = (torch.zeros(*lead, T, dtype=torch.long), torch.arange(T).expand(*lead, T).contiguous(),
            torch.zeros(L, *lead, H, Dh, S), torch.zeros(L, *lead, H, S, Dh), torch.zeros(*lead, T, S),
            torch.zeros(T, T))
    names = ["idx", "pos", "kcT", "vc", "cmask", "smask"]
    outputs = ["logits", "hidden"] + [f"{kind}{layer}" for layer in range(L) for kind in ("k", "v")]
    # Step never reads the model's own KV cache, so the export leaves it as it is (a pass of the
    # eager model may be under way: the engine's fallback, or another runner of the model)
    with atomic_path(path) as tmp, torch.no_grad(), warnings.catch_warnings():
        # torch 2.13 calls the TorchScript exporter legacy; the torch.export one needs onnxscript and
        # rewrites this graph less directly: the legacy one is used on purpose, its warnings silenced
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        torch.onnx.export(Step(model).eval(), args, str(tmp), input_names=names, output_names=outputs, dynamo=False)


class OnnxModel:
    """A Transformer whose cached passes run in ONNX Runtime (module docstring)."""

    def __init__(self, model: Transformer, label: str, cache_dir: Path | None, strict: bool = True):
        import onnxruntime  # noqa: F401  (a missing runtime is said here, when the engine is chosen)
        self.model, self.label, self.strict = model, label, strict
        self.folder = Path(cache_dir or ".") / "onnx"
        self.key = weights_key(model)
        self.sessions: dict[tuple[int, int, int], object] = {}   # (B, T, S)
        self.bindings: dict[tuple[int, int, int], _Binding] = {}
        self.compile_s: dict[tuple, float] = {}
        self.fallback: str | None = None
        # the cache: (L, H, Dh, S) and (L, H, S, Dh) for one sequence, (L, B, H, Dh, S) and
        # (L, B, H, S, Dh) for a batch of B; None: no cache (eager)
        self.kT = self.v = None
        self.rows = 0                    # the cache's sequences (0: none)
        self.chain_masks: dict[tuple[int, int], tuple] = {}
        if model._cache_batch:   # a model that set its cache up already (a model draft does, once)
            self.setup_cache(model._cache_batch, model.cache_extra)

    def __getattr__(self, name):   # cfg, causal, n_params, ...
        return getattr(self.model, name)

    # -- the cache ----------------------------------------------------------------------------
    def setup_cache(self, batch: int = 1, extra: int = 0) -> None:
        self.model.setup_cache(batch, extra)   # the eager model's too: full forwards use it
        c = self.model.cfg
        S, H = c.block_size + extra, c.n_head
        lead = (c.n_layer,) if batch == 1 else (c.n_layer, batch)
        shape = (*lead, H, c.d_model // H, S)
        if self.kT is None or self.kT.shape != shape:
            self.kT = np.zeros(shape, dtype=np.float32)
            self.v = np.zeros((*lead, H, S, c.d_model // H), dtype=np.float32)
            self.chain_masks.clear()
            self.bindings.clear()   # they point at the old cache
        self.rows = batch

    def drop_cache(self) -> None:
        self.model.drop_cache()
        self.kT = self.v = None
        self.rows = 0

    @property
    def extra(self) -> int:
        return self.kT.shape[-1] - self.model.cfg.block_size

    @contextmanager
    def cache_set_aside(self):
        saved = (self.rows, self.extra) if self.kT is not None else None
        self.kT = self.v = None
        self.rows = 0
        with self.model.cache_set_aside():
            yield self
        if saved:
            self.setup_cache(*saved)

    def move_cache(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy slots src (n,) to dst (n,), in every sequence's row."""
        if self.kT is None:
            return self.model.move_cache(src, dst)
        s, d = src.cpu().numpy(), dst.cpu().numpy()
        self.kT[..., d] = self.kT[..., s]   # fancy indexing reads before it writes
        self.v[..., d, :] = self.v[..., s, :]

    def hand_cache_to_eager(self) -> None:
        """What the passes so far wrote, into the eager model's cache (it takes over)."""
        self.model.setup_cache(self.rows, self.extra)
        for layer, blk in enumerate(self.model.blocks):   # (H, Dh, S) or (B, H, Dh, S) -> (B, H, S, Dh)
            blk.attn.kv_cache.k[:] = torch.from_numpy(self.kT[layer]).transpose(-1, -2)
            blk.attn.kv_cache.v[:] = torch.from_numpy(self.v[layer])
        self.kT = self.v = None
        self.rows = 0

    # -- a pass -------------------------------------------------------------------------------
    def session(self, T: int, S: int, B: int = 1):
        key = (B, T, S)
        sess = self.sessions.get(key)
        if sess is None:
            import onnxruntime as ort
            t0 = time.perf_counter()
            path = self.folder / (f"{self.key}-T{T}-S{S}.onnx" if B == 1 else f"{self.key}-B{B}-T{T}-S{S}.onnx")
            if not sealed(path):
                path.parent.mkdir(parents=True, exist_ok=True)
                with file_lock(str(path) + ".lock", f"the ONNX graph {path.name}", BUILD_WAIT_S):
                    if not sealed(path):
                        if path.exists():   # overwritten, truncated, or without its checksum: never used
                            log.warning("%s: the ONNX graph %s fails its checksum (corrupt or partial): "
                                        "deleted and exported again", self.label, path.name)
                            unseal(path)
                        export(self.model, T, S, path, B)
                        seal(path)
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = torch.get_num_threads()
            opts.inter_op_num_threads = 1
            opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            opts.log_severity_level = 3
            sess = self.sessions[key] = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
            self.compile_s[((B, T), S)] = time.perf_counter() - t0
            log.info("%s: ONNX graph for passes of %d x %d ready in %.1f s", self.label, B, T, self.compile_s[((B, T), S)])
        return sess

    def masks(self, mask: torch.Tensor | None, pos: np.ndarray, slots: np.ndarray, S: int):
        """(cmask (T, S), smask (T, T)) additive: the cache's slots a query may see (its mask, the
        pass's own slots left out: they hold stale values until written) and the inputs it may see."""
        T = len(pos)
        if mask is None:  # a chain: every slot before its first position, and its inputs causally
            key = (int(pos[0]), T)
            hit = self.chain_masks.get(key)
            if hit is None:
                cmask = np.full((T, S), NEG, dtype=np.float32)
                cmask[:, :pos[0]] = 0.0
                hit = self.chain_masks[key] = (cmask, causal_mask(T))
            return hit
        allowed = mask.cpu().numpy()
        own = allowed[:, slots]
        rest = allowed.copy()
        rest[:, slots] = False
        return (np.where(rest, 0.0, NEG).astype(np.float32), np.where(own, 0.0, NEG).astype(np.float32))

    def batch_masks(self, pos: np.ndarray, S: int):
        """A batch's chain pass (positions (B, T)): cmask (B, 1, S), row b's queries seeing the
        slots before its first position (broadcast over T into the bound buffer), and smask (T, T),
        its inputs causally."""
        cmask = np.where(np.arange(S)[None, None, :] < pos[:, :1, None], 0.0, NEG).astype(np.float32)
        return cmask, causal_mask(pos.shape[1])

    def __call__(self, idx, input_pos=None, slots=None, mask=None, *, return_hidden: bool = False):
        B = idx.shape[0]
        if input_pos is None or self.kT is None or self.fallback:
            return self.model(idx, input_pos, slots, mask, return_hidden=return_hidden)
        if B != self.rows:
            raise ValueError(f"a pass of {B} sequences over a cache of {self.rows}")
        if B > 1 and (slots is not None or mask is not None):
            raise ValueError("the onnx engine runs a batch's chains only (no slots, no tree mask)")
        T, S = idx.shape[1], self.kT.shape[-1]
        try:
            sess = self.session(T, S, B)
        except Exception as e:  # a model the exporter cannot take (quantized ops) runs eager, but never the target
            reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
            if self.strict:
                raise SpecsweepError(f"engine=onnx cannot run the {self.label} ({reason}): refused rather than "
                                     "run eager under the onnx engine's name") from None
            self.fallback = reason
            log.warning("%s: no ONNX graph, running eager instead (%s)", self.label, self.fallback)
            self.hand_cache_to_eager()
            return self.model(idx, input_pos, slots, mask, return_hidden=return_hidden)
        pos = input_pos.cpu().numpy()
        b = self.bindings.get((B, T, S))
        if b is None:
            b = self.bindings[(B, T, S)] = _Binding(sess, self.kT, self.v, B, T, self.model.cfg)
        if B == 1:
            at = pos if slots is None else slots.cpu().numpy()
            cmask, smask = self.masks(mask, pos, at, S)
            out = b.run(idx[0].cpu().numpy(), pos, cmask, smask)
            for layer, (k, v) in enumerate(out[2]):   # the pass's keys and values into its slots
                self.kT[layer][:, :, at] = k
                self.v[layer][:, at] = v
        else:
            pos = np.broadcast_to(pos, (B, T))        # positions shared (T,) or per sequence (B, T)
            out = b.run(idx.cpu().numpy(), pos, *self.batch_masks(pos, S))
            rows = np.arange(B)[:, None]
            for layer, (k, v) in enumerate(out[2]):   # row b's keys and values into row b's slots: (B, T, H, Dh)
                self.kT[layer][rows, :, :, pos] = k.transpose(0, 3, 1, 2)
                self.v[layer][rows, :, pos] = v.transpose(0, 2, 1, 3)
        # copies: the next pass of this shape overwrites the bound output buffers
        logits = torch.from_numpy(out[0].copy()).reshape(B, T, -1)                    # (B, T, V)
        return (logits, torch.from_numpy(out[1].copy()).reshape(B, T, -1)) if return_hidden else logits

    def to(self, device):
        if str(device) != "cpu":
            raise ValueError("the onnx engine runs on the CPU (device=cpu)")
        return self


class _Binding:
    """A session's inputs and outputs bound once to numpy buffers (ONNX Runtime's IO binding):
    the cache arrays by reference (the runner writes them in place), the pass's small inputs
    copied into their buffers each call, the outputs written by the runtime into theirs."""

    def __init__(self, sess, kT: np.ndarray, v: np.ndarray, B: int, T: int, cfg):
        self.sess, self.io = sess, sess.io_binding()
        S, lead = kT.shape[-1], ((B,) if B > 1 else ())
        self.inputs = {"idx": np.zeros((*lead, T), dtype=np.int64), "pos": np.zeros((*lead, T), dtype=np.int64),
                       "cmask": np.zeros((*lead, T, S), dtype=np.float32), "smask": np.zeros((T, T), dtype=np.float32)}
        for name, a in {**self.inputs, "kcT": kT, "vc": v}.items():
            self._bind_input(name, a)
        H, Dh = cfg.n_head, cfg.d_model // cfg.n_head
        self.logits = np.zeros((*lead, T, cfg.vocab_size), dtype=np.float32)
        self.hidden = np.zeros((*lead, T, cfg.d_model), dtype=np.float32)
        self.new = [(np.zeros((*lead, H, Dh, T), dtype=np.float32), np.zeros((*lead, H, T, Dh), dtype=np.float32))
                    for _ in range(cfg.n_layer)]
        for name, a in [("logits", self.logits), ("hidden", self.hidden)] + \
                [(f"{kind}{layer}", arr) for layer, pair in enumerate(self.new) for kind, arr in zip("kv", pair)]:
            self.io.bind_output(name, "cpu", 0, np.float32, list(a.shape), a.ctypes.data)

    def _bind_input(self, name: str, a: np.ndarray) -> None:
        self.io.bind_input(name, "cpu", 0, a.dtype, list(a.shape), a.ctypes.data)

    def run(self, idx, pos, cmask, smask):
        np.copyto(self.inputs["idx"], idx)
        np.copyto(self.inputs["pos"], pos)
        np.copyto(self.inputs["cmask"], cmask)      # a batch's (B, 1, S) broadcast over T
        np.copyto(self.inputs["smask"], smask)
        self.sess.run_with_iobinding(self.io)
        return self.logits, self.hidden, self.new

