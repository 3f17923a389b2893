"""Engines: what runs the target's (and a model draft's) forward pass over its KV cache.

The loops (decode.py, tree.py, measure.py) call a target as `target(idx, input_pos, slots,
mask, return_hidden=...)` and use `cfg`, `causal`, `setup_cache`, `move_cache` and
`cache_set_aside`; an engine's `wrap(model)` returns an object with that same interface, so the
loops, the baseline and the speculative arm run on it unchanged, and both arms of a trial always
run on the same engine.

- `eager`: the Transformer itself (PyTorch eager: one dispatch per op).
- `onnx`: ONNX Runtime, one session per pass width, the KV cache outside the graph
  (src/engine/runtimes/onnx_engine.py).
- `compiled`: `torch.compile` of the cached forward with static shapes (dynamic=False): one
  graph per pass shape (batch and width, positions shared or per sequence, per tree mask shape,
  per return_hidden), as gpt-fast compiles its decode step; the first call of each shape
  compiles it, which the trial's untimed runs do
  (its counter run, each timing's warm-up), and its seconds are kept in `compile_s`. Forwards
  without a cache (training, full-sequence scoring) stay eager. Inductor's own on-disk cache,
  put in `cache_dir`, keeps the compiled code per host across processes: a sweep compiles each
  graph once (keyed by the graph, its weights and shapes: target, draft, width). Inductor loads
  that code without checking it, so each shape's first compiled pass is checked against the
  eager forward on the same input (`disagreement`, at most AGREEMENT): a tampered or wrong
  cached file is refused for the target and never used for a draft. A draft's model whose graph
  cannot be compiled (or disagrees) falls back to eager, said in `fallbacks`; the target's is
  refused (strict). A model from a folder (model=hf) is compiled through its own
  `compile_pass`: transformers' forward over a StaticCache, on a twin that shares its weights
  (src/engine/huggingface/folder_model.py).

- `transformers`: Hugging Face transformers' own `generate` runs both arms (src/engine/huggingface/library_loop.py,
  src/trial/library_trial.py); `wrap` leaves the tool's model eager (the exactness check and the
  conversion read it).

A model draft's own model runs on the trial's engine too (`wrap_draft`).
"""
from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from ..errors import SpecsweepError
from ..models.model import Transformer

log = logging.getLogger(__name__)

ENGINES = ("eager", "compiled", "onnx", "transformers")


class Engine:
    """An engine by name with its options (conf/engine/NAME.yaml)."""

    def __init__(self, name: str, mode: str | None = None, options: dict | None = None,
                 cache_dir: str | Path | None = None):
        if name not in ENGINES:
            raise ValueError(f"unknown engine {name!r} ({', '.join(ENGINES)})")
        self.name, self.mode, self.options = name, mode, dict(options or {})
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.runners: list = []   # CompiledModel or OnnxModel, one per wrapped model

    def wrap(self, model: Transformer, label: str = "target", strict: bool = True):
        """The model as this engine runs it (eager, transformers: the model itself). strict (the
        target): a pass the engine cannot run raises SpecsweepError rather than running eager, so no
        trial is recorded under an engine that did not run its target; not strict (a model draft's
        model): it runs eager, said in `fallback` and logged as info.engine_fallback.<label>."""
        if self.name in ("eager", "transformers"):
            return model
        if self.name == "onnx":
            from .onnx_engine import OnnxModel
            runner = OnnxModel(model, label, self.cache_dir, strict)
        else:
            runner = CompiledModel(model, label, self.mode, self.options, self.cache_dir, strict)
        self.runners.append(runner)
        return runner

    def wrap_draft(self, draft) -> None:
        """Run a model draft's own model (ModelDraft.model) on this engine, in place."""
        inner = getattr(draft, "model", None)
        runs_here = isinstance(inner, Transformer) or hasattr(inner, "compile_pass")   # the tool's, or a folder's
        if self.name not in ("eager", "transformers") and runs_here:
            draft.model = self.wrap(inner, f"draft {draft.name}", strict=False)

    def compile_report(self) -> dict:
        """label -> {"graphs": n, "compile_s": total seconds, "fallback": reason or ""}."""
        return {r.label: {"graphs": len(r.compile_s), "compile_s": sum(r.compile_s.values()),
                          "fallback": r.fallback or ""} for r in self.runners}


@contextmanager
def inductor_cache(cache_dir: Path | None):
    """Inductor's on-disk cache in `cache_dir` while compiling (its default is the temp folder)."""
    if cache_dir is None:
        yield
        return
    cache_dir.mkdir(parents=True, exist_ok=True)
    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = old


def _raise_dynamo_limits() -> None:
    import torch._dynamo
    cfg = torch._dynamo.config
    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                 "accumulated_recompile_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 256))  # one graph per width: many, by design


AGREEMENT = 1e-3   # the most a compiled pass's probabilities may differ from eager's (float32 reorderings: ~1e-7)


class CompiledDisagrees(Exception):
    """A compiled pass whose output is not the eager forward's."""


def disagreement(out, reference) -> float:
    """max |p - p_eager| over the pass's next-char distributions (logits first where a pair is returned)."""
    logits, ref = (out[0], reference[0]) if isinstance(out, tuple) else (out, reference)
    return (torch.softmax(logits.float(), -1) - torch.softmax(ref.float(), -1)).abs().max().item()


class CompiledModel:
    """A Transformer whose cached forward runs through torch.compile, one graph per shape."""

    def __init__(self, model: Transformer, label: str, mode: str | None, options: dict, cache_dir: Path | None,
                 strict: bool = True):
        _raise_dynamo_limits()
        self.model, self.label, self.cache_dir, self.strict = model, label, cache_dir, strict
        if hasattr(model, "compile_pass"):   # a model from a folder (folder_model.HFModel): a twin over a static cache
            self.model = model.with_static_cache()
            self.compiled = self.model.compile_pass(mode, options)
        else:
            self.compiled = torch.compile(model, dynamic=False, fullgraph=True, mode=mode, options=options or None)
        self.compile_s: dict[tuple, float] = {}
        self.fallback: str | None = None

    def __getattr__(self, name):   # cfg, causal, setup_cache, move_cache, cache_set_aside, n_params, ...
        return getattr(self.model, name)

    def __call__(self, idx, input_pos=None, slots=None, mask=None, *, return_hidden: bool = False):
        if input_pos is None or self.model._cache_batch != idx.shape[0] or self.fallback:
            return self.model(idx, input_pos, slots, mask, return_hidden=return_hidden)
        # a graph per shape: (B, width), positions shared (T,) or per sequence (B, T), tree mask or none
        key = (tuple(idx.shape), input_pos.dim(), slots is None, None if mask is None else tuple(mask.shape),
               return_hidden)
        if key in self.compile_s:
            return self.compiled(idx, input_pos, slots, mask, return_hidden=return_hidden)
        # the eager pass first, as the reference the compiled code must agree with (Inductor loads its
        # cached code unverified: a tampered file would otherwise run); the compiled pass then writes
        # the same cache slots again
        reference = self.model(idx, input_pos, slots, mask, return_hidden=return_hidden)
        t0 = time.perf_counter()
        try:
            with inductor_cache(self.cache_dir):
                out = self.compiled(idx, input_pos, slots, mask, return_hidden=return_hidden)
            gap = disagreement(out, reference)
            if gap > AGREEMENT:
                raise CompiledDisagrees(f"its pass of width {idx.shape[1]} disagrees with eager (max |p - p_eager| = "
                                        f"{gap:.3g} > {AGREEMENT}): the compiled code, or Inductor's cache in "
                                        f"{self.cache_dir or 'the temp folder'}, is wrong; delete that folder to recompile")
        except Exception as e:  # a model whose graph does not compile (quantized ops) runs eager, but never the target
            reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
            if self.strict and isinstance(e, CompiledDisagrees):
                raise SpecsweepError(f"engine=compiled: the {self.label}'s {e}") from None
            if self.strict:
                raise SpecsweepError(f"engine=compiled cannot run the {self.label} ({reason}): refused rather "
                                     "than run eager under the compiled engine's name") from None
            self.fallback = reason
            log.warning("%s: torch.compile failed, running eager instead (%s)", self.label, self.fallback)
            return self.model(idx, input_pos, slots, mask, return_hidden=return_hidden)
        self.compile_s[key] = time.perf_counter() - t0
        log.info("%s: compiled the pass of width %d in %.1f s", self.label, idx.shape[1], self.compile_s[key])
        return out

    def to(self, device):
        self.model.to(device)
        return self
