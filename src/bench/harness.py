"""Sweep-level benchmarks (printed, never asserted): `make bench-sweep`.

Runs the same named sweep three times into temporary stores: at n_jobs=1, again at n_jobs=1
(the control: how well two sequential runs agree on this noisy machine), and at n_jobs=2.
Prints:
1. timing agreement, per trial (each over its own pairs: `timing.pairs` at least, more where
   adaptive pairs added some) and per cell (all pairs of all seeds pooled):
   how often each run's median speedup lies within the other's [min, max], for the control
   pair (1 vs 1) and the parallel pair (1 vs 2), the median relative gap between medians, and
   whether the deterministic counters are identical; then the per-cell table for 1 vs 2;
2. the harness's own overhead at n_jobs=1 as a share of the sweep's wall time,
   1 - sum(trial time) / wall, measured on a fresh store (the command, from interpreter start to
   exit), and where the rest of the wall time goes: at n_jobs=1 the jobs run one after another,
   so the parts (from the runs' start and end times and the jobs' and the parent's own timers)
   add up to the wall; the one-off schema creation of the fresh store is shown apart;
3. the sweep's wall time at n_jobs=1 and n_jobs=2, as a ratio.

    python -m src.bench.harness --sweep paper
    python -m src.bench.harness --sweep paper --n1-only        # the overhead alone: one run
    python -m src.bench.harness --sweep paper --no-control hydra.sweeper.params.seed=0
"""
from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from ..door import ArgParser, check_sweep, command
from .runs import SweepRun, load, run_sweep

COUNTERS = ["acceptance", "chars_per_pass", "target_passes", "accepted", "proposed", "analytic_acceptance"]


def summary(ratios: list[float]) -> tuple[float, float, float]:
    return statistics.median(ratios), min(ratios), max(ratios)


def agree(a: tuple, b: tuple) -> bool:
    """Each median within the other's [min, max]."""
    return b[1] <= a[0] <= b[2] and a[1] <= b[0] <= a[2]


def pooled(run: dict) -> dict:
    cells: dict = {}
    for (draft, k, _), m in run.items():
        cells.setdefault((draft, k), []).extend(m["pairs"])
    return {cell: summary(r) for cell, r in cells.items()}


def compare(x: dict, y: dict) -> dict:
    trials = sorted(set(x) & set(y))
    tx = {t: summary(x[t]["pairs"]) for t in trials}
    ty = {t: summary(y[t]["pairs"]) for t in trials}
    px, py = pooled(x), pooled(y)
    cells = sorted(set(px) & set(py))
    return {"trials": len(trials), "trials_agree": sum(agree(tx[t], ty[t]) for t in trials),
            "cells": len(cells), "cells_agree": sum(agree(px[c], py[c]) for c in cells),
            "gap": statistics.median(abs(tx[t][0] / ty[t][0] - 1) for t in trials),
            "cell_gap": statistics.median(abs(px[c][0] / py[c][0] - 1) for c in cells),
            "counters": sum(all(x[t][c] == y[t][c] for c in COUNTERS) for t in trials), "px": px, "py": py}


def breakdown(run: SweepRun) -> list[tuple[str, float | None]]:
    """Where the wall time of a sequential (n_jobs=1) sweep goes, as (part, seconds) rows that
    add up to the wall. None: not measured (a store written by older code lacks that timer)."""
    trials = sorted(run.trials.values(), key=lambda m: m["start"])
    first, last = trials[0], trials[-1]

    def total(name):
        return sum(m[name] for m in trials) if all(name in m for m in trials) else None

    trial_s, job_s, prep_s = total("trial_s"), total("job_s"), total("prep_s")
    in_runs = sum(m["end"] - m["start"] for m in trials)
    gaps = sum(b["start"] - a["end"] for a, b in zip(trials, trials[1:]))
    before = first["start"] - run.started           # up to the first trial's run: ... + its own prep
    after = run.started + run.wall - last["end"]
    setup, store = run.parent.get("setup_s"), run.parent.get("setup_store_s")
    rows: list[tuple[str, float | None]] = []
    if prep_s is None:  # older code: no per-job prep timer, no parent timers
        rows += [("before the first trial's run: interpreter, imports, sweep set-up, first job's prep", before),
                 ("in the trial runs, outside run_trial: params, claim, result writes", in_runs - trial_s),
                 ("between the trial runs: progress, Hydra's per-job set-up, each job's prep", gaps)]
    else:
        first_prep = first.get("prep_s", 0.0)
        start_up = before - first_prep - (setup or 0.0)
        rows.append(("interpreter start, imports, Hydra start-up (and its set-up of the first job)", start_up))
        if setup is not None:
            rows.append(("sweep set-up in the parent (plan, store, targets, parent run)", setup - (store or 0.0)))
            rows.append(("  the store's schema and experiment (one-off: a fresh store)", store))
        rows += [("jobs, before the trial's run: validation, corpus and target, resume check", prep_s),
                 ("jobs, run opened to trial start: params, cell claim", job_s - prep_s - trial_s),
                 ("jobs, after the trial: metrics, tags, artifacts, run closed", in_runs - (job_s - prep_s)),
                 ("between jobs: progress report, Hydra's per-job set-up (compose, logging, output folder)",
                  gaps - (prep_s - first_prep))]
    rows += [("after the last trial: counts, the parent run closed, exit", after),
             ("trials (run_trial: draft, counters, costs, paired timings)", trial_s)]
    return rows


def print_overhead(run: SweepRun) -> None:
    one = run.trials
    trial_s = sum(m["trial_s"] for m in one.values())
    job_s = sum(m["job_s"] for m in one.values())
    wall = run.wall
    store = run.parent.get("setup_store_s")
    print(f"\n## Harness overhead at n_jobs=1 ({len(one)} trials, a fresh store)\n")
    print("| sweep wall s | sum of trial s | sum of job s | overhead share of wall (1 - trial/wall) | "
          "of which outside the jobs (1 - job/wall) | without the one-off schema creation |")
    print("|---|---|---|---|---|---|")
    without = f"{1 - trial_s / (wall - store):.1%} (wall - {store:.1f} s)" if store is not None else "not measured"
    print(f"| {wall:.1f} | {trial_s:.1f} | {job_s:.1f} | {1 - trial_s / wall:.1%} | {1 - job_s / wall:.1%} | "
          f"{without} |")
    print("\n### Where the wall time goes (n_jobs=1: one job after another, so the parts add up to the wall)\n")
    print("| part | s | share of wall | per trial ms |")
    print("|---|---|---|---|")
    rows = breakdown(run)
    for name, s in rows:
        if s is None:
            print(f"| {name} | not measured | | |")
        else:
            print(f"| {name} | {s:.2f} | {s / wall:.1%} | {1000 * s / len(one):.0f} |")
    known = sum(s for _, s in rows if s is not None)
    print(f"| total (the wall, measured around the command: {wall:.2f} s) | {known:.2f} | {known / wall:.1%} | |")


def main() -> int:
    ap = ArgParser(prog="python -m src.bench.harness", description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", default="paper")
    ap.add_argument("--no-control", action="store_true", help="skip the second n_jobs=1 run")
    ap.add_argument("--n1-only", action="store_true",
                    help="one run at n_jobs=1 only: the harness overhead, without the timing comparisons")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = ap.parse_args()
    return command(lambda: measure_harness(args))


def measure_harness(args) -> None:
    check_sweep(args.sweep)
    if args.n1_only:
        plan = [("n1", 1)]
    elif args.no_control:
        plan = [("n1", 1), ("n2", 2)]
    else:
        plan = [("n1", 1), ("n1_repeat", 1), ("n2", 2)]
    runs: dict[str, SweepRun] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, n_jobs in plan:
            print(f"running the {args.sweep} sweep at n_jobs={n_jobs} ({name}) ...", flush=True)
            runs[name] = load(run_sweep(args.sweep, n_jobs, Path(tmp) / name, args.overrides))
    if "n2" in runs:
        comparisons = [("n1_repeat", "n1 vs n1 (control)")] if "n1_repeat" in runs else []
        comparisons.append(("n2", "n1 vs n2 (parallel)"))
        print("\n## Timing agreement\n")
        print("| runs | trials: medians within each other's range | cells (seeds pooled): same | "
              "median gap between trial medians | between cell medians | counters identical |")
        print("|---|---|---|---|---|---|")
        results = {}
        for other, label in comparisons:
            c = results[other] = compare(runs["n1"].trials, runs[other].trials)
            print(f"| {label} | {c['trials_agree']}/{c['trials']} | {c['cells_agree']}/{c['cells']} | "
                  f"{c['gap']:.1%} | {c['cell_gap']:.1%} | {c['counters']}/{c['trials']} |")
        c = results["n2"]
        print("\n### Per cell, all pairs of all seeds pooled: n_jobs=1 vs n_jobs=2\n")
        print("| draft | k | n_jobs=1 median [min-max] | n_jobs=2 median [min-max] | each within the other |")
        print("|---|---|---|---|---|")
        for cell in sorted(c["px"]):
            a, b = c["px"][cell], c["py"][cell]
            print(f"| {cell[0]} | {cell[1]} | {a[0]:.3f} [{a[1]:.3f}-{a[2]:.3f}] | "
                  f"{b[0]:.3f} [{b[1]:.3f}-{b[2]:.3f}] | {'yes' if agree(a, b) else 'NO'} |")
    print_overhead(runs["n1"])
    if "n2" in runs:
        wall1, wall2 = runs["n1"].wall, runs["n2"].wall
        print("\n## Sweep wall time\n")
        print("| n_jobs=1 s | n_jobs=2 s | ratio 1/2 |")
        print("|---|---|---|")
        print(f"| {wall1:.1f} | {wall2:.1f} | {wall1 / wall2:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
