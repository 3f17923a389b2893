"""Do real int8 kernels make a quantized copy of the target cheap? (`make bench ARGS="+bench=kernels"`)

Two tables on the model of the config (`model=...`), printed, never asserted:

1. The draft's cost c (draft time per drafted char / one 1-char target pass) of three copies
   of the target, timed side by side in one interleaved run with the target pass: the float32
   target itself as a draft, the fake-quantized `int8` draft (weights rounded, float32
   matmuls) and `int8_kernels` (fbgemm int8 GEMMs). Each draft is timed as the trials time it
   (`measure_cost`): a k-char proposal after the prompt, its Python loop included.
2. One Linear of each shape in the model, float32 against its `Int8Linear`, on one row (the
   one char a proposal feeds), interleaved likewise; then the MLP's first shape (d -> 4 d) of
   wider models (2, 4 and 8 times d_model, random weights): where the kernel starts to pay.
"""
from __future__ import annotations

import copy
import statistics

import torch
import torch.nn as nn
from omegaconf import OmegaConf

from ..engine.decoding.decode import prefill
from ..engine.drafts import ModelDraft
from ..engine.models.int8_linear import Int8Linear, quantized_engine
from ..engine.measuring.measure import proposal
from ..engine.measuring.timing import interleaved_medians
from ..paths import CONF_DIR
from ..trial.load import build_draft
from ..trial.spec import draft_spec, trial_spec

DRAFTS = ("int8", "int8_kernels")  # conf/draft files timed beside the float32 target
WIDER = (2, 4, 8)                  # d_model multiples of the wider Linears timed after the model's own


def kernel_drafts(cfg, target, corpus) -> dict:
    """label -> draft: the float32 target as its own draft, then each of DRAFTS."""
    model = target.model
    with model.cache_set_aside():  # do not deep-copy the target's cache buffers
        same = ModelDraft(model, None, name="target", model=copy.deepcopy(model))
    out = {"target (float32)": same}
    for name in DRAFTS:
        out[name] = build_draft(draft_spec(OmegaConf.load(CONF_DIR / "draft" / f"{name}.yaml")), trial_spec(cfg).target,
                                target, corpus)
    return out


def draft_costs(target_model, drafts: dict, prompt: list[int], k: int, temperature: float, reps: int,
                rounds: int = 7) -> dict:
    """One interleaved run: the 1-char target pass and each draft's k-char proposal (as in
    `measure_cost`). Returns {"target_pass_us": ..., label: {"draft_char_us", "c"}}."""
    gen = torch.Generator().manual_seed(0)
    P = len(prompt)
    positions = prefill(target_model, prompt)
    one = torch.tensor([prompt[-1:]])                                        # (1, 1)
    blocks = {"target": (lambda: target_model(one, positions[P - 1:P]), reps)}
    for label, draft in drafts.items():
        draft.reset()
        blocks[label] = (proposal(draft, prompt, k, temperature, gen), max(1, reps // k))
    t = interleaved_medians(blocks, rounds)
    out = {"target_pass_us": t["target"] * 1e6}
    for label in drafts:
        out[label] = {"draft_char_us": t[label] / k * 1e6, "c": t[label] / k / t["target"]}
    return out


def cost_table(cfg, target, corpus, k: int, repeats: int = 3) -> list[dict]:
    """Per draft: median c and draft us/char over `repeats` interleaved runs, c's [min, max],
    and the draft's packed bytes where it reports them."""
    drafts = kernel_drafts(cfg, target, corpus)
    prompt = target.tokenizer.encode(cfg.prompt).tolist()
    runs = [draft_costs(target.model, drafts, prompt, k, cfg.temperature, cfg.timing.cost_reps) for _ in range(repeats)]
    rows = []
    for label, draft in drafts.items():
        cs = [r[label]["c"] for r in runs]
        rows.append({"draft": label, "c": statistics.median(cs), "c_min": min(cs), "c_max": max(cs),
                     "draft_char_us": statistics.median(r[label]["draft_char_us"] for r in runs),
                     "target_pass_us": statistics.median(r["target_pass_us"] for r in runs),
                     "bytes": draft.describe().get("packed_bytes", 4 * target.model.n_params())})
    return rows


def linear_shapes(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """(label, Linear): one of each distinct (in, out) shape in the model, in model order, then
    d -> 4 d Linears of random weights for d = each of WIDER times d_model."""
    seen, out = set(), []
    for mod in model.modules():
        if isinstance(mod, nn.Linear) and (mod.in_features, mod.out_features) not in seen:
            seen.add((mod.in_features, mod.out_features))
            out.append((f"{mod.in_features} -> {mod.out_features}", mod))
    d = model.cfg.d_model
    for m in WIDER:
        out.append((f"{m * d} -> {4 * m * d} (wider model)", nn.Linear(m * d, 4 * m * d, bias=False)))
    return out


@torch.no_grad()
def linear_table(model: nn.Module, engine: str, reps: int = 200, rounds: int = 7) -> list[dict]:
    """Per Linear shape: float32 and int8-kernel time for one row (1, in), interleaved (`reps`
    calls a block for a 128 -> 512 Linear, proportionally fewer for larger ones). The
    Int8Linear's input range is set to [-4, 4], the row is standard normal (the time does not
    depend on the values)."""
    rows = []
    for label, lin in linear_shapes(model):
        with quantized_engine(engine):
            q = Int8Linear(lin, -4.0, 4.0)
        x = torch.randn(1, lin.in_features, generator=torch.Generator().manual_seed(0))  # (1, in)
        n = max(20, reps * 128 * 512 // (lin.in_features * lin.out_features))  # fewer calls for wider ones
        t = interleaved_medians({"float": (lambda: lin(x), n), "int8": (lambda: q(x), n)}, rounds)
        rows.append({"shape": label, "float_us": t["float"] * 1e6,
                     "int8_us": t["int8"] * 1e6})
    return rows


def log_tables(log, cfg, target, corpus) -> None:
    k = cfg.k
    log.info("draft cost c of copies of the target, k=%d, temperature %s (3 interleaved runs of 7 rounds; "
             "median c and its [min, max]):", k, cfg.temperature)
    log.info("| draft | c | c range | draft us/char | target pass us | weight bytes |")
    log.info("|---|---|---|---|---|---|")
    for r in cost_table(cfg, target, corpus, k):
        log.info("| %s | %.3f | %.3f-%.3f | %.0f | %.0f | %d |", r["draft"], r["c"], r["c_min"], r["c_max"],
                 r["draft_char_us"], r["target_pass_us"], r["bytes"])
    engine = OmegaConf.load(CONF_DIR / "draft" / "int8_kernels.yaml").engine
    log.info("one Linear on one row, float32 vs int8 kernel (engine %s, median of 7 interleaved rounds):", engine)
    log.info("| in -> out | float32 us | int8 us | int8 / float32 |")
    log.info("|---|---|---|---|")
    for r in linear_table(target.model, engine):
        log.info("| %s | %.1f | %.1f | %.2f |", r["shape"], r["float_us"], r["int8_us"], r["int8_us"] / r["float_us"])
