"""The library's loop: Hugging Face transformers' own `generate` runs both arms of a trial.

A model from a folder (model=hf, src/engine/huggingface/folder_model.py: an `HFModel`) is already a transformers
causal LM: `as_transformers` hands its own model to the loop, with a generation config of nothing
of its own (the checkpoint's own config is put back by `close`), so both arms sample the full
distribution for exactly n tokens, whatever the checkpoint's EOS, top-k or penalties say.

`LibraryLoop` runs the two arms as a transformers user does:

- the baseline: `generate(ids, do_sample=True, top_k=0, top_p=1.0, temperature=T, max_new_tokens=n)`
  (greedy, `do_sample=False`, at T = 0);
- a model draft: the same call with `assistant_model=` the converted draft. transformers reads the
  draft length and the stop threshold from the ASSISTANT's generation config, where they persist
  across calls, so they are set there before every call: `num_assistant_tokens=k`,
  `num_assistant_tokens_schedule` "constant" (policy=fixed) or "heuristic" (policy=heuristic: +2
  after a pass that kept every draft, -1 otherwise), `assistant_confidence_threshold` 0 (off) or the
  policy's threshold (policy=confidence; transformers refits it from a ROC curve only where
  scikit-learn is installed, which requirements.txt does not install);
- prompt lookup (draft=prompt_lookup): `prompt_lookup_num_tokens=k`, `max_matching_ngram_size` the
  draft's option; transformers verifies it by sampling the target at every drafted position and
  keeping the drafts up to the first mismatch.

transformers samples from torch's global generator, so each run seeds it (`torch.manual_seed`):
the same seed gives the same chars and counters. `PassCounter` reads the counters from inside the
library: a forward pre-hook on the target records each pass's cache length and width, from which
the drafted and kept chars of every pass follow (`passes_log`), and one on the assistant counts its
forwards.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from .checkpoint import WINDOW_KEYS, generation_defaults, offline_transformers, to_transformers
from .folder_model import rewind

log = logging.getLogger(__name__)


def as_transformers(model):
    """(a transformers causal LM computing `model`'s logits, the generation config to restore on
    close or None): the tool's Transformer converted (a copy), a model from a folder's own."""
    hf = getattr(model, "hf", None)   # a model from a folder (folder_model.HFModel) holds its transformers model
    if hf is not None:
        saved = hf.generation_config
        hf.generation_config = generation_defaults(offline_transformers().GenerationConfig())
        return hf, saved
    return to_transformers(model), None


def context_length(hf) -> int:
    """The positions a transformers model was built for (its text config's window)."""
    c = hf.config.get_text_config(decoder=True)
    return next(getattr(c, key) for key in WINDOW_KEYS if isinstance(getattr(c, key, None), int))


@dataclass
class PassCounter:
    """Counters read from inside transformers' loop, through forward pre-hooks.

    Per target forward: the cache's length before it (`starts`) and its width (`widths`). The first
    forward of a run caches the prompt with it; every later one feeds [the last emitted char, the
    drafts]. So pass r drafted widths[r] - 1 chars (the first: widths[0] - P), and kept
    starts[r+1] - (starts[r] + widths[r] - drafted[r]) of them (the last pass: up to the run's end)."""
    target_widths: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    assistant_forwards: int = 0
    assistant_widths: list[int] = field(default_factory=list)

    def reset(self):
        self.target_widths.clear()
        self.starts.clear()
        self.assistant_forwards = 0
        self.assistant_widths.clear()

    def target_hook(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        cache = kwargs.get("past_key_values")
        self.starts.append(int(cache.get_seq_length()) if cache is not None else 0)
        self.target_widths.append(int(ids.shape[1]))

    def assistant_hook(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.assistant_forwards += 1
        self.assistant_widths.append(int(ids.shape[1]))

    def passes(self, prompt_len: int, total_len: int) -> list[tuple[int, int]]:
        """(chars drafted, chars kept) per target pass of a run that ended at total_len tokens."""
        out = []
        for r, (s, w) in enumerate(zip(self.starts, self.target_widths)):
            drafted = w - prompt_len if r == 0 else w - 1
            committed = s + w - drafted                     # tokens committed before this pass's drafts
            nxt = self.starts[r + 1] if r + 1 < len(self.starts) else total_len - 1
            out.append((drafted, nxt - committed))
        return out


def hook(model, fn):
    return model.register_forward_pre_hook(fn, with_kwargs=True)


def passes_generation(tokens: list[int], log: list[tuple[int, int]], k: int):
    """A decode.Generation from a library run's per-pass (drafted, kept) log."""
    from ..decoding.decode import Generation
    g = Generation(tokens, target_passes=len(log), chars_emitted=len(tokens),
                   accepted_at=[sum(kept > i for _, kept in log) for i in range(k)],
                   drafted_at=[sum(d > i for d, _ in log) for i in range(k)], passes_log=list(log))
    g.draft_calls = sum(d > 0 for d, _ in log)
    g.proposed = sum(d for d, _ in log)
    g.accepted = sum(kept for _, kept in log)
    g.tested = sum(min(kept + 1, d) for d, kept in log)   # positions whose test ran: up to the first rejection
    return g


class LibraryLoop:
    """Both arms of a trial through transformers' `generate`, on converted copies of the tool's models
    or a model from a folder's own.

    target: the tool's Transformer or an HFModel. assistant: a draft's model (model drafts; either
    kind), or None with lookup_ngram set (prompt lookup, `max_matching_ngram_size`). schedule: "constant" (a fixed k),
    "heuristic" (transformers' schedule, starting at k) or "confidence" (k drafts at most, stopped
    where the assistant's probability of its char falls below `threshold`)."""

    def __init__(self, target, k: int, temperature: float, assistant=None,
                 lookup_ngram: int | None = None, schedule: str = "constant", threshold: float = 0.0):
        if (assistant is None) == (lookup_ngram is None):
            raise ValueError("LibraryLoop needs an assistant model or prompt lookup, not both")
        if schedule not in ("constant", "heuristic", "confidence"):
            raise ValueError(f"unknown schedule {schedule!r}")
        if lookup_ngram is not None and schedule != "constant":
            raise ValueError("prompt lookup drafts a fixed k (no schedule)")
        self.k, self.temperature, self.schedule, self.threshold = k, temperature, schedule, threshold
        self.target, saved = as_transformers(target)
        self.restore = [(self.target, saved)]
        self.assistant = None
        if assistant is not None:
            self.assistant, saved = as_transformers(assistant)
            self.restore.append((self.assistant, saved))
        self.lookup_ngram = lookup_ngram
        self.counter = PassCounter()
        self.hooks = [hook(self.target, self.counter.target_hook)]
        if self.assistant is not None:
            self.hooks.append(hook(self.assistant, self.counter.assistant_hook))
        self.device = self.target.device

    def sampling(self) -> dict:
        """generate's sampling keywords, as the tool samples: the full distribution at T, greedy at 0."""
        if self.temperature == 0:
            return {"do_sample": False}
        return {"do_sample": True, "temperature": self.temperature, "top_k": 0, "top_p": 1.0}

    def configure_assistant(self) -> None:
        """Set the draft length and stop rule where transformers reads them: the assistant's own
        generation config (they persist across calls, and the heuristic schedule writes its last
        length back, so every run sets them again)."""
        gc = self.assistant.generation_config
        gc.num_assistant_tokens = self.k
        gc.num_assistant_tokens_schedule = "heuristic" if self.schedule == "heuristic" else "constant"
        gc.assistant_confidence_threshold = self.threshold if self.schedule == "confidence" else 0.0

    def draft_kwargs(self) -> dict:
        if self.assistant is not None:
            self.configure_assistant()
            return {"assistant_model": self.assistant}
        return {"prompt_lookup_num_tokens": self.k, "max_matching_ngram_size": self.lookup_ngram}

    def _ids(self, prompt: list[int]) -> torch.Tensor:
        return torch.tensor([prompt], device=self.device)

    @torch.no_grad()
    def baseline(self, prompt: list[int], n: int, seed: int) -> list[int]:
        torch.manual_seed(seed)
        out = self.target.generate(self._ids(prompt), max_new_tokens=n, **self.sampling())
        return out[0, len(prompt):].tolist()

    @torch.no_grad()
    def speculative(self, prompt: list[int], n: int, seed: int) -> list[int]:
        torch.manual_seed(seed)
        out = self.target.generate(self._ids(prompt), max_new_tokens=n, **self.sampling(), **self.draft_kwargs())
        return out[0, len(prompt):].tolist()

    def counted(self, run, prompt: list[int], n: int, seed: int):
        """Run `run` (baseline or speculative) once with the pass counter on: a decode.Generation."""
        self.counter.reset()
        tokens = run(prompt, n, seed)
        g = passes_generation(tokens, self.counter.passes(len(prompt), len(prompt) + len(tokens)), self.k)
        g.assistant_forwards = self.counter.assistant_forwards
        return g

    def close(self) -> None:
        """Remove the counters' hooks and give a model from a folder its own generation config back."""
        for h in self.hooks:
            h.remove()
        self.hooks = []
        for hf, saved in self.restore:
            if saved is not None:
                hf.generation_config = saved
        self.restore = []


def cached_passes(hf, prompt: list[int], widest: int):
    """width -> a call of one pass of `hf` (a transformers causal LM) over `width` tokens after a
    DynamicCache of the prompt less its last token, the cache cropped back after it, as the
    library's loop crops after every pass (the token values past the prompt do not matter)."""
    from transformers import DynamicCache
    P = len(prompt)
    ids = torch.tensor([prompt + prompt[-1:] * widest], device=hf.device)
    cache = DynamicCache(config=hf.config)
    with torch.no_grad():
        hf(input_ids=ids[:, :P - 1], past_key_values=cache, use_cache=True)

    def pass_of(width: int):
        @torch.no_grad()
        def run():
            out = hf(input_ids=ids[:, P - 1:P - 1 + width], past_key_values=cache, use_cache=True)
            rewind(cache, P - 1)
            return out.logits
        return run
    return pass_of


def assistant_proposal(loop: LibraryLoop, prompt: list[int], k: int):
    """A call of one k-char proposal as transformers' loop makes it: the assistant's own `generate` of
    k tokens after the prompt and one more char, over its DynamicCache of the prompt (cropped back to
    it first, as the candidate generator crops after every pass), under the loop's settings."""
    from transformers import DynamicCache
    P = len(prompt)
    loop.configure_assistant()
    ids = torch.tensor([prompt + prompt[-1:]], device=loop.device)
    cache = DynamicCache(config=loop.assistant.config)
    with torch.no_grad():
        loop.assistant(input_ids=ids[:, :P], past_key_values=cache, use_cache=True)
    sampling = loop.sampling()

    @torch.no_grad()
    def propose():
        rewind(cache, P)
        loop.assistant.generate(ids, past_key_values=cache, max_new_tokens=k, min_new_tokens=k,
                                return_dict_in_generate=True, output_scores=True, **sampling)
    return propose


@torch.no_grad()
def library_cost(loop: LibraryLoop, prompt: list[int], k: int, reps: int, rounds: int, device: str,
                 base_run=None, drafted: dict[int, float] | None = None, width: float | None = None,
                 level: float = 0.95, max_rounds: int | None = None, max_seconds: float | None = None,
                 keep_rounds: bool = False) -> dict:
    """The library's component times, in the rounds of measure.component_times (same statistics and
    names as measure_cost): `target` one 1-char pass of the converted target over a DynamicCache of
    the prompt (the cache cropped back after it, as the loop crops after every pass), `verify` a
    (k+1)-char pass (with `drafted`: one pass per width j+1 drafted, mixed by the shares), `draft` one
    k-char proposal as the loop makes it (the assistant's own `generate` of k chars over its cache of
    the prompt; prompt lookup's candidate search over the prompt), and, with base_run = (run, chars),
    the library's plain-sampling loop (`base_pass_us`: its time per generated char, every step's
    pass and framework work). keep_rounds: as in measure.component_times."""
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator
    from ..measuring.measure import component_times
    ids = torch.tensor([prompt], device=device)
    target_pass = cached_passes(loop.target, prompt, k + 1)
    blocks = {"target": (target_pass(1), reps)}
    if drafted:
        blocks |= {f"verify {j + 1}": (target_pass(j + 1), reps) for j in drafted}
    else:
        blocks["verify"] = (target_pass(k + 1), reps)
    if loop.assistant is not None:
        propose = assistant_proposal(loop, prompt, k)
    else:
        lookup = PromptLookupCandidateGenerator(num_output_tokens=k, max_matching_ngram_size=loop.lookup_ngram,
                                                max_length=context_length(loop.target))

        def propose():
            lookup.get_candidates(ids)
    blocks["draft"] = (propose, max(1, reps // k))
    loops = {"base": base_run} if base_run is not None else {}
    out = component_times(blocks, k, loops, rounds, width, level, max_rounds, max_seconds, device, drafted,
                          keep_rounds)
    loop.counter.reset()
    return out
