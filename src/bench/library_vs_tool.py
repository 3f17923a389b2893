"""The two loops taken apart in the same run (printed, never asserted):
`make bench ARGS="+bench=library draft=int8 k=4"`.

For the config's model draft (an assistant in transformers' loop: int8, int4, small_model) and k,
every component of the tool's eager loop and of transformers' loop is timed in the same
interleaved rounds (`interleaved_rounds`, `timing.cost_reps` calls a block, 7 rounds), so the
machine's speed cancels between the rows:

- the one-char pass, and the verify pass of every width 2..k+1 (also as a multiple of the one-char
  pass): the tool's eager forward over its KV cache; the converted GPT2LMHeadModel over a
  DynamicCache, cropped back after each call;
- the draft per drafted char: one k-char proposal over k (the tool's `propose`; the assistant's own
  `generate` of k tokens over its cache);
- the plain loop's step per char (a whole baseline run of n_chars, one a round, over n_chars) and
  its overhead: that step less the one-char pass (sampling, and in transformers the framework's
  per-token work: logits processors, stopping criteria, the growing ids);
- the speculative loop per pass (one whole run a round, over its target passes, counted untimed
  first) and its overhead: that less the verify pass of width k+1 and the pass's drafted chars
  (the run's drafted chars over its passes) at the draft's time per char.
"""
from __future__ import annotations

import statistics

import torch

from ..engine.decoding.decode import generate_baseline, generate_speculative, prefill
from ..engine.huggingface.library_loop import LibraryLoop, assistant_proposal, cached_passes
from ..engine.measuring.measure import proposal
from ..engine.measuring.timing import interleaved_rounds
from ..trial.load import build_draft
from ..trial.spec import trial_spec


def tool_blocks(model, draft, prompt: list[int], k: int, n: int, T: float, seed: int, reps: int) -> tuple[dict, tuple]:
    """The tool's eager loop's blocks, and its speculative run's (target passes, drafted chars)."""
    P = len(prompt)
    gen = torch.Generator().manual_seed(seed)
    g = generate_speculative(model, draft, prompt, n, k, T, torch.Generator().manual_seed(seed))
    positions = prefill(model, prompt)

    def width(w):
        x = torch.tensor([prompt[-1:] * w])
        return lambda: model(x, positions[P - 1:P - 1 + w])
    draft.reset()
    blocks = {("tool", f"pass {w}"): (width(w), reps) for w in range(1, k + 2)}
    blocks[("tool", "draft")] = (proposal(draft, prompt, k, T, gen), max(1, reps // k))
    blocks[("tool", "plain run")] = (lambda: generate_baseline(model, prompt, n, T, torch.Generator().manual_seed(seed)), 1)
    blocks[("tool", "speculative run")] = (lambda: generate_speculative(
        model, draft, prompt, n, k, T, torch.Generator().manual_seed(seed), track_overlap=False), 1)
    return blocks, (g.target_passes, g.proposed)


def library_blocks(loop: LibraryLoop, prompt: list[int], k: int, n: int, seed: int, reps: int) -> tuple[dict, tuple]:
    """transformers' loop's blocks, and its speculative run's (target passes, drafted chars)."""
    g = loop.counted(loop.speculative, prompt, n, seed)
    pass_of = cached_passes(loop.target, prompt, k + 1)
    blocks = {("transformers", f"pass {w}"): (pass_of(w), reps) for w in range(1, k + 2)}
    propose = assistant_proposal(loop, prompt, k)
    blocks[("transformers", "draft")] = (propose, max(1, reps // k))
    blocks[("transformers", "plain run")] = (lambda: loop.baseline(prompt, n, seed), 1)
    blocks[("transformers", "speculative run")] = (lambda: loop.speculative(prompt, n, seed), 1)
    return blocks, (g.target_passes, g.proposed)


def log_tables(log, cfg, target, corpus) -> None:
    spec = trial_spec(cfg)
    torch.set_num_threads(spec.threads)
    draft = build_draft(spec.draft, spec.target, target, corpus)   # a model draft: bench.main checked it
    k, n, T, seed, reps = spec.k, spec.n_chars, spec.temperature, spec.seed, spec.timing.cost_reps
    prompt = target.tokenizer.encode(spec.prompt).tolist()
    model = target.model
    loop = LibraryLoop(model, k, T, assistant=draft.model)
    blocks, passes = {}, {}
    b, passes["tool"] = tool_blocks(model, draft, prompt, k, n, T, seed, reps)
    blocks |= b
    b, passes["transformers"] = library_blocks(loop, prompt, k, n, seed, reps)
    blocks |= b
    with torch.no_grad():   # as every loop runs its passes
        per_call = interleaved_rounds(blocks, rounds=7, device=spec.device)
    t = {key: statistics.median(v) * 1e6 for key, v in per_call.items()}      # us per call
    log.info("the two loops taken apart, draft %s, k = %d, n_chars = %d, T = %s, in the same 7 interleaved rounds "
             "(us, medians over rounds):", spec.draft.name, k, n, T)
    log.info("| loop | one-char pass | %s | draft / char | plain step / char | plain overhead / char | "
             "speculative pass | its overhead / pass | target passes |", " | ".join(f"verify {w}" for w in range(2, k + 2)))
    log.info("|---|---|%s---|---|---|---|---|---|", "---|" * k)
    for name in ("tool", "transformers"):
        t1 = t[(name, "pass 1")]
        verify = " | ".join(f"{t[(name, f'pass {w}')]:.0f} ({t[(name, f'pass {w}')] / t1:.2f})" for w in range(2, k + 2))
        draft_char = t[(name, "draft")] / k
        plain = t[(name, "plain run")] / n
        n_passes, drafted = passes[name]
        spec_pass = t[(name, "speculative run")] / n_passes
        overhead = spec_pass - t[(name, f"pass {k + 1}")] - drafted / n_passes * draft_char
        log.info("| %s | %.0f | %s | %.0f | %.0f | %.0f | %.0f | %.0f | %d |", name, t1, verify, draft_char, plain,
                 plain - t1, spec_pass, overhead, n_passes)
    loop.close()
