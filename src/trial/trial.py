"""One cell: a `TrialSpec` in, its counters, component costs and paired timings out.

`run_trial(spec)` is a plain function; the sweep's job, the CLI and the tests all call it. It
returns a `TrialResult` and records nothing: tracking is the sweep's (src/sweep/job.py). Its
corpus and targets come from a `TargetSource` (src/trial/load.py): the local model cache by
default, the targets a sweep's parent published in a sweep's worker.
"""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from functools import partial

import torch

from ..engine.decoding.decode import generate_baseline, generate_speculative, pooled
from ..engine.runtimes.engines import Engine
from ..engine.measuring.formula import seed_speedup
from ..engine.measuring.measure import exactness_check, measure_cost
from ..engine.measuring.memory import held_bytes, peak_rss_bytes
from ..engine.measuring.replay import ProposalRecorder, ReplayDraft
from ..engine.measuring.timing import PairedTiming, paired_workload_timing
from ..engine.decoding.tree import generate_tree, max_nodes
from .batched import batch_measurements
from .policies import build_policy
from .checks import check_inputs
from .library_trial import library_measurements
from .load import TargetSource, build_draft, draft_model_key, load_target
from .per_category import category_metrics, prompt_rows
from .timing_lock import timing_lock
from .spec import TrialSpec, tree_label
from .workload import Prompt, digest, workload_prompts

log = logging.getLogger(__name__)


@dataclass
class TrialResult:
    metrics: dict                 # flat name -> number, everything a sweep compares
    timing: PairedTiming          # raw per-pair times
    text: str                     # the speculative run's generated chars (the first prompt's; a batch's first sequence)
    info: dict = field(default_factory=dict)  # target key, draft facts, the workload, ...
    sequences: list[dict] = field(default_factory=list)  # batch > 1: per sequence, its counters
    prompts: list[dict] = field(default_factory=list)    # per prompt of the workload: its counters and times


def free_loop_run(speculate, recorder: ProposalRecorder, g):
    """(run, passes) for measure_cost's free loop (`loops`): the loop replaying the counter run's
    recorded proposals (src/engine/measuring/replay.py), timed as the speculative arm is (no overlap
    counter); speculate(track_overlap, with_draft) runs the trial's loop. Run once here, untimed, to
    check it makes the counter run's passes and chars; None, with a warning, where it does not (a
    draft that is not deterministic given the seed)."""
    free = ReplayDraft(recorder)

    def run():
        return speculate(False, free)
    try:
        replayed = run()
    except RuntimeError:
        replayed = None
    if replayed is None or (replayed.tokens, replayed.target_passes) != (g.tokens, g.target_passes):
        log.warning("the free loop's replay diverged from the counter run: free_pass_us and base_pass_us not measured")
        return None
    return run, g.target_passes


def recorded_loops(speculate, baseline, n_chars: int, draft):
    """(the counter run, measure_cost's `loops`): one run of the loop speculate(track_overlap,
    with_draft) with `draft`'s proposals recorded, then the free loop replaying them
    (`free_loop_run`) and the baseline loop baseline() of n_chars chars; the loops None where the
    replay diverges. A trial's chain (sequence_measurements) and src/trial/probes.py's probes, at
    B = 1 and for a batch, build their loops here."""
    recorder = ProposalRecorder(draft)
    g = speculate(with_draft=recorder)
    free = free_loop_run(speculate, recorder, g)
    return g, None if free is None else {"free": free, "base": (baseline, n_chars)}


def run_trial(spec: TrialSpec, source: TargetSource | None = None, progress: bool = True,
              loaded=None, lock=None) -> TrialResult:
    """source: where the corpus and the trained targets come from (default: the local cache).
    loaded: (corpus, TrainedTarget) if the caller has them already.
    lock: a context manager held around each timed phase (cost and paired timing; the cost
    policy's profile), so parallel workers time one at a time while their deterministic work runs
    in parallel (default: the host's timing lock, `spec.timing.lock`); it must be reusable."""
    torch.set_num_threads(spec.threads)  # every job: loky reuses worker processes
    device = spec.device
    if loaded is None:
        check_inputs(spec)  # before any training: a corpus that cannot serve the trial is refused
    corpus, target = loaded if loaded is not None else load_target(spec.target, source, progress)
    target.model.to(device)
    draft = build_draft(spec.draft, spec.target, target, corpus, source)
    # the engine runs the target's passes and a model draft's (both arms on the same engine)
    engine = Engine(spec.engine.name, spec.engine.mode, spec.engine.options, spec.target.data.cache_dir / "compiled")
    model = engine.wrap(target.model)
    engine.wrap_draft(draft)
    prompts = trial_prompts(spec, corpus)
    ids = [target.tokenizer.encode(p.text).tolist() for p in prompts]

    def timed_phase():
        return lock if lock is not None else timing_lock(spec.timing)
    sequences = []
    if spec.engine.name == "transformers":   # both arms through transformers' generate
        metrics, timing, gens = library_measurements(spec, target.model, draft, prompts, ids, timed_phase)
    elif spec.batch > 1:
        metrics, timing, gens, sequences = batch_measurements(spec, model, draft, prompts, ids, timed_phase,
                                                              target.tokenizer.decode)
    else:
        metrics, timing, gens = sequence_measurements(spec, model, draft, prompts, ids, timed_phase, target.key,
                                                      eager=target.model)
    text = target.tokenizer.decode(gens[0].tokens)
    per_prompt = spec.batch == 1   # a batch times its batches, not its prompts: counters per category only
    metrics.update(category_metrics(prompts, gens, timing if per_prompt else None, metrics["c"], timing.level))
    # loop overhead left after the measured components, per pass (used by the cost models)
    passes = metrics["target_passes"]
    metrics["overhead_us_per_pass"] = (metrics["speculative_s_median"] * 1e6 - passes * metrics["verify_pass_us"]
                                       - metrics["proposed"] * metrics["draft_char_us"]) / passes
    # memory held after the runs (the caches at their largest): the target's and the draft's own
    metrics["memory_target_bytes"] = held_bytes(model)
    metrics["memory_draft_bytes"] = held_bytes(draft, exclude=model)
    metrics["memory_bytes"] = metrics["memory_target_bytes"] + metrics["memory_draft_bytes"]
    metrics["peak_rss_bytes"] = peak_rss_bytes()
    compiled = engine.compile_report()
    if compiled:  # compilation ran in the untimed runs (counters, warm-ups): its time, apart
        metrics["compile_s"] = sum(c["compile_s"] for c in compiled.values())
        metrics["compiled_graphs"] = sum(c["graphs"] for c in compiled.values())
    if spec.exactness_samples is not None:   # on the workload's first prompt
        metrics.update(exactness_check(model, draft, ids[0], spec.temperature, spec.exactness_samples, spec.seed,
                                       tree_widths=spec.tree))
    info = {"workload": spec.workload.name, "workload_digest": digest(prompts),
            "target_key": target.key, "target_val_loss": target.val_loss, "verify": "chain" if spec.tree is None
            else f"tree {tree_label(spec.tree)} ({max_nodes(spec.tree)} nodes)",
            "target_params": model.n_params(), "draft": draft.name, "engine": engine.name,
            **{f"engine_fallback.{label}": c["fallback"] for label, c in compiled.items() if c["fallback"]}, **{f"draft_{a}": b for a, b in draft.describe().items()}}
    model_key = draft_model_key(spec.draft, corpus)
    if model_key is not None:  # a model draft: which trained target drafted (a tag `info.draft_model_key`)
        info["draft_model_key"] = model_key
    return TrialResult(metrics, timing, text, info, sequences, prompt_rows(prompts, gens, timing if per_prompt else None))


def trial_prompts(spec: TrialSpec, corpus) -> list[Prompt]:
    """The trial's workload: its prompts, the built-in ones drawn from the corpus's validation split."""
    return workload_prompts(spec.workload, corpus.split(spec.target.train.val_fraction)[1])


def policy_counters(g, k: int) -> dict:
    """An adaptive policy's counters: the drafted length's mean and distribution (share of passes
    drafting j chars), and per position i the acceptance among the passes that drafted char i."""
    passes = g.draft_calls
    lengths = Counter(j for j, _ in g.passes_log)
    m = {"drafted_mean": g.proposed / passes}
    m |= {f"drafted_len_{j}": lengths.get(j, 0) / passes for j in range(1, k + 1)}
    m |= {f"acceptance_given_drafted_{i}": a / d for i, (a, d) in enumerate(zip(g.accepted_at, g.drafted_at), start=1)
          if d}
    return m


def sequence_measurements(spec: TrialSpec, model, draft, prompts: list[Prompt], ids: list[list[int]], timed_phase,
                          target_key: str, eager):
    """One sequence at a time (batch 1), over the workload's prompts: the counters of the trial's
    loop (chain or tree, its draft-length policy) on every prompt, pooled; the component costs
    (and a cost policy's calibration, and the free loop) on the first prompt; the paired timing
    over the workload (src/engine/measuring/timing.py: paired_workload_timing). timed_phase() gives the
    lock held around each timed phase; eager: the target's own model (`model` is it on the
    trial's engine; the cost policy calibrates on it). Returns (metrics, PairedTiming, each
    prompt's counter run)."""
    device, k, T = spec.device, spec.k, spec.temperature
    widths = spec.tree

    def new_gen():
        return torch.Generator(device=device).manual_seed(spec.seed)

    def baseline(i: int):
        return lambda: generate_baseline(model, ids[i], prompts[i].n_chars, T, new_gen())

    policy = build_policy(spec, model, draft, ids[0], target_key, (baseline(0), prompts[0].n_chars), timed_phase, eager)

    def speculate(i: int, track_overlap=True, with_draft=draft):
        """One run of the trial's loop on prompt i from its seed (with_draft: the draft, or a stand-in for it)."""
        n = prompts[i].n_chars
        if widths is None:
            return generate_speculative(model, with_draft, ids[i], n, k, T, new_gen(), track_overlap=track_overlap,
                                        policy=policy)
        return generate_tree(model, with_draft, ids[i], n, widths, T, new_gen(), track_overlap=track_overlap)

    # deterministic counters: exact given the seed; a chain's proposals recorded for the free loop,
    # which is timed with the baseline loop and the components (the cost model's loop times)
    if widths is None and spec.timing.free_loop:
        first, loops = recorded_loops(partial(speculate, 0), baseline(0), prompts[0].n_chars, draft)
    else:
        first, loops = speculate(0), None
    gens = [first] + [speculate(i) for i in range(1, len(prompts))]
    g = pooled(gens)
    metrics = {
        "acceptance": g.accepted / g.proposed,
        "position_acceptance": g.accepted / g.tested,
        "analytic_acceptance": g.overlap_sum / g.tested,
        "chars_per_pass": g.chars_emitted / g.target_passes,
        "target_passes": g.target_passes,
        "baseline_passes": sum(p.n_chars for p in prompts),
        "draft_calls": g.draft_calls,
        "proposed": g.proposed,
        "accepted": g.accepted,
    }
    for i, a in enumerate(g.accepted_at, start=1):
        metrics[f"acceptance_pos_{i}"] = a / g.target_passes   # tree: passes whose path reached depth i
    drafted = None   # a policy's passes of varying length: their share per length, for the verify cost
    if spec.policy.name != "fixed":
        metrics.update(policy_counters(g, k))
        metrics.update({f"policy_{key}": v for key, v in policy.describe().items()})
        lengths = Counter(j for j, _ in g.passes_log)
        drafted = {j: c / g.draft_calls for j, c in sorted(lengths.items())}
    # drafted chars per pass: k for the chain, the tree's nodes (fewer where a draft row has
    # fewer chars with mass than a width) for a tree; the cost model's draft term is this times c
    per_pass = g.proposed / g.target_passes
    if widths is not None:
        metrics.update({"tree_depth": len(widths), "tree_nodes": max_nodes(widths), "nodes_per_pass": per_pass})

    t = spec.timing
    with timed_phase():
        metrics.update(measure_cost(model, draft, ids[0], k, T, t.cost_reps, device, tree_widths=widths,
                                    loops=loops, drafted=drafted, **t.cost_options))
        timing = paired_workload_timing([baseline(i) for i in range(len(prompts))],
                                        [lambda i=i: speculate(i, track_overlap=False) for i in range(len(prompts))],
                                        t.pairs, device, **t.pair_options)
    metrics.update(timing.summary())
    metrics["predicted_speedup"] = seed_speedup(metrics["chars_per_pass"], per_pass, metrics["c"])
    return metrics, timing, gens
