"""The prediction's probes: a draft's acceptance and component costs at each setting, measured as a
trial measures them, in seconds where a sweep takes minutes a cell (`python -m src.predict`).

`measure_probes` takes one draft's settings in one regime (label -> TrialSpec: a chain's k, a
tree's shape) and returns a `Measured`: the mean overlap, the per-position survival, and per
setting the component times, the chars and drafted chars per pass, and the spread of the probes
(`Spread`) that the prediction's interval resamples (analysis/prediction.py). At a batch of B
(`measure_batch`), under an adaptive policy (`measure_policy`) and on transformers' loop
(`measure_library`) it measures as a trial of that kind does; a chain's loops are timed with its
components (`loop_probes`, `batch_loop_probes`). The method in full: src/predict.py's docstring.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..engine.measuring.formula import Overheads, chars_per_pass


@dataclass(frozen=True)
class Spread:
    """What one setting's probes drew, kept for its interval (`replicates`).

    units: one row per sampled sequence (a batch probe: per run), (chars, passes, drafted): the
    setting's chars per pass is sum(chars) / sum(passes), its drafted chars (nodes) per pass
    sum(drafted) / sum(passes). rounds: "target", "verify", "draft" -> one time per timing round in
    us (the draft per drafted char), as measure.component_times keeps them. replays: a table draft's
    cold cost per drafted char, one per replay (`replay_draft_costs`), times draft_scale (B at a
    batch of B), which then stands for the draft time instead of the rounds'."""
    units: np.ndarray
    rounds: dict
    replays: tuple = ()
    draft_scale: float = 1.0
    categories: tuple = ()    # a chain's units: the workload category of each sequence's prompt


def probe_seed(seed: int, seqs: int, run: int) -> int:
    """The first seed of probe run `run` (0-based): run r samples its sequences from seeds seed + r
    seqs on, so the runs' sequences are disjoint."""
    return seed + run * seqs


@dataclass
class Measured:
    target_key: str
    a: float                  # mean overlap at the first drafted position
    survival: np.ndarray      # S_1..S_kmax at the largest k's pass starts (chains; empty for trees)
    costs: dict               # label -> component times (us), cpp and drafted chars (nodes) per pass
    seconds: float
    overheads: Overheads | None = None   # measured with the costs (engine=transformers), else None
    categories: tuple = ()    # the workload's categories, in order, where the chains' sequences tell them apart


def measure_probes(chosen: dict, shapes, seqs: int, every: int, seed: int, loaded=None, rounds: int = 15) -> Measured:
    """Acceptance and component costs of the draft for each setting (`chosen`: label -> TrialSpec, the
    settings src/predict.py's `settings` made of a composed config; the method: src/predict.py's docstring)."""
    import time

    import torch
    from ..engine.measuring.acceptance import loop_survival, mean_overlap, sample_text, tree_chars_rows
    from ..engine.drafts.model_draft import ModelDraft
    from ..engine.measuring.measure import measure_cost, replay_draft_costs, verify_pass
    from ..engine.decoding.tree import build_tree
    from ..engine.runtimes.engines import Engine
    from .load import build_draft, load_target
    from .timing_lock import timing_lock
    t0 = time.perf_counter()
    first = next(iter(chosen.values()))   # every setting shares the target, the draft and the text
    torch.set_num_threads(first.threads)
    corpus, target = loaded if loaded is not None else load_target(first.target, progress=False)
    target.model.to(first.device)
    draft = build_draft(first.draft, first.target, target, corpus)
    engine = Engine(first.engine.name, first.engine.mode, first.engine.options,
                    first.target.data.cache_dir / "compiled")     # predicted on the engine the trials run on
    model = engine.wrap(target.model)
    engine.wrap_draft(draft)
    from .trial import trial_prompts
    workload = trial_prompts(first, corpus)        # a chain's sequences go round its prompts; the rest: its first
    ids = [target.tokenizer.encode(w.text).tolist() for w in workload]
    prompt, T, n = ids[0], first.temperature, workload[0].n_chars
    seq, p = sample_text(target.model, prompt, seqs, n, seed, T)   # untimed: eager, not a batch-of-seqs graph
    a = float("nan") if draft.library_only else mean_overlap(draft, seq, p, T)   # prompt lookup: no q of its own
    survival, trees, chains, units = np.zeros(0), {}, {}, {}
    if first.engine.name == "transformers":
        return measure_library(chosen, target, draft, prompt, a, seqs, seed, rounds, t0, n)
    if first.batch > 1:
        return measure_batch(chosen, model, draft, corpus, target, seq, a, seqs, seed, rounds, t0)
    if first.policy.name != "fixed":
        return measure_policy(chosen, model, draft, target, prompt, seq, a, seqs, seed, rounds, t0, n)
    if shapes:
        for label, c in chosen.items():
            rows = tree_chars_rows(model, draft, seq, n, c.tree, T, seed, every)
            units[label] = np.array([(chars, trees_, nodes) for chars, nodes, trees_ in rows], dtype=float)
            count = units[label][:, 1].sum()
            trees[label] = (units[label][:, 0].sum() / count, units[label][:, 2].sum() / count)
    else:  # each k at the loop's own pass starts: seqs generations, one seed each, going round the workload's prompts
        order = [j % len(ids) for j in range(seqs)]
        for label, c in chosen.items():
            runs = [loop_survival(model, draft, ids[i], workload[i].n_chars, c.k, T, [s])
                    for i, s in zip(order, range(seed, seed + seqs))]
            totals = [surv.numpy() * passes for surv, passes, _ in runs]       # survival summed over passes
            passes = sum(p for _, p, _ in runs)
            chains[label] = sum(totals) / passes
            units[label] = np.array([(p + t.sum(), p, p * c.k) for t, (_, p, _) in zip(totals, runs)], dtype=float)
        survival = chains[max(chosen, key=lambda label: chosen[label].k)]
    costs, gen = {}, torch.Generator().manual_seed(seed)
    # a chain's loops, timed with its components as a trial times them: the baseline loop and the loop
    # replaying one recorded run's proposals (its seed's; the recording and its check run untimed)
    loops = {label: None if shapes else loop_probes(model, draft, prompt, n, c.k, T, c.device, seed)
             for label, c in chosen.items()}
    own_model = isinstance(draft, ModelDraft)   # a draft running a model of its own: timed in the loop's order too
    with timing_lock(first.timing):
        for label, c in chosen.items():
            full = float(chains[label][c.k - 1]) if own_model and not shapes else None   # share of full accepts
            m = measure_cost(model, draft, prompt, c.k, T, c.timing.cost_reps, c.device, rounds, c.tree,
                             loops=loops[label], keep_rounds=True, in_loop=full)
            if full is not None:
                in_loop_td(m)
            if loops[label]:
                m["overheads"] = loop_overheads(m)
            m = {"k": c.k, **m, "nodes": trees[label][1] if shapes else c.k}
            m["cpp"] = trees[label][0] if shapes else chars_per_pass(chains[label], c.k)
            replays = ()
            if hasattr(draft, "clear_memos"):  # rows built on first use: the loop pays the cold cost
                def one_pass(prefix, k=c.k, widths=c.tree):
                    if widths is None:
                        return len(draft.propose(prefix, k, T, gen)[0])
                    return build_tree(draft, prefix, widths, T, gen).n_nodes
                after_verify = None if shapes else verify_pass(model, prompt, c.k, c.device)   # as in the loop
                replays = tuple(replay_draft_costs(draft, seq, n, m["cpp"], one_pass, before=after_verify))
                m["draft_char_us_warm"] = m["draft_char_us"]
                m["draft_char_us"] = float(np.median(replays))
            kinds = () if shapes else tuple(workload[i].category for i in order)
            m["spread"] = Spread(units[label], m.pop("rounds_us"), replays, categories=kinds)
            costs[label] = m
    categories = () if shapes else tuple(dict.fromkeys(w.category for w in workload))
    return Measured(target.key, a, survival, costs, time.perf_counter() - t0, categories=categories)


MEASURED_LOOPS = ("measured per setting with its components (o_base: the baseline loop's step beyond its one-char "
                  "pass; o_pass: the loop replaying a recorded run's proposals, at no drafting cost, per pass beyond "
                  "its verify pass; gamma 0: a model draft's td is its proposal timed after a verify pass)")


def in_loop_td(m: dict) -> None:
    """td of a draft running a model of its own: its proposal as the loop runs it (after a verify
    pass: measure_cost's or measure_batch_cost's `in_loop`), the lone proposal kept beside it
    ("draft_char_us_alone", rounds "draft alone"; `without_loops` puts it back)."""
    m["draft_char_us_alone"] = m["draft_char_us"]
    m["draft_char_us"] = m.pop("draft_char_us_in_loop")
    r = m["rounds_us"]
    r["draft alone"], r["draft"] = r["draft"], r.pop("draft in loop")


def loop_overheads(m: dict) -> Overheads:
    """A setting's loop overheads from its loops timed with its components (measure_cost's
    base_pass_us and free_pass_us): o_base = base - t1, o_pass = free - tv, gamma 0."""
    return Overheads(m["base_pass_us"] - m["target_pass_us"], m["free_pass_us"] - m["verify_pass_us"], 0.0,
                     MEASURED_LOOPS)


def loop_probes(model, draft, prompt: list[int], n: int, k: int, temperature: float, device: str, seed: int):
    """measure_cost's `loops` for a chain at k, as a trial builds them (src/trial/trial.py): "free",
    the speculative loop replaying the proposals recorded in one run from `seed`
    (src/engine/measuring/replay.py: the verify pass as it runs in the loop plus the loop's own work, no
    drafting), and "base", the baseline loop of n chars. None (and a warning) where the replay
    diverges from the recorded run."""
    import torch
    from ..engine.decoding.decode import generate_baseline, generate_speculative
    from .trial import recorded_loops

    def new_gen():
        return torch.Generator(device=device).manual_seed(seed)

    def speculate(track_overlap=True, with_draft=draft):
        return generate_speculative(model, with_draft, prompt, n, k, temperature, new_gen(), track_overlap=track_overlap)
    return recorded_loops(speculate, lambda: generate_baseline(model, prompt, n, temperature, new_gen()), n, draft)[1]


def batch_loop_probes(model, draft, prompts: list[list[int]], n: int, k: int, temperature: float, device: str,
                      seed: int):
    """measure_batch_cost's `loops` at B = len(prompts): "free", the batch loop replaying the
    proposals recorded in one batch run from `seed` (src/engine/measuring/replay.py), and "base", the batch's
    baseline loop of n chars. None (and a warning) where the replay diverges."""
    from ..engine.decoding.batch import generate_baseline_batch, generate_speculative_batch, stream_generators
    from .trial import recorded_loops
    B = len(prompts)

    def speculate(track_overlap=True, with_draft=draft):
        return generate_speculative_batch(model, with_draft, prompts, n, k, temperature,
                                          stream_generators(seed, B, device), track_overlap=track_overlap)

    def baseline():
        return generate_baseline_batch(model, prompts, n, temperature, stream_generators(seed, B, device))
    return recorded_loops(speculate, baseline, n, draft)[1]


def measure_policy(chosen: dict, model, draft, target, prompt: list[int], seq, a: float, seqs: int, seed: int,
                   rounds: int, t0: float, n: int) -> Measured:
    """`measure_probes` under an adaptive draft-length policy (k its cap). Chars per pass and the
    drafted-length distribution: the loop's counters under the policy (seqs generations, seeds
    seed.., nothing timed). Costs: `measure_cost` with that distribution, so tv is the expected
    verify pass of the loop's passes; the drafted chars per pass (`nodes`) are their mean. A
    table draft's per-char time is its cold cost along the sampled text, as for a fixed k. prompt,
    n: the workload's first prompt and its length."""
    import time
    from collections import Counter

    import torch
    from ..engine.decoding.decode import generate_baseline, generate_speculative
    from ..engine.measuring.measure import measure_cost, replay_draft_costs
    from .timing_lock import timing_lock
    from .policies import build_policy
    first = next(iter(chosen.values()))
    T = first.temperature
    costs, gen = {}, torch.Generator().manual_seed(seed)
    for label, c in chosen.items():
        def baseline(c=c):
            return generate_baseline(model, prompt, n, T, torch.Generator(device=c.device).manual_seed(seed))
        policy = build_policy(c, model, draft, prompt, target.key, (baseline, n), lambda c=c: timing_lock(c.timing))
        runs = [generate_speculative(model, draft, prompt, n, c.k, T, torch.Generator(device=c.device).manual_seed(s),
                                     track_overlap=False, policy=policy) for s in range(seed, seed + seqs)]
        passes = sum(g.draft_calls for g in runs)
        lengths = Counter(j for g in runs for j, _ in g.passes_log)
        shares = {j: m / passes for j, m in sorted(lengths.items())}
        with timing_lock(c.timing):
            m = measure_cost(model, draft, prompt, c.k, T, c.timing.cost_reps, c.device, rounds, drafted=shares,
                             keep_rounds=True)
        m |= {"k": c.k, "nodes": sum(j * share for j, share in shares.items()),
              "cpp": sum(g.chars_emitted for g in runs) / passes}
        replays = ()
        if hasattr(draft, "clear_memos"):  # rows built on first use: the loop pays the cold cost
            replays = tuple(replay_draft_costs(draft, seq, n, m["cpp"],
                                               lambda prefix, k=c.k: len(draft.propose(prefix, k, T, gen)[0])))
            m["draft_char_us_warm"] = m["draft_char_us"]
            m["draft_char_us"] = float(np.median(replays))
        units = [(g.chars_emitted, g.draft_calls, sum(j for j, _ in g.passes_log)) for g in runs]
        m["spread"] = Spread(np.array(units, dtype=float), m.pop("rounds_us"), replays)
        costs[label] = m
    return Measured(target.key, a, np.zeros(0), costs, time.perf_counter() - t0)


def measure_batch(chosen: dict, model, draft, corpus, target, seq, a: float, seqs: int, seed: int, rounds: int,
                  t0: float) -> Measured:
    """`measure_probes` at batch B > 1. Chars per pass: the batch loop's counters (seqs batch runs, seeds
    seed.., nothing timed), each run's mean chars of a sequence over the batch's passes (the batch
    waits for its slowest sequence, which per-position survival at B = 1 would not show). Costs:
    `measure_batch_cost` at (B, width); a table draft's per-char time is its cold cost along the
    sampled text (as at B = 1, a (B, k+1) verify pass before every B proposals) times B (one
    proposal per sequence); a model draft's is its batch proposal timed after a verify pass
    (`in_loop`). The batch's loops are timed with them (`batch_loop_probes`): o_base, o_pass per
    setting as at B = 1."""
    import time

    import torch
    from ..engine.decoding.batch import generate_speculative_batch, stream_generators
    from ..engine.drafts.model_draft import ModelDraft
    from ..engine.measuring.measure import batch_verify_pass, measure_batch_cost, replay_draft_costs
    from .batched import batch_rows
    from .timing_lock import timing_lock
    from .trial import trial_prompts
    first = next(iter(chosen.values()))
    T, B = first.temperature, first.batch
    workload = trial_prompts(first, corpus)   # the first batch of the workload's rows
    n = workload[0].n_chars
    prompts = [target.tokenizer.encode(workload[i].text).tolist() for i in batch_rows(len(workload), B)[0]]
    cpp = {}
    for label, c in chosen.items():
        runs = [generate_speculative_batch(model, draft, prompts, n, c.k, T, stream_generators(s, B, c.device),
                                           track_overlap=False) for s in range(seed, seed + seqs)]
        cpp[label] = [float(np.mean(g.chars) / g.target_passes) for g in runs]   # one per run
    costs, gen = {}, torch.Generator().manual_seed(seed)
    loops = {label: batch_loop_probes(model, draft, prompts, n, c.k, T, c.device, seed) for label, c in chosen.items()}
    own_model = isinstance(draft, ModelDraft)   # a draft running a model of its own: timed in the loop's order too
    with timing_lock(first.timing):
        for label, c in chosen.items():
            m = measure_batch_cost(model, draft, prompts, c.k, T, c.timing.cost_reps, c.device, rounds,
                                   keep_rounds=True, loops=loops[label], in_loop=own_model)
            if own_model:
                in_loop_td(m)
            if loops[label]:
                m["overheads"] = loop_overheads(m)
            m |= {"k": c.k, "nodes": c.k, "cpp": float(np.mean(cpp[label]))}
            replays = ()
            if hasattr(draft, "clear_memos"):  # rows built on first use: the loop pays the cold cost
                after_verify = batch_verify_pass(model, prompts, c.k, c.device)   # B proposals follow each, as in the loop
                replays = tuple(replay_draft_costs(
                    draft, seq, n, m["cpp"], lambda prefix, k=c.k: len(draft.propose(prefix, k, T, gen)[0]),
                    before=after_verify, every=B))
                m["draft_char_us_warm"] = m["draft_char_us"]
                m["draft_char_us"] = B * float(np.median(replays))
            units = np.array([(x, 1.0, c.k) for x in cpp[label]])   # a run's mean over its sequences
            m["spread"] = Spread(units, m.pop("rounds_us"), replays, float(B))
            costs[label] = m
    return Measured(target.key, a, np.zeros(0), costs, time.perf_counter() - t0)


def measure_library(chosen: dict, target, draft, prompt: list[int], a: float, seqs: int, seed: int, rounds: int,
                    t0: float, n: int) -> Measured:
    """`measure_probes` on transformers' loop (engine=transformers). Chars per pass and the drafted length
    per pass: the library loop's own counters (seqs runs of `generate`, seeds seed.., nothing timed).
    Costs: `library_cost` with the drafted-length shares and the library's plain `generate` as the
    base loop. Its loop overheads are measured, not fitted: o_base = the plain loop's step beyond its
    one-char pass, and o_pass is taken equal to it (each speculative pass pays the framework's step
    once; gamma 0: the assistant's own generate per proposal is inside td). prompt, n: the workload's
    first prompt and its length."""
    import time
    from collections import Counter

    from ..engine.huggingface.library_loop import library_cost
    from .library_trial import library_loop
    from .timing_lock import timing_lock
    first = next(iter(chosen.values()))
    costs, o_base = {}, []
    for label, c in chosen.items():
        loop = library_loop(c, target.model, draft)
        runs = [loop.counted(loop.speculative, prompt, n, s) for s in range(seed, seed + seqs)]
        passes = sum(g.target_passes for g in runs)
        lengths = Counter(j for g in runs for j, _ in g.passes_log)
        shares = {j: m / passes for j, m in sorted(lengths.items())}

        def base(loop=loop):
            return loop.baseline(prompt, n, seed)
        with timing_lock(c.timing):
            m = library_cost(loop, prompt, c.k, c.timing.cost_reps, rounds, c.device, base_run=(base, n),
                             drafted=shares if len(shares) > 1 else None, keep_rounds=True)
        loop.close()
        m |= {"k": c.k, "nodes": sum(j * share for j, share in shares.items()),
              "cpp": sum(g.chars_emitted for g in runs) / passes}
        units = [(g.chars_emitted, g.target_passes, sum(j for j, _ in g.passes_log)) for g in runs]
        m["spread"] = Spread(np.array(units, dtype=float), m.pop("rounds_us"))
        o_base.append(m["base_pass_us"] - m["target_pass_us"])
        costs[label] = m
    o = float(np.median(o_base))
    overheads = Overheads(o, o, 0.0, "measured in transformers' loop (o_base: its plain step beyond the one-char "
                                     "pass; o_pass taken equal)")
    return Measured(target.key, a, np.zeros(0), costs, time.perf_counter() - t0, overheads)
