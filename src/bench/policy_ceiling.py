"""How much can any draft-length policy gain over the best fixed k? (printed, never asserted):
`make bench-ceiling`.

Chains of `--cap` drafts are drawn at prefixes of text sampled from the default target
(`chain_acceptance`: `--seqs` sequences of `--chars` chars at T = 1, a chain every `--every`
chars). Per chain c and drafted position j they give r_cj, the chance the acceptance test keeps
draft j once reached (min(1, p/q) of the drawn char), and beta_cj = sum_x min(p, q), its
expectation before the char is drawn. Given the chain, a pass that drafts i chars emits
    E_c(i) = 1 + sum_{j<=i} r_c1 ... r_cj
chars on average and, in units of a one-char target pass, costs T(i) = 1 + o + price i (the
verify pass's marginal cost b plus the draft's cost c per char: `--prices`; o: the loop's own
work per pass, `--overhead`). A rule that picks a length per chain runs at
    rate = sum_c E_c(len_c) / sum_c T(len_c)
chars per unit (chars per second over many passes: a ratio of sums). Rows, each against the
best fixed k <= cap at that price:
- informed: the cost policy's greedy rule (src/engine/decoding/policy.py: stop at the first char that
  lowers the pass's rate) with the exact expectations beta in place of the calibrated map: the
  best a draft that knew its acceptance before drawing each char could do with that rule;
- oracle: the best length per chain knowing r, found by Dinkelbach's iteration on the ratio: a
  ceiling for any rule that reads the drawn chain and the target's distributions (every rule
  that reads only the draft's information is one of them), short of the uniforms (a rule that
  reads those changes the output law).
The chains start at uniform positions of target text, not at the loop's own pass starts
(src/engine/measuring/acceptance.py: on the medium target that overstated chars per pass by 2-7%); the
ratios between rules are what this reads.

    python -m src.bench.policy_ceiling
    python -m src.bench.policy_ceiling --drafts ngram,distilled --prices 0.065,0.3 --cap 16
"""
from __future__ import annotations

import sys
import time

import torch

from ..engine.measuring.acceptance import chain_acceptance, sample_text
from ..door import ArgParser, at_least, command, compose, refuse
from ..engine.errors import SpecsweepError
from ..trial.load import build_draft, load_target
from ..trial.spec import trial_spec


def pass_chars(r: torch.Tensor) -> torch.Tensor:
    """E_c(i) for i = 0..K: (C, K) -> (C, K + 1), E_c(0) = 1 (the residual or bonus char)."""
    kept = torch.cumprod(r.double(), 1)                                              # (C, K): r_c1 ... r_ci
    return torch.cat([torch.ones_like(kept[:, :1]), 1 + kept.cumsum(1)], 1)          # (C, K + 1)


def pass_cost(cap: int, price: float, overhead: float) -> torch.Tensor:
    """T(i) = 1 + o + price i for i = 0..cap: (cap + 1,)."""
    return 1 + overhead + price * torch.arange(cap + 1, dtype=torch.float64)


def lengths_rate(r: torch.Tensor, lengths: torch.Tensor, price: float, overhead: float) -> float:
    """sum_c E_c(len_c) / sum_c T(len_c), lengths (C,) in 1..K."""
    E, T = pass_chars(r), pass_cost(r.shape[1], price, overhead)
    return float(E.gather(1, lengths[:, None])[:, 0].sum() / T[lengths].sum())


def fixed_rates(r: torch.Tensor, price: float, overhead: float) -> torch.Tensor:
    """(K,): the rate of drafting k chars every pass, k = 1..K."""
    E, T = pass_chars(r), pass_cost(r.shape[1], price, overhead)
    return E[:, 1:].mean(0) / T[1:]


def greedy_lengths(guide: torch.Tensor, price: float, overhead: float) -> torch.Tensor:
    """(C,) lengths in 1..K by the cost policy's rule with `guide` (C, K) as each char's acceptance:
    after i chars, draft char i + 1 iff it raises the estimated rate E(i) / T(i), that is iff
    S_i g_{i+1} T(i) > price E(i) (S_i = g_1 ... g_i, E(i) = 1 + S_1 + ... + S_i); at least one."""
    C, K = guide.shape
    g = guide.double()
    S = torch.cumprod(g, 1)                                                          # (C, K)
    E = 1 + S.cumsum(1)                                                              # (C, K): E(i), i = 1..K
    T = pass_cost(K, price, overhead)[1:]                                            # (K,): T(i)
    go_on = S[:, :-1] * g[:, 1:] * T[:-1] > price * E[:, :-1]                        # (C, K - 1): draft char i + 1?
    stops = torch.cat([~go_on, torch.ones(C, 1, dtype=torch.bool)], 1)               # (C, K): stop after char i
    return stops.int().argmax(1) + 1                                                 # the first stop


def oracle_lengths(r: torch.Tensor, price: float, overhead: float, max_iter: int = 100) -> torch.Tensor:
    """(C,) lengths in 1..K maximising sum_c E_c(len_c) / sum_c T(len_c) (Dinkelbach: for a rate
    lam, each chain takes argmax_i E_c(i) - lam T(i); lam becomes the rate of those lengths; it
    rises until it stops changing, at the optimum)."""
    E, T = pass_chars(r)[:, 1:], pass_cost(r.shape[1], price, overhead)[1:]         # (C, K), (K,)
    lam = float((E.mean(0) / T).max())                                               # the best fixed k's rate
    for _ in range(max_iter):
        pick = (E - lam * T).argmax(1)                                               # (C,): length - 1
        new = float(E.gather(1, pick[:, None]).sum() / T[pick].sum())
        lengths = pick + 1
        if new <= lam * (1 + 1e-12):
            return lengths
        lam = new
    return lengths


def ceiling_rows(name: str, r: torch.Tensor, beta: torch.Tensor, prices: list[float], overhead: float) -> list[dict]:
    rows = []
    for price in prices:
        fixed = fixed_rates(r, price, overhead)
        best_k = int(fixed.argmax()) + 1
        informed = greedy_lengths(beta, price, overhead)
        oracle = oracle_lengths(r, price, overhead)
        rows.append({"draft": name, "beta": float(beta[:, 0].mean()), "price": price, "best k": best_k,
                     "fixed": float(fixed.max()),
                     "informed": lengths_rate(r, informed, price, overhead), "informed len": float(informed.double().mean()),
                     "oracle": lengths_rate(r, oracle, price, overhead), "oracle len": float(oracle.double().mean())})
    return rows


def main() -> None:
    ap = ArgParser(prog="python -m src.bench.policy_ceiling", description=__doc__.splitlines()[0])
    ap.add_argument("--drafts", default="bigram,ngram,distilled,int8")
    ap.add_argument("--prices", default="0.065,0.15,0.3,0.6",
                    help="b + c per drafted char, in one-char target passes (0.065: the table drafts on eager)")
    ap.add_argument("--overhead", type=float, default=0.1, help="o: the loop's own work per pass, in one-char passes")
    ap.add_argument("--cap", type=at_least(1), default=16)
    ap.add_argument("--seqs", type=at_least(1), default=32)
    ap.add_argument("--chars", type=at_least(1), default=200)
    ap.add_argument("--every", type=at_least(1), default=4)
    ap.add_argument("--seed", type=at_least(0), default=0)
    args = ap.parse_args()
    try:
        prices = [float(x) for x in args.prices.split(",") if x]
    except ValueError:
        refuse(f"--prices takes numbers, got {args.prices!r}")
    if not prices or min(prices) < 0 or args.overhead < 0:
        refuse("--prices and --overhead must be >= 0")
    names = [d for d in args.drafts.split(",") if d]
    if not names:
        refuse("--drafts names no draft")
    rows, target, specs = [], None, []
    try:
        for name in names:   # every draft's config checked before the target is loaded
            cfg = compose([f"draft={name}"])
            specs.append((name, cfg, trial_spec(cfg)))
            room = specs[-1][2].target.model["block_size"] - len(cfg.prompt) - args.cap
            if room < 1:
                refuse(f"--cap {args.cap} leaves no room in the context window of {specs[-1][2].target.model['block_size']} "
                       f"after the prompt ({len(cfg.prompt)} chars)")
        for name, cfg, spec in specs:
            if target is None:   # one target and one sampled text for every draft (only the draft differs)
                torch.set_num_threads(spec.threads)
                corpus, target = load_target(spec.target, progress=False)
                prompt = target.tokenizer.encode(cfg.prompt).tolist()
                n = min(args.chars, target.model.cfg.block_size - len(prompt) - args.cap)
                seq, _ = sample_text(target.model, prompt, args.seqs, n, args.seed)
            draft = build_draft(spec.draft, spec.target, target, corpus)
            t0 = time.perf_counter()
            r, beta = chain_acceptance(target.model, draft, seq, n, args.cap, 1.0, args.seed + 1, args.every)
            print(f"{name}: {r.shape[0]} chains of {args.cap} ({time.perf_counter() - t0:.0f} s)", flush=True)
            rows += ceiling_rows(name, r, beta, prices, args.overhead)
    except SpecsweepError as e:
        refuse(str(e))
    print(f"\nT = 1, cap {args.cap}, o = {args.overhead}; rates in chars per one-char target pass; "
          "gains against the best fixed k at the same price")
    print("\n| draft | beta_1 | b + c | best fixed k | fixed | informed rule (mean len) | oracle (mean len) |")
    print("|---|---:|---:|---:|---:|---|---|")
    for x in rows:
        print(f"| {x['draft']} | {x['beta']:.3f} | {x['price']:.3f} | {x['best k']} | {x['fixed']:.3f} | "
              f"{x['informed']:.3f}, {x['informed'] / x['fixed'] - 1:+.1%} ({x['informed len']:.1f}) | "
              f"{x['oracle']:.3f}, {x['oracle'] / x['fixed'] - 1:+.1%} ({x['oracle len']:.1f}) |")


if __name__ == "__main__":
    sys.exit(command(main))
