"""Table drafts on the default target (printed, never asserted): `make bench-drafts`.

For each table draft (ngram, distilled) and context length (`--orders`), one row:
- acceptance: the mean over positions of sum_x min(p, q), the exact per-position acceptance, on
  text sampled from the target at T=1 (`--seqs` sequences of `--chars` chars after the prompt;
  p is the distribution each char was sampled from, q the draft's `probs` there);
- c: the draft's time per drafted char / one target pass (`measure_cost`, k = `k` of the config:
  repeated proposals after the prompt, so the rows it needs are memoized: the warm cost);
- cold us/char: a stream over the sampled text with the memos cleared first, each context looked up
  once in order, as fresh text meets them (rows built on first use: the cold cost), through
  `propose` at T = 1 (one char: a mixture row and a draw, as in the hot loop), and the share
  of those lookups that built a row; "dense row / cold": the same stream through `next_probs`
  (a dense row of V floats, the path of other temperatures), over the cold time: measured side by side;
- table MB, contexts, and the build time; last, the process's peak resident memory (the target,
  the sampled text, the forward's (N, V) distributions and the largest build, all rows together).
  For the distilled draft the target's forward over the first distill_chars chars (null: the whole
  training split) runs once (with every core, as in a build) and is shown apart; each
  order's row shows the table's own build time on top of it.
The bigram draft is the reference row. Nothing is written to the draft cache.

    python -m src.bench.drafts                                    # orders 1-8 of both
    python -m src.bench.drafts --orders 4,6 distilled.distill_chars=400000 distilled.beta=2
    python -m src.bench.drafts --drafts ngram k=2 threads=1         # Hydra overrides of the config

`ngram.KEY=VALUE` / `distilled.KEY=VALUE` override that draft's conf/draft file; any other
`KEY=VALUE` overrides the main config.
"""
from __future__ import annotations

import resource
import sys
import time

import torch
import yaml
from omegaconf import OmegaConf

from ..engine.measuring.acceptance import mean_overlap, sample_text
from ..engine.drafts import DistilledDraft, NgramDraft
from ..engine.drafts.distilled import target_probs
from ..door import ArgParser, at_least, command, compose, refuse
from ..engine.errors import SpecsweepError
from ..engine.measuring.measure import measure_cost
from ..engine.models.train import all_cores
from ..paths import CONF_DIR
from ..trial.load import build_draft, load_target, train_ids_of
from ..trial.spec import draft_spec, trial_spec

TABLE_DRAFTS = ("ngram", "distilled")


def cold_stream(draft, seq: torch.Tensor, n: int, mixture: bool) -> tuple[float, float]:
    """(us per looked-up context, share of lookups that built a row) over the sampled text in order,
    memos cleared first. mixture: each lookup is `propose` of one char at T = 1 (the hot loop's
    path: a mixture row and a draw); else `next_probs` at T = 1 (a dense row of V floats)."""
    draft.clear_memos()
    rows = seq.tolist()
    P = seq.shape[1] - n
    built, gen = 0, torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    for r in rows:
        for t in range(P, P + n):
            before = draft.memo_size(1.0 if mixture else None)
            if mixture:
                draft.propose(r[:t], 1, 1.0, gen)
            else:
                draft.next_probs(r[:t], 1.0)
            built += draft.memo_size(1.0 if mixture else None) != before
    total = len(rows) * n
    return (time.perf_counter() - t0) / total * 1e6, built / total


def draft_row(label, order, draft, target, prompt, cfg, seq, p, n, build_s) -> dict:
    cost = measure_cost(target, draft, prompt, cfg.k, 1.0, cfg.timing.cost_reps, cfg.device)
    nan = (float("nan"), float("nan"))
    cold_us, built = cold_stream(draft, seq, n, mixture=True) if hasattr(draft, "clear_memos") else nan
    dense_us, _ = cold_stream(draft, seq, n, mixture=False) if hasattr(draft, "clear_memos") else nan
    table_bytes = draft.table_bytes() if hasattr(draft, "table_bytes") else draft.describe().get("table_bytes", 0)
    return {"draft": label, "order": order, "acceptance": mean_overlap(draft, seq, p), "c": cost["c"],
            "draft_us": cost["draft_char_us"], "cold_us": cold_us, "cold_c": cold_us / cost["target_pass_us"],
            "dense_us": dense_us, "built": built, "mb": table_bytes / 1e6,
            "contexts": len(getattr(draft, "codes", ())), "build_s": build_s}


def parse_orders(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def main() -> None:
    ap = ArgParser(prog="python -m src.bench.drafts", description=__doc__.splitlines()[0])
    ap.add_argument("--orders", default="1-8", help="context lengths, e.g. 1-8 or 4,6")
    ap.add_argument("--drafts", default=",".join(TABLE_DRAFTS))
    ap.add_argument("--seqs", type=at_least(1), default=24, help="sampled sequences (positions = seqs x chars)")
    ap.add_argument("--chars", type=at_least(1), default=200, help="chars sampled per sequence")
    ap.add_argument("--seed", type=at_least(0), default=0)
    ap.add_argument("overrides", nargs="*", help="KEY=VALUE (config) or ngram.KEY=VALUE / distilled.KEY=VALUE")
    args = ap.parse_args()
    drafts = [d for d in args.drafts.split(",") if d]
    if any(d not in TABLE_DRAFTS for d in drafts):
        refuse(f"--drafts takes {', '.join(TABLE_DRAFTS)}")
    try:
        orders = parse_orders(args.orders)
    except ValueError:
        orders = []
    if not orders or min(orders) < 1:
        refuse(f"--orders takes context lengths >= 1, e.g. 1-8 or 4,6; got {args.orders!r}")
    draft_cfgs = {d: OmegaConf.load(CONF_DIR / "draft" / f"{d}.yaml") for d in TABLE_DRAFTS}
    main_overrides = []
    for o in args.overrides:
        head, _, rest = o.partition(".")
        if head in draft_cfgs and "=" in rest:
            key, _, value = rest.partition("=")
            OmegaConf.update(draft_cfgs[head], key, yaml.safe_load(value))
        else:
            main_overrides.append(o)

    try:
        cfg = compose(main_overrides)
        spec = trial_spec(cfg)
        for d in drafts:   # each draft's options (ngram.KEY=VALUE ...) checked before the target is loaded
            draft_spec(draft_cfgs[d], cfg)
        torch.set_num_threads(spec.threads)
        corpus, target = load_target(spec.target)
    except SpecsweepError as e:
        refuse(str(e))
    model, ids = target.model, train_ids_of(spec.target, target, corpus)
    prompt = target.tokenizer.encode(cfg.prompt).tolist()
    n = min(args.chars, model.cfg.block_size - len(prompt))
    t0 = time.perf_counter()
    seq, p = sample_text(model, prompt, args.seqs, n, args.seed)
    print(f"target {target.key}: {args.seqs} x {n} = {args.seqs * n} positions sampled at T=1 "
          f"({time.perf_counter() - t0:.1f} s); train split {len(ids)} chars; threads {cfg.threads}; k={cfg.k}")

    rows = []
    t0 = time.perf_counter()
    bigram = build_draft(draft_spec(OmegaConf.load(CONF_DIR / "draft" / "bigram.yaml")), spec.target, target, corpus)
    rows.append(draft_row("bigram", 1, bigram, model, prompt, cfg, seq, p, n, time.perf_counter() - t0))
    for name in drafts:
        settings = {k: v for k, v in OmegaConf.to_container(draft_cfgs[name]).items() if k not in ("_target_", "order")}
        label = settings.pop("name", name)
        print(f"{label}: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
        if name == "ngram":
            def make(order):
                return NgramDraft(model, ids, name=label, order=order, **settings)
        else:
            chars = ids[:settings["distill_chars"]]               # null: the whole split
            t0 = time.perf_counter()
            with all_cores():
                dist_p = target_probs(model, chars)
            print(f"distilled: the target's forward over {len(chars)} chars took {time.perf_counter() - t0:.1f} s "
                  f"with {torch.get_num_threads()} -> all cores")

            class Prebuilt(DistilledDraft):   # the same table, from the forward done once above
                def _build(self, target, train_ids):
                    return self.table_from(chars, dist_p)

            def make(order):
                return Prebuilt(model, ids, name=label, order=order, **settings)
        for order in orders:
            t0 = time.perf_counter()
            try:
                d = make(order)
            except ValueError as e:
                print(f"{name} order {order}: {e}")
                continue
            rows.append(draft_row(label, order, d, model, prompt, cfg, seq, p, n, time.perf_counter() - t0))
            r = rows[-1]
            print(f"  {name} order {order}: acceptance {r['acceptance']:.4f}, {r['mb']:.1f} MB", flush=True)

    print("\n| draft | context chars | acceptance | c (warm) | draft us/char | cold us/char | cold c | "
          "dense row / cold | rows built | table MB | contexts | build s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['draft']} | {r['order']} | {r['acceptance']:.4f} | {r['c']:.4f} | {r['draft_us']:.2f} | "
              f"{r['cold_us']:.1f} | {r['cold_c']:.3f} | {r['dense_us'] / r['cold_us']:.2f} | {r['built']:.0%} | "
              f"{r['mb']:.2f} | {r['contexts']} | {r['build_s']:.1f} |")
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024    # Linux: kilobytes
    print(f"\npeak resident memory of this process: {peak_mb:.0f} MB")


if __name__ == "__main__":
    sys.exit(command(main))
