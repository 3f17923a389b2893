"""Benchmarks that print tables (never asserted in tests): `make bench`.

    python -m src.harness.bench                      # both tables on the default model
    python -m src.harness.bench bench=overhead k=8   # any config override works as for src.run

1. Loop overhead: the speculative loop's time per drafted char beyond the draft's own
   lookup and the verify passes, as a share of one target pass (floor: <= 5% for bigram).
   The loop, the verify pass and the draft are timed interleaved in one run; each row is the
   median of `repeats` rounds.
2. Quantized drafts: weight memory (packed ints + float32 scales vs float32) and the
   validation-loss change against the target.
"""
from __future__ import annotations

import logging
import statistics
import sys

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from ..engine.decode import generate_speculative
from ..engine.measure import measure_cost
from ..engine.errors import SpecsweepError
from ..engine.quantize import quantized_copy
from .paths import CONF_DIR
from ..engine.timing import timed
from ..engine.train import evaluate

log = logging.getLogger(__name__)


def loop_overhead(cfg, target, corpus, draft_name: str, k: int, repeats: int) -> dict:
    from .trial import build_draft
    draft = build_draft(cfg, target, corpus, OmegaConf.load(CONF_DIR / "draft" / f"{draft_name}.yaml"))
    model, T, n = target.model, cfg.temperature, cfg.n_chars
    prompt = target.tokenizer.encode(cfg.prompt).tolist()
    shares = []
    for r in range(repeats):
        g = generate_speculative(model, draft, prompt, n, k, T, torch.Generator().manual_seed(cfg.seed))
        loop_s, _ = timed(lambda: generate_speculative(model, draft, prompt, n, k, T,
                                                       torch.Generator().manual_seed(cfg.seed), track_overlap=False))
        cost = measure_cost(model, draft, prompt, k, T, cfg.timing.cost_reps, cfg.device)
        rest_us = loop_s * 1e6 - g.target_passes * cost["verify_pass_us"] - g.proposed * cost["draft_char_us"]
        shares.append({"overhead_us_per_drafted_char": rest_us / g.proposed,
                       "share_of_target_pass": rest_us / g.proposed / cost["target_pass_us"],
                       "draft_share_of_target_pass": cost["c"],
                       "overhead_us_per_pass": rest_us / g.target_passes})
    return {key: statistics.median(s[key] for s in shares) for key in shares[0]}


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
    return rows


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from .trial import load_target
    torch.set_num_threads(cfg.threads)
    try:
        corpus, target = load_target(cfg)
    except SpecsweepError as e:
        log.error("error: %s", e)
        sys.exit(2)
    which = cfg.get("bench", "all")
    if which in ("all", "overhead"):
        log.info("loop overhead per drafted char, beyond the draft's lookup and the verify passes "
                 "(median of 5 rounds, n_chars=%d):", cfg.n_chars)
        log.info("| draft | k | overhead us/drafted char | share of one target pass | draft c | overhead us/pass |")
        log.info("|---|---|---|---|---|---|")
        for k in sorted({1, 2, 4, 8, cfg.k}):
            o = loop_overhead(cfg, target, corpus, "bigram", k, repeats=5)
            log.info("| bigram | %d | %.1f | %.1f%% | %.4f | %.0f |", k, o["overhead_us_per_drafted_char"],
                     100 * o["share_of_target_pass"], o["draft_share_of_target_pass"], o["overhead_us_per_pass"])
    if which in ("all", "quantization"):
        log.info("quantized drafts: weight memory and validation loss (full validation split):")
        log.info("| weights | bytes | val loss | change |")
        log.info("|---|---|---|---|")
        for r in quantization_table(cfg, corpus, target):
            log.info("| %s | %d | %.4f | %+.4f |", r["weights"], r["bytes"], r["val_loss"], r["delta"])


if __name__ == "__main__":
    main()
