"""A workload's answer per prompt and per category: counters, speedups, intervals over prompts.

A trial over a workload (src/trial/workload.py) has, per prompt, its counter run and its runs in
each timing round (src/engine/measuring/timing.py: paired_workload_timing). From them:

- per prompt (`prompt_rows`, the trial's `prompts.csv`): its counters, and its baseline and
  speculative times (the median over rounds of its own runs, every round's run listed too);
- per category, metrics named `<name>.<category>` (`category_metrics`): the counters of its
  prompts pooled (acceptance, position_acceptance, chars_per_pass, target_passes, prompts) and its
  speedup as the field takes a benchmark's, the total baseline time of its prompts over their
  total speculative time (each prompt's time the median over rounds), with an interval from a
  two-stage bootstrap (`prompt_bootstrap`): the category's prompts drawn with replacement, then
  each drawn prompt's rounds, widened for few prompts; so it holds the spread over prompts as well
  as the timing noise
  (one trial has one seed: the spread over seeds is the analysis's, analysis/workloads.py);
- for the whole workload the same total-time speedup and interval (`speedup_prompts`, prompts
  drawn within their categories), beside the trial's usual `speedup_median` (the median over
  rounds of a round's total time ratio, its interval the timing noise alone).
"""
from __future__ import annotations

import statistics

import numpy as np

from ..engine.decoding.decode import Generation, pooled
from ..engine.measuring.formula import seed_speedup
from ..engine.measuring.intervals import small_sample_widening, widened
from ..engine.measuring.timing import PairedTiming
from .workload import Prompt, categories, metric_name

REPS = 2000     # bootstrap replicates
SEED = 0        # the bootstrap's own generator: a trial's intervals are the same on every run of its data


def prompt_times(timing: PairedTiming) -> tuple[np.ndarray, np.ndarray]:
    """((N, R) baseline, (N, R) speculative) seconds: prompt i's run in round r."""
    return np.array(timing.prompt_baseline_s, dtype=float), np.array(timing.prompt_speculative_s, dtype=float)


def total_time_speedup(b: np.ndarray, s: np.ndarray) -> float:
    """Total baseline time over total speculative time, each prompt's time its median over rounds."""
    return float(np.median(b, axis=1).sum() / np.median(s, axis=1).sum())


def prompt_bootstrap(b: np.ndarray, s: np.ndarray, strata: list[int], level: float, reps: int = REPS,
                     seed: int = SEED) -> tuple[float, float]:
    """The interval at `level` for `total_time_speedup`: the percentile interval of replicates that
    draw, within each stratum (category), as many prompts as it has with replacement, then for each
    drawn prompt its R rounds with replacement (a round's B and S runs stay together); widened in log
    ratio for the few prompts (src/engine/measuring/intervals.py: small_sample_widening), as a mean of few units
    follows Student's t (unwidened, 16 prompts covered a planted workload's speedup 92% of the time
    at 95%; tests/trial/test_workload.py)."""
    rng = np.random.default_rng(seed)
    n, r = b.shape
    strata = np.asarray(strata)
    picks = np.empty((reps, n), dtype=int)                                  # (reps, N): the prompts drawn
    for stratum in np.unique(strata):
        members = np.flatnonzero(strata == stratum)
        picks[:, members] = members[rng.integers(0, len(members), size=(reps, len(members)))]
    rounds = rng.integers(0, r, size=(reps, n, r))                          # (reps, N, R): their rounds
    bb = np.median(b[picks[..., None], rounds], axis=2).sum(axis=1)        # (reps,)
    ss = np.median(s[picks[..., None], rounds], axis=2).sum(axis=1)
    q = (1 - level) / 2
    lo, hi = np.quantile(bb / ss, [q, 1 - q])
    w = small_sample_widening([(float(np.var(np.log(bb / ss))), n)], level)
    return widened(total_time_speedup(b, s), float(lo), float(hi), w)


def counters(g: Generation) -> dict:
    """The pooled counters a category reports."""
    return {"acceptance": g.accepted / g.proposed if g.proposed else 0.0,
            "position_acceptance": g.accepted / g.tested if g.tested else 0.0,
            "chars_per_pass": g.chars_emitted / g.target_passes, "target_passes": g.target_passes}


def category_metrics(prompts: list[Prompt], gens: list[Generation], timing: PairedTiming | None, c: float | None,
                     level: float) -> dict:
    """`<name>.<category>` per category, and the whole workload's total-time speedup with its
    interval over prompts (`speedup_prompts*`); timing None: the counters alone (a batch times
    its batches, not its prompts). c: the draft's cost, for each category's predicted speedup."""
    cats = categories(prompts)
    m: dict = {"prompts": len(prompts), "categories": len(cats)}
    times = prompt_times(timing) if timing is not None else None
    for cat in cats:
        idx = [i for i, p in enumerate(prompts) if p.category == cat]
        g = pooled([gens[i] for i in idx])
        values = counters(g) | {"prompts": len(idx)}
        if c is not None:
            values["predicted_speedup"] = seed_speedup(values["chars_per_pass"], g.proposed / g.target_passes, c)
        if times is not None:
            b, s = times[0][idx], times[1][idx]
            values["speedup"] = total_time_speedup(b, s)
            values["speedup_lo"], values["speedup_hi"] = prompt_bootstrap(b, s, [0] * len(idx), level)
        m |= {f"{key}.{metric_name(cat)}": v for key, v in values.items()}
    if times is not None:
        strata = [cats.index(p.category) for p in prompts]
        m["speedup_prompts"] = total_time_speedup(*times)
        m["speedup_prompts_lo"], m["speedup_prompts_hi"] = prompt_bootstrap(*times, strata, level)
    return m


def prompt_rows(prompts: list[Prompt], gens: list[Generation], timing: PairedTiming | None) -> list[dict]:
    """Per prompt: its category, length, counters and times (the trial's prompts.csv)."""
    rows = []
    for i, (p, g) in enumerate(zip(prompts, gens)):
        row = {"prompt": i, "category": p.category, "n_chars": p.n_chars, "text": p.text,
               "target_passes": g.target_passes, "proposed": g.proposed, "accepted": g.accepted, "tested": g.tested,
               "chars": g.chars_emitted, **counters(g)}
        if timing is not None:
            b, s = timing.prompt_baseline_s[i], timing.prompt_speculative_s[i]
            row |= {"baseline_s": statistics.median(b), "speculative_s": statistics.median(s),
                    "speedup": statistics.median(x / y for x, y in zip(b, s)),
                    "baseline_rounds": " ".join(f"{x:.6g}" for x in b),
                    "speculative_rounds": " ".join(f"{x:.6g}" for x in s)}
        rows.append(row)
    return rows
