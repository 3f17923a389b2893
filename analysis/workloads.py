"""Will it pay on my prompts? A sweep's answer per workload and category, in Spec-Bench's shape.

Each trial of a workload logs its prompts (prompts.csv: per prompt its category, counters and its
runs in every timing round; src/trial/per_category.py). Here, per cell (the draft and its settings,
the workload apart), k and category, over every seed's trials:

- speedup: the field's benchmark speedup, total baseline time over total speculative time of the
  category's prompts in all seeds (each prompt's time in a trial the median of its rounds);
- chars per pass: the category's emitted chars over its target passes (tau in Spec-Bench);
- intervals at the trials' timing.confidence from a three-stage bootstrap: the seeds drawn with
  replacement, the prompts drawn with replacement (within their categories for the overall
  column; a workload's prompts are the same for every seed), then each drawn (seed, prompt)'s
  rounds: so they hold the spread over prompts, over seeds and the timing noise. The percentile
  interval is widened in log ratio for the few seeds and prompts drawn (src/engine/measuring/intervals.py:
  small_sample_widening, each kind's variance from replicates resampling it alone): unwidened, 3
  seeds of 10 prompts covered a planted population's speedup 85% of the time at 95%, widened 93%
  (tests/analysis/test_analysis_workloads.py). With one seed the seeds' spread is not measured,
  and with one prompt in a category the prompts' is not: the `seeds` and `prompts` columns say so.

`workload_tables` gives, per workload, the table Spec-Bench prints (rows cell x k, a column per
category and overall), and the best k per category with whether it pays (its interval above 1);
`category_frame` is the long form (every number) the tables and the figure read.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from src.engine.measuring.intervals import small_sample_widening, widened

from .sweep_data import cell_labels
from .tables import Table

REPS = 2000    # bootstrap replicates
SEED = 0       # the bootstrap's own generator: the same tables on every run of the report
OVERALL = "overall"


def rounds_of(text) -> np.ndarray:
    """A prompts.csv rounds column ('0.1 0.12 ...') as floats; empty when the trial timed no prompt (a batch)."""
    return np.array([float(x) for x in str(text).split()], dtype=float) if isinstance(text, str) and text else \
        np.zeros(0)


def replicate_medians(b: np.ndarray, s: np.ndarray, reps: int, rng: np.random.Generator):
    """(reps,) medians of a prompt's baseline and speculative rounds, its rounds drawn with
    replacement (a round's two runs together); NaN where it has none."""
    if len(b) == 0:
        return np.full(reps, np.nan), np.full(reps, np.nan)
    picks = rng.integers(0, len(b), size=(reps, len(b)))
    return np.median(b[picks], axis=1), np.median(s[picks], axis=1)


def estimates(g: pd.DataFrame, level: float, reps: int = REPS, seed: int = SEED) -> dict:
    """The speedup and chars per pass of the rows g (one cell, k, and a category or all of them),
    with the bootstrap intervals of the module's docstring."""
    rng = np.random.default_rng(seed)
    seeds = sorted(g["seed"].unique())
    prompts = sorted(g["prompt"].unique())
    strata = g.drop_duplicates("prompt").set_index("prompt")["category"].reindex(prompts).to_numpy()
    S, N = len(seeds), len(prompts)
    si = {v: i for i, v in enumerate(seeds)}
    pi = {v: i for i, v in enumerate(prompts)}
    mb, ms = np.full((S, N, reps), np.nan), np.full((S, N, reps), np.nan)
    b_med, s_med = np.full((S, N), np.nan), np.full((S, N), np.nan)
    chars, passes = np.zeros((S, N)), np.zeros((S, N))
    for row in g.itertuples():
        a, j = si[row.seed], pi[row.prompt]
        b, s = rounds_of(row.baseline_rounds), rounds_of(row.speculative_rounds)
        if len(b):
            b_med[a, j], s_med[a, j] = np.median(b), np.median(s)
            mb[a, j], ms[a, j] = replicate_medians(b, s, reps, rng)
        chars[a, j], passes[a, j] = row.chars, row.target_passes
    seed_picks = rng.integers(0, S, size=(reps, S))                                  # (reps, S)
    prompt_picks = np.empty((reps, N), dtype=int)                                    # (reps, N), within strata
    for stratum in pd.unique(strata):
        members = np.flatnonzero(strata == stratum)
        prompt_picks[:, members] = members[rng.integers(0, len(members), size=(reps, len(members)))]
    every_seed, every_prompt = np.broadcast_to(np.arange(S), (reps, S)), np.broadcast_to(np.arange(N), (reps, N))
    q = (1 - level) / 2

    def interval(point, statistic):
        """The percentile interval of statistic(seeds, prompts) over the replicates, widened for the few
        seeds and prompts drawn (their variances apart: each kind resampled alone)."""
        full = statistic(seed_picks, prompt_picks)
        lo, hi = np.quantile(full, [q, 1 - q])
        parts = [(float(np.var(np.log(statistic(seed_picks, every_prompt)))), S),
                 (float(np.var(np.log(statistic(every_seed, prompt_picks)))), N)]
        return widened(point, float(lo), float(hi), small_sample_widening(parts, level))

    def cpp(seeds, prompts):
        a, j = seeds[:, :, None], prompts[:, None, :]
        return chars[a, j].sum(axis=(1, 2)) / passes[a, j].sum(axis=(1, 2))

    out = {"seeds": S, "prompts": N, "chars per pass": chars.sum() / passes.sum()}
    out["cpp lo"], out["cpp hi"] = interval(out["chars per pass"], cpp)
    if np.isnan(b_med).all():
        return out | {"speedup": np.nan, "lo": np.nan, "hi": np.nan}
    r_idx = np.arange(reps)[:, None, None]

    def speed(seeds, prompts):
        a, j = seeds[:, :, None], prompts[:, None, :]
        return np.nansum(mb[a, j, r_idx], axis=(1, 2)) / np.nansum(ms[a, j, r_idx], axis=(1, 2))

    out["speedup"] = np.nansum(b_med) / np.nansum(s_med)
    out["lo"], out["hi"] = interval(out["speedup"], speed)
    return out


def category_frame(prompts: pd.DataFrame, level: float, reps: int = REPS) -> pd.DataFrame:
    """One row per (workload, cell, k, category), the category `overall` too: every number of the tables."""
    if prompts.empty:
        return pd.DataFrame()
    prompts = prompts.assign(cell=cell_labels(prompts, leave_out=("workload",)))
    rows = []
    for (workload, cell, k), g in prompts.groupby(["workload", "cell", "k"], sort=True):
        categories = list(dict.fromkeys(g["category"]))
        for category in categories + ([OVERALL] if len(categories) > 1 else []):
            part = g if category == OVERALL else g[g["category"] == category]
            rows.append({"workload": workload, "cell": cell, "k": int(k), "category": category,
                         **estimates(part, level, reps)})
    return pd.DataFrame(rows)


def interval_text(m, lo, hi) -> str:
    return "" if pd.isna(m) else f"{m:.2f} [{lo:.2f}-{hi:.2f}]"


def workload_table(frame: pd.DataFrame, workload: str) -> Table:
    """Spec-Bench's table for one workload: rows cell x k, per category (and overall) the speedup
    with its interval and the chars per pass."""
    f = frame[frame["workload"] == workload]
    categories = list(dict.fromkeys(f["category"]))
    rows = []
    for (cell, k), g in f.groupby(["cell", "k"], sort=True):
        by = g.set_index("category")
        row = {"draft": cell, "k": k}
        for c in categories:
            if c in by.index:
                r = by.loc[c]
                row[c] = interval_text(r["speedup"], r["lo"], r["hi"])
                row[f"{c} cpp"] = r["chars per pass"]
        row["seeds"] = int(g["seeds"].max())
        rows.append(row)
    df = pd.DataFrame(rows)
    prompts = f.drop_duplicates("category").set_index("category")["prompts"]
    counts = ", ".join(f"{c} {int(prompts[c])}" for c in categories if c != OVERALL)
    return Table(f"workload_{workload}", f"Speedup per category: workload {workload}", df,
                 {f"{c} cpp": ".2f" for c in categories},
                 f"Prompts per category: {counts}. Per category: the speedup (total baseline time over total "
                 "speculative time of its prompts in every seed, each prompt's time the median of its rounds) "
                 "[its interval: seeds, then prompts (within categories for overall), then rounds resampled] and "
                 "cpp, the chars per target pass (Spec-Bench's tau). One seed: the seeds' spread is not in the "
                 "interval; one prompt in a category: the prompts' spread is not. A batch > 1 times batches, not "
                 "prompts: its columns hold chars per pass only.")


def verdict(lo, hi) -> str:
    if pd.isna(lo):
        return "not timed"
    return "pays" if lo > 1 else "slower" if hi < 1 else "not shown"


def best_k_table(frame: pd.DataFrame) -> Table:
    """Per workload, cell and category: the k of the largest speedup, its interval and whether it pays."""
    rows = []
    for (workload, cell, category), g in frame.groupby(["workload", "cell", "category"], sort=False):
        timed = g.dropna(subset=["speedup"])
        if timed.empty:
            continue
        best = timed.loc[timed["speedup"].idxmax()]
        rows.append({"workload": workload, "draft": cell, "category": category, "best k": int(best["k"]),
                     "speedup": best["speedup"], "lo": best["lo"], "hi": best["hi"],
                     "verdict": verdict(best["lo"], best["hi"]), "k tried": len(timed)})
    return Table("best_k_per_category", "Best k per category", pd.DataFrame(rows),
                 {"speedup": ".2f", "lo": ".2f", "hi": ".2f"},
                 "The k with the largest measured speedup in each category (its interval as in the workload "
                 "tables; the best of several k is picked with its luck: compare the neighbours' intervals before "
                 "calling it best); pays: the interval lies above 1.")


def workload_tables(frame: pd.DataFrame) -> list[Table]:
    if frame.empty:
        return []
    return [workload_table(frame, w) for w in sorted(frame["workload"].unique())] + [best_k_table(frame)]
