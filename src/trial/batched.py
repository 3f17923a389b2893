"""A trial at batch B > 1: B sequences decoded together (src/engine/decoding/batch.py).

The same three measurements as one sequence's trial, for the batch: the counters of a
speculative run (per sequence, and their mean), the component costs at (B, width), and the
paired timing of the batched baseline against the batched speculative loop. Both arms emit
B x n_chars chars, so the pairs' ratio is the throughput speedup (chars per second over all B
sequences). The free loop is a one-sequence chain's (timing.free_loop does not apply here).
"""
from __future__ import annotations

import statistics

import torch

from ..engine.decoding.batch import BatchGeneration, generate_baseline_batch, generate_speculative_batch, stream_generators
from ..engine.measuring.formula import seed_speedup
from ..engine.measuring.measure import measure_batch_cost
from ..engine.measuring.timing import paired_timing
from .spec import TrialSpec


def batch_prompts(spec: TrialSpec, corpus, tokenizer) -> list[list[int]]:
    """The B prompts: `prompt` for every sequence (batch_prompts=same), or B windows of the
    validation split as long as `prompt`, at offsets drawn by the trial's seed (validation)."""
    prompt = tokenizer.encode(spec.prompt).tolist()
    if spec.batch_prompts == "same":
        return [prompt] * spec.batch
    _, val = corpus.split(spec.target.train.val_fraction)
    P = len(prompt)
    gen = torch.Generator().manual_seed(spec.seed)
    starts = torch.randint(0, len(val) - P + 1, (spec.batch,), generator=gen).tolist()
    return [tokenizer.encode(val[s:s + P]).tolist() for s in starts]


def batch_counters(g: BatchGeneration, k: int, n_chars: int) -> dict:
    """The speculative run's counters. Per sequence b (until it had its n_chars): passes_b,
    chars_b, accepted_b, tested_b; the acceptance rates pool them over the sequences.
    chars_per_pass is what throughput sees, a sequence's chars per pass of the batch (the batch
    waits for its slowest sequence); seq_chars_per_pass the mean of each sequence's own."""
    B, P = len(g.passes), g.target_passes
    own = [c / p for c, p in zip(g.chars, g.passes)]
    m = {
        "batch": B,
        "acceptance": sum(g.accepted) / (k * sum(g.passes)),
        "position_acceptance": sum(g.accepted) / sum(g.tested),
        "analytic_acceptance": sum(g.overlap_sum) / sum(g.tested),
        "chars_per_pass": statistics.fmean(g.chars) / P,
        "seq_chars_per_pass": statistics.fmean(own),
        "seq_chars_per_pass_min": min(own),
        "seq_chars_per_pass_max": max(own),
        "seq_passes_mean": statistics.fmean(g.passes),
        "target_passes": P,                 # the batch's verify passes
        "baseline_passes": n_chars,         # the batch's (B, 1) passes
        "draft_calls": P,
        "proposed": P * k,                  # drafted positions per row, padding rows included (the cost model's D)
        "accepted": statistics.fmean(g.accepted),
    }
    for i in range(k):
        m[f"acceptance_pos_{i + 1}"] = sum(a[i] for a in g.accepted_at) / sum(g.passes)
    return m


def sequence_rows(g: BatchGeneration, prompts: list[list[int]], decode) -> list[dict]:
    """Per sequence: its prompt, passes, chars, accepted and tested counts (the trial's sequences.csv)."""
    return [{"seq": b, "prompt": decode(prompts[b]), "passes": g.passes[b], "chars": g.chars[b],
             "accepted": g.accepted[b], "tested": g.tested[b], "chars_per_pass": g.chars[b] / g.passes[b]}
            for b in range(len(prompts))]


def batch_measurements(spec: TrialSpec, model, draft, prompts: list[list[int]], timed_phase):
    """The batch's counters, component costs and paired timing: (metrics, PairedTiming, the
    counter run's BatchGeneration)."""
    device, k, n, T = spec.device, spec.k, spec.n_chars, spec.temperature

    def speculate(track_overlap=True):
        return generate_speculative_batch(model, draft, prompts, n, k, T, stream_generators(spec.seed, len(prompts), device),
                                          track_overlap=track_overlap)

    def baseline():
        return generate_baseline_batch(model, prompts, n, T, stream_generators(spec.seed, len(prompts), device))

    g = speculate()
    metrics = batch_counters(g, k, n)
    t = spec.timing
    with timed_phase():
        metrics.update(measure_batch_cost(model, draft, prompts, k, T, t.cost_reps, device, **t.cost_options))
        timing = paired_timing(baseline, lambda: speculate(track_overlap=False), t.pairs, device, **t.pair_options)
    metrics.update(timing.summary())
    metrics["predicted_speedup"] = seed_speedup(metrics["chars_per_pass"], k, metrics["c"])
    chars = len(prompts) * n   # both arms: throughput in chars per second over the batch
    metrics["baseline_chars_per_s"] = chars / metrics["baseline_s_median"]
    metrics["speculative_chars_per_s"] = chars / metrics["speculative_s_median"]
    return metrics, timing, g
