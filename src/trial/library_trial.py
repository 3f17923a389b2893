"""One cell through transformers' own loop (engine=transformers): counters, costs and paired timing.

Both arms run `generate` on converted copies of the trial's target and draft (src/engine/huggingface/library_loop.py):
the baseline is plain sampling, the speculative arm assisted generation (a model draft as
`assistant_model`) or prompt lookup (draft=prompt_lookup). The metrics carry the same names as the
tool's loop's (src/trial/trial.py: sequence_measurements), so the analysis reads both; where the
library's loop differs it says so in its own names: `assistant_forwards`, `library_baseline_passes`.
"""
from __future__ import annotations

from collections import Counter

from ..engine.decoding.decode import pooled
from ..engine.measuring.formula import seed_speedup
from ..engine.huggingface.library_loop import LibraryLoop, library_cost
from ..engine.measuring.timing import paired_workload_timing
from .spec import TrialSpec
from .workload import Prompt

# the tool's policy -> transformers' schedule of the assistant's generation config
SCHEDULES = {"fixed": "constant", "heuristic": "heuristic", "confidence": "confidence"}


def library_loop(spec: TrialSpec, target_model, draft) -> LibraryLoop:
    """The trial's LibraryLoop: its draft as an assistant model or as prompt lookup, its policy as
    transformers' schedule (the spec has refused every other combination before any work)."""
    policy = spec.policy
    threshold = policy.options.get("threshold", 0.0) if policy.name == "confidence" else 0.0
    schedule = SCHEDULES[policy.name]
    if draft.library == "assistant":
        return LibraryLoop(target_model, spec.k, spec.temperature, assistant=draft.model, schedule=schedule,
                           threshold=threshold)
    return LibraryLoop(target_model, spec.k, spec.temperature, lookup_ngram=draft.max_matching_ngram_size)


def library_measurements(spec: TrialSpec, target_model, draft, prompts: list[Prompt], ids: list[list[int]], timed_phase):
    """The workload's prompts one at a time through the library's loop: each prompt's counters
    (pooled), the library's component costs on the first prompt, and the paired timing over the
    workload. Returns (metrics, PairedTiming, each prompt's counter run)."""
    k, seed = spec.k, spec.seed
    loop = library_loop(spec, target_model, draft)
    try:
        gens = [loop.counted(loop.speculative, p, w.n_chars, seed) for p, w in zip(ids, prompts)]
        bases = [loop.counted(loop.baseline, p, w.n_chars, seed) for p, w in zip(ids, prompts)]
        g = pooled(gens)
        metrics = {
            "acceptance": g.accepted / g.proposed if g.proposed else 0.0,
            "position_acceptance": g.accepted / g.tested if g.tested else 0.0,
            "chars_per_pass": g.chars_emitted / g.target_passes,
            "target_passes": g.target_passes,
            "baseline_passes": sum(w.n_chars for w in prompts),
            "library_baseline_passes": sum(b.target_passes for b in bases),
            "draft_calls": g.draft_calls,
            "proposed": g.proposed,
            "accepted": g.accepted,
            "assistant_forwards": g.assistant_forwards,
        }
        for i, a in enumerate(g.accepted_at, start=1):
            metrics[f"acceptance_pos_{i}"] = a / g.target_passes
        lengths = Counter(j for j, _ in g.passes_log)
        varying = len(lengths) > 1     # prompt lookup and the adaptive schedules draft 0..k chars a pass
        drafted = {j: c / g.target_passes for j, c in sorted(lengths.items())} if varying else None
        if varying:
            metrics["drafted_mean"] = g.proposed / g.target_passes
            metrics |= {f"drafted_len_{j}": lengths.get(j, 0) / g.target_passes for j in range(0, k + 1)}

        def baseline(i: int):
            return lambda: loop.baseline(ids[i], prompts[i].n_chars, seed)

        def speculate(i: int):
            return lambda: loop.speculative(ids[i], prompts[i].n_chars, seed)
        t = spec.timing
        with timed_phase():
            metrics.update(library_cost(loop, ids[0], k, t.cost_reps, 7, spec.device,
                                        base_run=(baseline(0), prompts[0].n_chars), drafted=drafted, **t.cost_options))
            timing = paired_workload_timing([baseline(i) for i in range(len(ids))], [speculate(i) for i in range(len(ids))],
                                            t.pairs, spec.device, **t.pair_options)
        metrics.update(timing.summary())
        per_pass = g.proposed / g.target_passes
        metrics["predicted_speedup"] = seed_speedup(metrics["chars_per_pass"], per_pass, metrics["c"])
        return metrics, timing, gens
    finally:
        loop.close()
