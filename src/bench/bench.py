"""Benchmarks that print tables (never asserted in tests): `make bench`.

    python -m src.bench.bench                      # the overhead, kernels and quantization tables, default model
    python -m src.bench.bench +bench=kernels k=8   # one table (overhead, kernels, quantization, tree, rows);
                                                     # any override as for src.run (model=NAME: another target)

1. Loop overhead: the speculative loop's time per drafted char beyond the time inside the
   target's forwards and the draft's proposals, both clocked within the loop, as a share of
   one target pass (floor: <= 5% for bigram); draft c here is the in-loop draft time per char
   over one target pass. Each row is the median of `repeats` rounds.
2. Quantized drafts: weight memory (packed ints + float32 scales vs float32) and the
   validation-loss change against the target, the int8-kernel copy (`int8_kernels`) included.
3. Int8 kernels (`bench=kernels`, in `all`; src/bench/kernels.py): the draft cost c
   of the float32 target, the fake-quantized int8 draft and the int8-kernel draft timed side
   by side, and one Linear of each shape, float32 against int8 kernel. `model=NAME` times
   another target size.
4. Trees (`bench=tree`, not in `all`): for a few shapes, the tree's verify pass (one target
   pass over [last char, N nodes], tree mask, scratch slots) as a multiple of a one-char
   pass against N, a least-squares line through them (verify / one pass = a + b N), and the
   tree loop's overhead per node beyond the verify passes and the tree building (bigram draft),
   also as a share of one target pass (the same floor as the chain's).
6. The machine's limit (`bench=roofline`, not in `all`; src/bench/machine_limit.py): FLOPs and bytes
   of each pass width, the machine's rates, each engine's pass against its bound, tv(w) / t1,
   the model drafts' c per engine, compile times.
7. The two loops (`bench=library`, not in `all`; src/bench/library_vs_tool.py): the tool's eager loop and
   transformers' generate on the same model draft, every component in the same rounds.
5. Row paths (`bench=rows`, not in `all`): the table drafts' loop at T = 1 drawing from
   mixture rows (what `propose` does) against dense rows: time per target pass, pairs on
   successive seeds (the two paths draw different chars from the same law).
"""
from __future__ import annotations

import logging
import statistics
import time

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from .. import sweep  # noqa: F401  (its warning filter, before Hydra composes the launcher configs)
from ..engine.decoding.decode import generate_speculative
from ..door import refuse, unknown
from ..engine.errors import SpecsweepError
from ..engine.measuring.measure import measure_cost
from ..engine.models.quantize import quantized_copy
from ..engine.measuring.intervals import median_interval
from ..engine.measuring.timing import timed
from ..engine.models.train import evaluate
from ..engine.decoding.tree import generate_tree, max_nodes
from ..paths import CONF_DIR
from ..trial.checks import check_inputs
from ..door import hydra_command
from ..trial.load import build_draft, load_target
from ..trial.capabilities import draft_class
from ..trial.spec import draft_spec, trial_spec
from . import kernels as bench_kernels
from . import library_vs_tool as bench_library
from . import machine_limit


def named_draft(cfg, target, corpus, name: str):
    """The draft of conf/draft/NAME.yaml, fitted to the config's target."""
    spec = trial_spec(cfg)
    return build_draft(draft_spec(OmegaConf.load(CONF_DIR / "draft" / f"{name}.yaml"), cfg), spec.target, target,
                       corpus)

log = logging.getLogger(__name__)


class Clocked:
    """A stand-in for a callable object (the target) that adds up the wall time of its calls;
    every attribute is the wrapped object's."""

    def __init__(self, wrapped):
        self.wrapped, self.seconds = wrapped, 0.0

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self.wrapped(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t0

    def __getattr__(self, name):
        return getattr(self.wrapped, name)


def loop_overhead(cfg, target, corpus, draft_name: str, k: int, repeats: int, widths=None) -> dict:
    """The speculative loop (chain of k drafts, or the tree of `widths`) against its parts, in
    each of `repeats` rounds: the loop's time beyond the time spent inside the target's
    forwards (prefill and verify passes) and inside the draft's calls (`propose`, or
    `next_probs` for a tree), both clocked in the same run, per drafted char / tree node, as a
    share of one 1-char target pass (`measure_cost`, timed beside it), and per pass. For a tree
    also its verify pass as a multiple of a one-char pass (`measure_cost`). Medians over rounds.
    The parts are clocked in the loop itself because a pass timed alone in a tight loop runs
    faster than the same pass between the loop's Python work (warm caches): subtracting it
    counted that difference as overhead."""
    draft = named_draft(cfg, target, corpus, draft_name)
    model, T, n = target.model, cfg.temperature, cfg.n_chars
    prompt = target.tokenizer.encode(cfg.prompt).tolist()
    calls = "next_probs" if widths is not None else "propose"

    def run(track_overlap=True):
        gen = torch.Generator().manual_seed(cfg.seed)
        clocked_model, clocked_draft = Clocked(model), Clocked(getattr(draft, calls))
        setattr(draft, calls, clocked_draft)            # an instance attribute over the method
        try:
            if widths is None:
                g = generate_speculative(clocked_model, draft, prompt, n, k, T, gen, track_overlap=track_overlap)
            else:
                g = generate_tree(clocked_model, draft, prompt, n, widths, T, gen, track_overlap=track_overlap)
        finally:
            delattr(draft, calls)
        return g, clocked_model.seconds, clocked_draft.seconds
    rows = []
    for r in range(repeats):
        run()                                           # warm-up, untimed
        box = {}
        loop_s, _ = timed(lambda: box.setdefault("run", run(track_overlap=False)))
        g, forward_s, draft_s = box["run"]
        cost = measure_cost(model, draft, prompt, k, T, cfg.timing.cost_reps, cfg.device, tree_widths=widths)
        rest_us = (loop_s - forward_s - draft_s) * 1e6
        rows.append({"overhead_us_per_drafted_char": rest_us / g.proposed,
                     "share_of_target_pass": rest_us / g.proposed / cost["target_pass_us"],
                     "draft_share_of_target_pass": draft_s * 1e6 / g.proposed / cost["target_pass_us"],
                     "overhead_us_per_pass": rest_us / g.target_passes,
                     "nodes": cost.get("verify_nodes", k), "target_pass_us": cost["target_pass_us"],
                     "verify_multiple": cost["verify_pass_us"] / cost["target_pass_us"],
                     "draft_us_per_node": draft_s * 1e6 / g.proposed, "chars_per_pass": g.chars_emitted / g.target_passes})
    return {key: statistics.median(row[key] for row in rows) for key in rows[0]}


def row_paths(cfg, target, corpus, draft_name: str, k: int, pairs: int) -> dict:
    """A table draft's speculative loop at T = 1 drawing from mixture rows (what `propose` does)
    against the same loop drawing from dense rows (`_propose_dense`, the path of other
    temperatures). The two draw different chars from the same law, so one seed's runs differ in
    their passes: pair i runs both arms on seed `cfg.seed + i` (order alternated) and compares
    time per target pass (each pass verifies k + 1 positions in both). Returns the median over
    pairs of dense / mixture time per pass (> 1: the mixture path is cheaper), the order-statistic
    interval of that median (`median_interval` at timing.confidence) and each arm's chars per pass."""
    import copy
    mixture = named_draft(cfg, target, corpus, draft_name)
    dense = copy.copy(mixture)
    dense.clear_memos()                               # its own memos (copy.copy shares the dicts)
    dense.propose = lambda seq, k, T, gen: dense._propose_dense(seq, k, T, gen)
    model, n = target.model, cfg.n_chars
    prompt = target.tokenizer.encode(cfg.prompt).tolist()

    def per_pass(draft, seed):
        box = {}
        wall, _ = timed(lambda: box.setdefault("g", generate_speculative(
            model, draft, prompt, n, k, 1.0, torch.Generator().manual_seed(seed), track_overlap=False)), cfg.device)
        return wall / box["g"].target_passes, box["g"]
    run = {"dense": [], "mixture": []}
    for i in range(pairs):
        arms = (("dense", dense), ("mixture", mixture)) if i % 2 == 0 else (("mixture", mixture), ("dense", dense))
        for label, draft in arms:
            run[label].append(per_pass(draft, cfg.seed + i))
    ratios = [d[0] / m[0] for d, m in zip(run["dense"], run["mixture"])]
    lo, hi, _ = median_interval(ratios, cfg.timing.confidence)
    cpp = {label: sum(g.chars_emitted for _, g in r) / sum(g.target_passes for _, g in r) for label, r in run.items()}
    return {"ratio": statistics.median(ratios), "lo": lo, "hi": hi, "cpp_mixture": cpp["mixture"],
            "cpp_dense": cpp["dense"]}


BENCHES = ("all", "overhead", "quantization", "kernels", "tree", "rows", "roofline", "library")
TREE_SHAPES = [(1, 1, 1, 1), (2, 2), (4, 2), (3, 2, 1), (8, 2), (4, 2, 2, 1), (8, 4, 2), (16, 8)]


def line_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b x."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def quantization_table(cfg, corpus, target) -> list[dict]:
    _, val_text = corpus.split(cfg.train.val_fraction)
    val_ids = target.tokenizer.encode(val_text)
    block = target.model.cfg.block_size
    base = evaluate(target.model, val_ids, block)
    rows = [{"weights": "float32 (target)", "bytes": 4 * target.model.n_params(), "val_loss": base, "delta": 0.0}]
    for bits in (8, 4):
        for gran in ("channel", "tensor", "group"):
            qmodel, mem = quantized_copy(target.model, bits, gran, 32)
            loss = evaluate(qmodel, val_ids, block)
            label = f"int{bits} per-{gran}" + (" (32)" if gran == "group" else "")
            rows.append({"weights": label, "bytes": mem["packed_bytes"], "val_loss": loss, "delta": loss - base})
    kernels = named_draft(cfg, target, corpus, "int8_kernels")
    loss = evaluate(kernels.model, val_ids, block)
    label = "int8 kernels (draft int8_kernels: per-channel, 7-bit fixed-scale inputs, embeddings float32)"
    rows.append({"weights": label, "bytes": kernels.describe()["packed_bytes"], "val_loss": loss, "delta": loss - base})
    return rows


@hydra.main(version_base="1.3", config_path="../../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    torch.set_num_threads(cfg.threads)
    which = cfg.get("bench", "all")
    try:   # every argument checked before the training or any cache (here: Hydra would add a line of its own)
        if which not in BENCHES:
            raise SpecsweepError(unknown("bench", which, list(BENCHES)))
        spec = trial_spec(cfg)
        if which == "library" and getattr(draft_class(spec.draft.cls), "library", None) != "assistant":
            raise SpecsweepError(f"bench=library compares the loops on a model draft (an assistant in transformers' "
                                 f"loop: int8, int4, small_model), not draft={spec.draft.name}")
        check_inputs(spec)
        corpus, target = load_target(spec.target)
    except SpecsweepError as e:
        refuse(str(e))
    if which in ("all", "overhead"):
        log.info("loop overhead per drafted char, beyond the draft's lookup and the verify passes "
                 "(median of 5 rounds, n_chars=%d):", cfg.n_chars)
        log.info("| draft | k | overhead us/drafted char | share of one target pass | draft c | overhead us/pass |")
        log.info("|---|---|---|---|---|---|")
        for k in sorted({1, 2, 4, 8, cfg.k}):
            o = loop_overhead(cfg, target, corpus, "bigram", k, repeats=5)
            log.info("| bigram | %d | %.1f | %.1f%% | %.4f | %.0f |", k, o["overhead_us_per_drafted_char"],
                     100 * o["share_of_target_pass"], o["draft_share_of_target_pass"], o["overhead_us_per_pass"])
    if which == "tree":
        log.info("tree verify pass vs node count, bigram draft, temperature %s (median of 3 rounds, n_chars=%d):",
                 cfg.temperature, cfg.n_chars)
        log.info("| widths | nodes | verify / one pass | one pass us | draft us/node | loop overhead us/node "
                 "| share of one target pass | overhead us/pass | chars/pass |")
        log.info("|---|---|---|---|---|---|---|---|---|")
        xs, ys = [], []
        for widths in TREE_SHAPES:
            if len(cfg.prompt) + cfg.n_chars + len(widths) > target.model.cfg.block_size:
                continue
            o = loop_overhead(cfg, target, corpus, "bigram", len(widths), repeats=3, widths=widths)
            xs.append(o["nodes"])
            ys.append(o["verify_multiple"])
            log.info("| %s | %d | %.2f | %.0f | %.1f | %.1f | %.1f%% | %.0f | %.2f |", "-".join(map(str, widths)),
                     max_nodes(widths), o["verify_multiple"], o["target_pass_us"], o["draft_us_per_node"],
                     o["overhead_us_per_drafted_char"], 100 * o["share_of_target_pass"], o["overhead_us_per_pass"],
                     o["chars_per_pass"])
        a, b = line_fit(xs, ys)
        log.info("verify pass / one 1-char pass ~= %.3f + %.4f x nodes (least squares over the shapes above)", a, b)
    if which == "rows":
        pairs = max(cfg.timing.pairs, 20)
        log.info("table drafts at T = 1: the speculative loop from mixture rows against dense rows, time per "
                 "target pass, %d pairs on seeds %d.. (n_chars=%d):", pairs, cfg.seed, cfg.n_chars)
        log.info("| draft | k | time per pass, dense / mixture | interval | chars/pass mixture | chars/pass dense |")
        log.info("|---|---|---|---|---|---|")
        for name in ("ngram", "distilled"):
            for k in (4, 8, 16):
                if len(cfg.prompt) + cfg.n_chars + k > target.model.cfg.block_size:
                    continue
                o = row_paths(cfg, target, corpus, name, k, pairs)
                log.info("| %s | %d | %.3f | %.3f-%.3f | %.2f | %.2f |", name, k, o["ratio"], o["lo"], o["hi"],
                         o["cpp_mixture"], o["cpp_dense"])
    if which == "roofline":
        machine_limit.log_tables(log, cfg, target, corpus)
    if which == "library":
        bench_library.log_tables(log, cfg, target, corpus)
    if which in ("all", "kernels"):
        bench_kernels.log_tables(log, cfg, target, corpus)
    if which in ("all", "quantization"):
        log.info("quantized drafts: weight memory and validation loss (full validation split):")
        log.info("| weights | bytes | val loss | change |")
        log.info("|---|---|---|---|")
        for r in quantization_table(cfg, corpus, target):
            log.info("| %s | %d | %.4f | %+.4f |", r["weights"], r["bytes"], r["val_loss"], r["delta"])


if __name__ == "__main__":
    hydra_command(main)
