"""The machine's limit per pass, and each engine against it (printed, never asserted):
`make bench ARGS="+bench=roofline"`.

1. The machine, one thread: float32 GEMM throughput and copy bandwidth (src/engine/measuring/roofline.py).
2. Per engine and pass width (1..17, and the drafts_tree sweep's tree sizes 1 + 4, 8, 12, 44 as
   tree passes: slots and a mask given), on the config's target: FLOPs and bytes of the pass, its
   arithmetic alone at the GEMM rate, its lower bound max(flops / GEMM rate, bytes / bandwidth),
   the measured pass (median of interleaved rounds of `timing.cost_reps` calls, all engines and
   widths timed in the same rounds), the pass as a multiple of its bound and of its arithmetic,
   the verify-cost curve tv(w) / t1, and the largest logit difference from eager's pass. The
   `transformers` engine's pass is the converted GPT2LMHeadModel's forward over a DynamicCache,
   cropped back after each call as its loop does (src/engine/huggingface/library_loop.py); chains only.
3. Per engine, the draft cost c of each model draft (int8, int4, int8_kernels, heads) at
   k = `k` of the config, timed as a trial times it (`measure_cost`; `library_cost` for the
   transformers engine, where int8_kernels and heads have no counterpart: "-").
4. Per engine, the compile time of each graph (untimed in trials; here its first call).

    python -m src.bench.bench +bench=roofline                  # eager and compiled, default target
    python -m src.bench.bench +bench=roofline model=tiny train=quick data=synthetic
"""
from __future__ import annotations

import statistics

import torch
from omegaconf import OmegaConf

from ..engine.decoding.decode import prefill
from ..engine.runtimes.engines import ENGINES, Engine
from ..engine.huggingface.checkpoint import to_transformers
from ..engine.huggingface.library_loop import LibraryLoop, cached_passes, library_cost
from ..engine.measuring.measure import measure_cost
from ..engine.measuring.roofline import measure_machine, pass_cost
from ..engine.measuring.timing import interleaved_rounds
from ..paths import CONF_DIR
from ..trial.load import build_draft
from ..trial.spec import draft_spec, engine_spec, trial_spec

WIDTHS = tuple(range(1, 18))
TREE_NODES = (4, 8, 12, 44)            # the drafts_tree sweep's shapes: 1-1-1-1, 2-1-1-1, 3-1-1-1, 4-2-2-1
MODEL_DRAFTS = ("int8", "int4", "int8_kernels", "heads")


def engine_of(name: str, cfg) -> Engine:
    spec = engine_spec(OmegaConf.load(CONF_DIR / "engine" / f"{name}.yaml"))
    return Engine(spec.name, spec.mode, spec.options, trial_spec(cfg).target.data.cache_dir / "compiled")


def pass_blocks(model, prompt: list[int], reps: int) -> dict:
    """(width, tree) -> (fn, reps): one pass of each width after the prompt (tree passes: every
    node in a scratch slot of its own, attending to the prefix and its ancestors: a chain here)."""
    P = len(prompt)
    extra = max(TREE_NODES) + 1
    positions = prefill(model, prompt, extra=extra)
    device = positions.device
    blocks = {}
    for w in WIDTHS:
        x = torch.tensor([prompt[-1:] * w], device=device)
        pos = positions[P - 1:P - 1 + w]
        blocks[(w, False)] = (lambda x=x, pos=pos: model(x, pos), reps)
    block = model.cfg.block_size
    for n in TREE_NODES:
        w = n + 1
        x = torch.tensor([prompt[-1:] * w], device=device)
        pos = positions[P - 1:P - 1 + w]
        slots = positions[[P - 1] + [block + i for i in range(n)]]     # scratch slots beyond block_size
        mask = torch.zeros(w, block + extra, dtype=torch.bool, device=device)
        mask[:, :P - 1] = True                                          # the committed prefix
        for i in range(w):                                              # a chain of nodes: each sees those before
            mask[i, slots[:i + 1]] = True
        blocks[(w, True)] = (lambda x=x, pos=pos, s=slots, m=mask: model(x, pos, s, m), reps)
    return blocks


def library_blocks(model, prompt: list[int], reps: int) -> dict:
    """(width, False) -> (fn, reps): the converted target's pass of each chain width (no tree passes)."""
    pass_of = cached_passes(to_transformers(model), prompt, max(WIDTHS))
    return {(w, False): (pass_of(w), reps) for w in WIDTHS}


def library_draft_c(target, draft, prompt: list[int], spec) -> str:
    if getattr(draft, "library", None) != "assistant":
        return "-"
    loop = LibraryLoop(target.model, spec.k, spec.temperature, assistant=draft.model)
    m = library_cost(loop, prompt, spec.k, spec.timing.cost_reps, 7, spec.device)
    loop.close()
    return f"{m['c']:.3f}"


def log_tables(log, cfg, target, corpus) -> None:
    spec = trial_spec(cfg)
    torch.set_num_threads(spec.threads)
    prompt = target.tokenizer.encode(spec.prompt).tolist()
    c = target.model.cfg
    slots = c.block_size + max(TREE_NODES) + 1
    machine = measure_machine(pass_cost(c.vocab_size, c.d_model, c.n_layer, slots, 1).bytes)
    log.info("the machine, %d thread(s): float32 GEMM %.1f GFLOP/s; copy %.1f GB/s (a pass's working set, in "
             "cache), %.1f GB/s (64 MB, from memory)", torch.get_num_threads(), machine.flops_per_s / 1e9,
             machine.bytes_per_s / 1e9, machine.memory_bytes_per_s / 1e9)
    engines = {name: engine_of(name, cfg) for name in ENGINES}
    runners = {name: e.wrap(target.model, f"target ({name})") for name, e in engines.items()}
    blocks = {}
    for name, runner in runners.items():   # one cache per engine would alias: each block sets its own up
        make = library_blocks if name == "transformers" else pass_blocks
        for key, (fn, reps) in make(runner, prompt, spec.timing.cost_reps).items():
            blocks[(name, *key)] = (fn, reps)
    diffs = {}   # each engine's logits against eager's on the same pass (the first call: its compile too)
    with torch.no_grad():
        for (name, w, tree), (fn, _) in blocks.items():
            if name != "eager":
                diffs[(name, w, tree)] = (fn() - blocks[("eager", w, tree)][0]()).abs().max().item()
        per_call = interleaved_rounds(dict(blocks), rounds=7)
    t = {key: statistics.median(v) for key, v in per_call.items()}
    log.info("| engine | width | pass | MFLOP | MB | arithmetic us | bound us | measured us | / bound | "
             "/ arithmetic | tv(w) / t1 | max logit diff vs eager |")
    log.info("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (name, w, tree), seconds in t.items():
        cost = pass_cost(c.vocab_size, c.d_model, c.n_layer, slots, w)
        bound, arith = machine.bound_s(cost), machine.compute_s(cost)
        log.info("| %s | %d | %s | %.2f | %.2f | %.1f | %.1f | %.0f | %.1f | %.1f | %.2f | %.1e |", name, w,
                 "tree" if tree else "chain", cost.flops / 1e6, cost.bytes / 1e6, arith * 1e6, bound * 1e6,
                 seconds * 1e6, seconds / bound, seconds / arith, seconds / t[(name, 1, False)],
                 diffs.get((name, w, tree), 0.0))
    log.info("draft cost c at k = %d per engine (measure_cost, as a trial times it):", spec.k)
    log.info("| draft | %s |", " | ".join(engines))
    log.info("|---|%s", "---|" * len(engines))
    for draft_name in MODEL_DRAFTS:
        row = []
        for name, engine in engines.items():
            dspec = draft_spec(OmegaConf.load(CONF_DIR / "draft" / f"{draft_name}.yaml"), cfg)
            if spec.k > dspec.options.get("n_heads", spec.k):
                row.append("-")
                continue
            draft = build_draft(dspec, spec.target, target, corpus)
            if name == "transformers":
                row.append(library_draft_c(target, draft, prompt, spec))
                continue
            engine.wrap_draft(draft)
            m = measure_cost(runners[name], draft, prompt, spec.k, spec.temperature, spec.timing.cost_reps,
                             spec.device)
            row.append(f"{m['c']:.3f}")
        log.info("| %s | %s |", draft_name, " | ".join(row))
    log.info("compile time per graph (first call; trials compile untimed):")
    for name, engine in engines.items():
        for runner in engine.runners:
            for key, seconds in runner.compile_s.items():
                log.info("| %s | %s | width %d | %.1f s |", name, runner.label, key[0][1], seconds)
