"""A trial at batch B > 1: B sequences decoded together (src/engine/decoding/batch.py).

The workload's prompts are the batches' rows: ceil(N / B) batches of B rows, the prompts in
order and from the first again once they run out (`batch_rows`: the single workload gives B rows
of its prompt), each row with its own sampling stream. The same three measurements as one
sequence's trial: the counters of the speculative runs (per sequence, and pooled), the component
costs at (B, width) on the first batch, and the paired timing of the batched baseline against
the batched speculative loop over the batches. Both arms emit B x n_chars chars a batch, so the
pairs' ratio is the throughput speedup. A batch mixes the workload's categories, so per category
there are counters (its rows pooled) but no speedup. The free loop is a one-sequence chain's
(timing.free_loop does not apply here).
"""
from __future__ import annotations

import statistics

import torch

from ..engine.decoding.batch import BatchGeneration, generate_baseline_batch, generate_speculative_batch, stream_generators
from ..engine.decoding.decode import Generation, pooled
from ..engine.measuring.formula import seed_speedup
from ..engine.measuring.measure import measure_batch_cost
from ..engine.measuring.timing import paired_workload_timing
from .spec import TrialSpec
from .workload import Prompt


def batch_rows(n_prompts: int, batch: int) -> list[list[int]]:
    """The workload's prompts as the rows of ceil(N / B) batches of B rows: prompt indices in
    order, from the first again once they run out (one prompt: B rows of it)."""
    batches = -(-n_prompts // batch)
    return [[(b * batch + j) % n_prompts for j in range(batch)] for b in range(batches)]


def batch_counters(gs: list[BatchGeneration], k: int, n_chars: int) -> dict:
    """The speculative runs' counters, over the workload's batches. Per sequence b (until it had
    its n_chars): passes_b, chars_b, accepted_b, tested_b; the acceptance rates pool them over
    every sequence. chars_per_pass is what throughput sees, a sequence's chars per pass of its
    batch (a batch waits for its slowest sequence), pooled over the batches: the batches' mean
    chars over their passes; seq_chars_per_pass the mean of each sequence's own."""
    rows = [(g, b) for g in gs for b in range(len(g.passes))]
    passes = sum(g.target_passes for g in gs)
    own = [g.chars[b] / g.passes[b] for g, b in rows]
    seq_passes = [g.passes[b] for g, b in rows]
    m = {
        "batch": len(gs[0].passes),
        "acceptance": sum(g.accepted[b] for g, b in rows) / (k * sum(seq_passes)),
        "position_acceptance": sum(g.accepted[b] for g, b in rows) / sum(g.tested[b] for g, b in rows),
        "analytic_acceptance": sum(g.overlap_sum[b] for g, b in rows) / sum(g.tested[b] for g, b in rows),
        "chars_per_pass": sum(statistics.fmean(g.chars) for g in gs) / passes,
        "seq_chars_per_pass": statistics.fmean(own),
        "seq_chars_per_pass_min": min(own),
        "seq_chars_per_pass_max": max(own),
        "seq_passes_mean": statistics.fmean(seq_passes),
        "target_passes": passes,            # the batches' verify passes
        "baseline_passes": n_chars * len(gs),   # the batches' (B, 1) passes
        "draft_calls": passes,
        "proposed": passes * k,             # drafted positions per row, padding rows included (the cost model's D)
        "accepted": statistics.fmean(g.accepted[b] for g, b in rows),
    }
    for i in range(k):
        m[f"acceptance_pos_{i + 1}"] = sum(g.accepted_at[b][i] for g, b in rows) / sum(seq_passes)
    return m


def row_generation(g: BatchGeneration, b: int, k: int) -> Generation:
    """Sequence b of a batch as one sequence's counters (every pass drafted k chars for it)."""
    return Generation(g.tokens[b], g.passes[b], chars_emitted=g.chars[b], proposed=k * g.passes[b],
                      accepted=g.accepted[b], tested=g.tested[b], draft_calls=g.passes[b],
                      accepted_at=list(g.accepted_at[b]), overlap_sum=g.overlap_sum[b])


def sequence_rows(gs: list[BatchGeneration], rows: list[list[int]], prompts: list[Prompt], decode) -> list[dict]:
    """Per sequence: its batch, prompt, category, passes, chars, accepted and tested counts (the trial's sequences.csv)."""
    return [{"seq": j * len(idx) + b, "batch": j, "prompt_index": idx[b], "category": prompts[idx[b]].category,
             "prompt": prompts[idx[b]].text, "passes": g.passes[b], "chars": g.chars[b],
             "accepted": g.accepted[b], "tested": g.tested[b], "chars_per_pass": g.chars[b] / g.passes[b]}
            for j, (g, idx) in enumerate(zip(gs, rows)) for b in range(len(idx))]


def batch_measurements(spec: TrialSpec, model, draft, prompts: list[Prompt], ids: list[list[int]], timed_phase,
                       decode):
    """The workload's prompts as the rows of batches (`batch_rows`): each batch's counters, the
    component costs at (B, width) on the first batch, and the paired timing over the batches
    (one batch a unit of paired_workload_timing). Returns (metrics, PairedTiming, each prompt's
    counters pooled over its rows, the sequences' rows)."""
    device, k, T = spec.device, spec.k, spec.temperature
    n = prompts[0].n_chars     # one length for every prompt (the spec refused others)
    rows = batch_rows(len(prompts), spec.batch)

    def streams(j: int):
        return stream_generators(spec.seed, spec.batch, device, first=j * spec.batch)

    def speculate(j: int, track_overlap=True):
        return generate_speculative_batch(model, draft, [ids[i] for i in rows[j]], n, k, T, streams(j),
                                          track_overlap=track_overlap)

    def baseline(j: int):
        return lambda: generate_baseline_batch(model, [ids[i] for i in rows[j]], n, T, streams(j))

    gs = [speculate(j) for j in range(len(rows))]
    metrics = batch_counters(gs, k, n)
    t = spec.timing
    with timed_phase():
        metrics.update(measure_batch_cost(model, draft, [ids[i] for i in rows[0]], k, T, t.cost_reps, device,
                                          **t.cost_options))
        timing = paired_workload_timing([baseline(j) for j in range(len(rows))],
                                        [lambda j=j: speculate(j, track_overlap=False) for j in range(len(rows))],
                                        t.pairs, device, **t.pair_options)
    metrics.update(timing.summary())
    metrics["predicted_speedup"] = seed_speedup(metrics["chars_per_pass"], k, metrics["c"])
    chars = len(rows) * spec.batch * n   # both arms: throughput in chars per second over the batches
    metrics["baseline_chars_per_s"] = chars / metrics["baseline_s_median"]
    metrics["speculative_chars_per_s"] = chars / metrics["speculative_s_median"]
    per_prompt = [pooled([row_generation(g, b, k) for g, idx in zip(gs, rows) for b, i in enumerate(idx) if i == p])
                  for p in range(len(prompts))]
    return metrics, timing, per_prompt, sequence_rows(gs, rows, prompts, decode)
