"""The answer per regime: a sweep over engines and batch sizes, analysed one regime at a time.

A regime is an (engine, batch) pair. Each regime's trials get a report of their own (the cost
model's verify-cost line and loop overheads fitted on that regime's trials alone, its pays map),
and the tables here put the regimes side by side:

- `regimes_table`: each draft's best measured k per regime, with its interval (with 2 seeds or more
  in every k the seed bootstrap's for the best of the k: bounds holding for all its k at once) and
  verdict.
- `batch_table`: each draft's best cell against the batch size B per engine, and its break-even
  batch (`break_even`): where its best speedup falls below 1x.
- `verify_cost_table`: what a verify pass costs per engine and B, tv(B, k+1) / t(B, 1).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from .sweep_data import SweepData, cell_labels
from .seed_bootstrap import best_cell_interval_seeds, seed_groups
from .tables import Table


@dataclass(frozen=True, order=True)
class Regime:
    engine: str
    batch: int

    @property
    def name(self) -> str:
        """The regime's folder in a report: the engine, with -B<batch> for a batch of several sequences."""
        return self.engine if self.batch == 1 else f"{self.engine}-B{self.batch}"


def regimes_of(data: SweepData) -> list[Regime]:
    """The regimes of the sweep's finished trials (eager at batch 1 for trials from before the axes)."""
    fin = data.finished
    if fin.empty:
        return [Regime("eager", 1)]
    engine = fin["engine"] if "engine" in fin.columns else pd.Series("eager", index=fin.index)
    batch = fin["batch"] if "batch" in fin.columns else pd.Series(1, index=fin.index)
    return sorted({Regime(str(e), int(b)) for e, b in zip(engine.fillna("eager"), batch.fillna(1))})


def only_regime(data: SweepData, regime: Regime) -> SweepData:
    """The sweep's trials (and their pairs) of one regime."""
    t = data.trials
    engine = t["engine"].fillna("eager") if "engine" in t.columns else pd.Series("eager", index=t.index)
    batch = t["batch"].fillna(1) if "batch" in t.columns else pd.Series(1, index=t.index)
    trials = t[(engine == regime.engine) & (batch == regime.batch)].reset_index(drop=True)
    pairs = data.pairs[data.pairs["run_id"].isin(trials["run_id"])].reset_index(drop=True)
    return SweepData(data.sweep, trials, data.unplaced, pairs)


def verdict(lo: float, hi: float) -> str:
    return "pays" if lo > 1 else "slower" if hi < 1 else "not demonstrated"


def regimes_table(cells: dict[Regime, pd.DataFrame], pairs: dict[Regime, pd.DataFrame] | None = None,
                  level: float = 0.95) -> Table:
    """Per draft and regime, the best measured k with its interval, and whether it pays
    (the interval above 1), does not (below 1) or is not demonstrated (it straddles 1).
    cells: each regime's report cells (draft, k, measured, lo, hi); pairs: each regime's pairs
    (draft, k, seed, ratio). Where every k of the draft has two seeds or more, the interval is the
    one for the best of its k (`seed_bootstrap.best_cell_interval_seeds` at `level`: the largest of
    bounds holding for all its k at once); otherwise (one seed, or no pairs given) the chosen cell's
    own."""
    rows = []
    for regime, c in cells.items():
        c = c.dropna(subset=["measured"])
        groups = seed_groups(pairs[regime]) if pairs is not None and len(pairs[regime]) else {}
        for draft, g in c.groupby(cell_labels(c, leave_out=("engine", "batch")), sort=True):   # the label, less the regime
            best = g.loc[g["measured"].idxmax()]
            per_k = [groups.get((label, int(k)), []) for label, k in zip(g["draft"], g["k"])]
            lo, hi = best["lo"], best["hi"]
            if per_k and min(len(s) for s in per_k) >= 2:
                lo, hi = best_cell_interval_seeds(per_k, level)
            rows.append({"draft": draft, "engine": regime.engine, "batch": regime.batch, "best k": int(best["k"]),
                         "speedup": best["measured"], "lo": lo, "hi": hi, "verdict": verdict(lo, hi)})
    df = pd.DataFrame(rows, columns=["draft", "engine", "batch", "best k", "speedup", "lo", "hi", "verdict"])
    return Table("regimes", "The answer per regime: each draft at its best measured k", df,
                 {"speedup": ".2f", "lo": ".2f", "hi": ".2f"},
                 "Each regime (engine, batch) analysed on its own (one report per regime, in its folder: its cost "
                 "model and verify-cost line fitted on that regime's trials alone); speedup: the pooled median over "
                 "all pairs of the cell's seeds (at batch > 1 the throughput speedup: chars per second over all "
                 "sequences), lo-hi its interval at the trials' confidence: with two seeds or more in every k, the "
                 "seed bootstrap's for the best of the draft's k (the largest of bounds that hold for all its k at "
                 "once, so picking the luckiest k is not read as a gain); with one seed the chosen cell's own.")


def crossing(bs: list[int], values: list[float]) -> float:
    """The first batch size where `values` (one per B in `bs`, ascending) fall below 1, linear in
    log2 B between the last grid point at or above 1 and the first below it: bs[0] / 2 when the
    first is already below 1 (below the grid), inf when none is (beyond the grid)."""
    for i, v in enumerate(values):
        if v < 1:
            if i == 0:
                return bs[0] / 2
            x0, x1, y0, y1 = math.log2(bs[i - 1]), math.log2(bs[i]), values[i - 1], v
            return 2 ** (x0 + (y0 - 1) / (y0 - y1) * (x1 - x0))
    return math.inf


def break_even(bs: list[int], median: list[float], lo: list[float], hi: list[float]) -> tuple[float, float, float]:
    """(B*, from, to): where the best speedup's median, its interval's lower end and its upper end
    first fall below 1 (`crossing`). The lower end crosses first, the upper end last: [from, to]
    is the range of B where the measured intervals leave it open whether the draft still pays. It
    joins pointwise intervals, one per grid B, not a joint band over B."""
    return crossing(bs, median), crossing(bs, lo), crossing(bs, hi)


def batch_label(b: float, grid: list[int]) -> str:
    if math.isinf(b):
        return f"> {grid[-1]}"
    if b < grid[0]:
        return f"< {grid[0]}"
    return f"{b:.0f}"


def break_even_rows(regimes: pd.DataFrame, keys: tuple[str, ...] = ("draft", "engine"),
                    value: str = "speedup") -> pd.DataFrame:
    """Per group of `keys` (draft and engine) measured at two batch sizes or more: the grid `bs`, and
    `break_even`'s point, first and last (numbers: bs[0] / 2 below the grid, inf beyond it) from the
    column `value` per B (the regimes table's best speedup; analysis.prediction gives its best
    prediction) and its interval lo-hi. With two seeds or more in every cell that interval
    is the seed bootstrap's for the best of the k at that B, so the range [first, last] is a seed
    bootstrap interval for the break-even batch: on planted sweeps (three equal k per B, 5 seeds) it
    held the true break-even in 98-100 of 100 (about 1.4 doublings of B wide), where the percentile
    interval of the break-even re-estimated in each replicate (the best k chosen anew) held it in
    37-48, centred on the picked k's upward luck (tests/analysis/test_analysis_batch.py). Joined
    pointwise intervals are conservative for a crossing: pooled intervals without the seed stage
    held it in 98-100 too."""
    rows = []
    for group, g in regimes.groupby(list(keys), sort=True):
        if g["batch"].nunique() < 2:
            continue
        g = g.sort_values("batch")
        bs = g["batch"].astype(int).tolist()
        point, first, last = break_even(bs, g[value].tolist(), g["lo"].tolist(), g["hi"].tolist())
        rows.append({**dict(zip(keys, group)), "bs": bs, "point": point, "first": first, "last": last})
    return pd.DataFrame(rows, columns=[*keys, "bs", "point", "first", "last"])


def batch_table(regimes: pd.DataFrame) -> Table | None:
    """Per draft and engine: the best cell's speedup at each batch size, and the break-even batch
    (`break_even_rows`). regimes: the regimes table's frame. None when the sweep has one batch size only."""
    if regimes.empty or regimes["batch"].nunique() < 2:
        return None
    rows = []
    ends = break_even_rows(regimes).set_index(["draft", "engine"])
    for (draft, engine), g in regimes.groupby(["draft", "engine"], sort=True):
        g = g.sort_values("batch")
        bs = g["batch"].astype(int).tolist()
        row = {"draft": draft, "engine": engine}
        for b, (_, r) in zip(bs, g.iterrows()):
            row[f"B={b}"] = f"{r['speedup']:.2f} [{r['lo']:.2f}-{r['hi']:.2f}] k={r['best k']}"
        if (draft, engine) in ends.index:
            e = ends.loc[(draft, engine)]
            row["break-even B"] = (f"{batch_label(e['point'], bs)} [{batch_label(e['first'], bs)} - "
                                   f"{batch_label(e['last'], bs)}]")
        else:
            row["break-even B"] = ""   # one batch size
        rows.append(row)
    df = pd.DataFrame(rows)
    return Table("batch", "Speedup against the batch size: each draft at its best k per B", df, {},
                 "Each entry: the best measured cell at that batch size (throughput speedup, pooled median over "
                 "all pairs of its seeds, its interval, its k: with two seeds or more the seed bootstrap's for the "
                 "best of the k). Break-even B: where the best speedup falls below 1x, linear in log2 B between the "
                 "grid's batch sizes; in brackets where the interval's lower and upper ends fall below 1 (pointwise "
                 "intervals joined, not a band: conservative for the crossing, it held a planted break-even in "
                 "98-100 of 100 planted sweeps); '> B' it pays at every B of the grid, '< B' at none.")


def verify_cost_table(finished: pd.DataFrame) -> Table | None:
    """Per engine and batch size: the median over trials of tv(B, k+1) / t(B, 1) at each k."""
    need = {"verify_pass_us", "target_pass_us", "k"}
    if finished.empty or not need <= set(finished.columns):
        return None
    t = finished.assign(engine=finished["engine"].fillna("eager") if "engine" in finished else "eager",
                        batch=finished["batch"] if "batch" in finished else 1,
                        ratio=finished["verify_pass_us"] / finished["target_pass_us"])
    t = t[t["tree"] == ""] if "tree" in t else t
    if t.empty:
        return None
    df = t.pivot_table(index=["engine", "batch"], columns="k", values="ratio", aggfunc="median")
    df.columns = [f"k={k}" for k in df.columns]
    return Table("verify_cost", "Verify cost: tv(B, k+1) / t(B, 1) per engine and batch size", df.reset_index(),
                 {c: ".2f" for c in df.columns},
                 "A (B, k+1) verify pass over a (B, 1) pass, the median over the trials of each cell (chains). "
                 "Near 1: verifying k drafts costs about one decoding step (the overhead-bound regime); near k+1: "
                 "a verify pass costs its chars (the arithmetic-bound regime).")


def speedup_by_batch(regimes: pd.DataFrame) -> pd.DataFrame:
    """The regimes table's rows with more than one batch size per (draft, engine), for the figure."""
    sizes = regimes.groupby(["draft", "engine"])["batch"].transform("nunique")
    return regimes[sizes > 1].sort_values(["engine", "draft", "batch"])

