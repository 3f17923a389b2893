"""Sweep-level benchmarks (printed, never asserted): `make bench-sweep`.

Runs the same named sweep three times into temporary stores: at n_jobs=1, again at n_jobs=1
(the control: how well two sequential runs agree on this noisy machine), and at n_jobs=2.
Prints:
1. timing agreement, per trial (5 pairs each) and per cell (all pairs of all seeds pooled):
   how often each run's median speedup lies within the other's [min, max], for the control
   pair (1 vs 1) and the parallel pair (1 vs 2), the median relative gap between medians, and
   whether the deterministic counters are identical; then the per-cell table for 1 vs 2;
2. the harness's own overhead per trial at n_jobs=1 (process start, imports, planning, model
   load, tracking writes) as a share of the sweep's wall time: 1 - sum(trial time) / wall;
3. the sweep's wall time at n_jobs=1 and n_jobs=2, as a ratio.

    python -m src.harness.bench_sweep --sweep paper
    python -m src.harness.bench_sweep --sweep paper --no-control hydra.sweeper.params.seed=0
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .paths import REPO

COUNTERS = ["acceptance", "chars_per_pass", "target_passes", "accepted", "proposed", "analytic_acceptance"]


def run_sweep(sweep: str, n_jobs: int, folder: Path, extra: list[str]) -> tuple[str, float]:
    uri = f"sqlite:///{folder}/mlflow.db"
    cmd = [sys.executable, "-m", "src.run", "--config-dir", "sweeps", "--config-name", sweep,
           f"hydra.launcher.n_jobs={n_jobs}", f"tracking.uri={uri}", f"hydra.sweep.dir={folder}/sweep", *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"error: the {sweep} sweep at n_jobs={n_jobs} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return uri, wall


def load(uri: str) -> dict:
    """(draft, k, seed) -> {metrics..., "pairs": [pair ratios]} of the FINISHED trials."""
    from mlflow.tracking import MlflowClient
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("specsweep")
    runs = client.search_runs([exp.experiment_id], "tags.`specsweep.kind` = 'trial'", max_results=5000)
    out = {}
    for r in runs:
        if r.info.status == "FINISHED":
            pairs = [m.value for m in client.get_metric_history(r.info.run_id, "speedup_pair")]
            out[(r.data.params["draft"], int(r.data.params["k"]), int(r.data.params["seed"]))] = {
                **r.data.metrics, "pairs": pairs}
    return out


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", default="paper")
    ap.add_argument("--no-control", action="store_true", help="skip the second n_jobs=1 run")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = ap.parse_args()
    plan = [("n1", 1), ("n2", 2)] if args.no_control else [("n1", 1), ("n1_repeat", 1), ("n2", 2)]
    runs, walls = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, n_jobs in plan:
            print(f"running the {args.sweep} sweep at n_jobs={n_jobs} ({name}) ...", flush=True)
            uri, walls[name] = run_sweep(args.sweep, n_jobs, Path(tmp) / name, args.overrides)
            runs[name] = load(uri)
    comparisons = [("n1_repeat", "n1 vs n1 (control)")] if "n1_repeat" in runs else []
    comparisons.append(("n2", "n1 vs n2 (parallel)"))
    print("\n## Timing agreement\n")
    print("| runs | trials: medians within each other's range | cells (seeds pooled): same | "
          "median gap between trial medians | between cell medians | counters identical |")
    print("|---|---|---|---|---|---|")
    results = {}
    for other, label in comparisons:
        c = results[other] = compare(runs["n1"], runs[other])
        print(f"| {label} | {c['trials_agree']}/{c['trials']} | {c['cells_agree']}/{c['cells']} | {c['gap']:.1%} | "
              f"{c['cell_gap']:.1%} | {c['counters']}/{c['trials']} |")
    c = results["n2"]
    print("\n### Per cell, all pairs of all seeds pooled: n_jobs=1 vs n_jobs=2\n")
    print("| draft | k | n_jobs=1 median [min-max] | n_jobs=2 median [min-max] | each within the other |")
    print("|---|---|---|---|---|")
    for cell in sorted(c["px"]):
        a, b = c["px"][cell], c["py"][cell]
        print(f"| {cell[0]} | {cell[1]} | {a[0]:.3f} [{a[1]:.3f}-{a[2]:.3f}] | {b[0]:.3f} [{b[1]:.3f}-{b[2]:.3f}] | "
              f"{'yes' if agree(a, b) else 'NO'} |")
    one = runs["n1"]
    trial_s = sum(m["trial_s"] for m in one.values())
    job_s = sum(m["job_s"] for m in one.values())
    wall1, wall2 = walls["n1"], walls["n2"]
    print(f"\n## Harness overhead at n_jobs=1 ({len(one)} trials)\n")
    print("| sweep wall s | sum of trial s | sum of job s | overhead share of wall (1 - trial/wall) | "
          "of which outside the jobs (1 - job/wall) |")
    print("|---|---|---|---|---|")
    print(f"| {wall1:.1f} | {trial_s:.1f} | {job_s:.1f} | {1 - trial_s / wall1:.1%} | {1 - job_s / wall1:.1%} |")
    print("\n## Sweep wall time\n")
    print("| n_jobs=1 s | n_jobs=2 s | ratio 1/2 |")
    print("|---|---|---|")
    print(f"| {wall1:.1f} | {wall2:.1f} | {wall1 / wall2:.2f} |")


if __name__ == "__main__":
    main()
