"""Sweep-level benchmarks (printed, never asserted): `make bench-sweep`.

Runs the same named sweep at n_jobs=1 and n_jobs=2, each into its own temporary store, and
prints:
1. per cell, the speedup median [min-max] at both n_jobs, and whether each median lies within
   the other run's range (the timing lock and the per-job thread cap at work), plus whether
   the deterministic counters are identical;
2. the harness's own overhead per trial at n_jobs=1 (process start, imports, model load,
   tracking writes) as a share of the sweep's wall time: 1 - sum(trial time) / wall;
3. the sweep's wall time at n_jobs=1 and n_jobs=2, as a ratio.

    python -m src.bench_sweep --sweep paper
    python -m src.bench_sweep --sweep paper -- hydra.sweeper.params.seed=0   # extra overrides
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COUNTERS = ["acceptance", "chars_per_pass", "target_passes", "accepted", "proposed", "analytic_acceptance"]


def run_sweep(sweep: str, n_jobs: int, folder: Path, extra: list[str]) -> tuple[str, float]:
    uri = f"sqlite:///{folder}/n{n_jobs}.db"
    cmd = [sys.executable, "-m", "src.run", "--config-dir", "sweeps", "--config-name", sweep,
           f"hydra.launcher.n_jobs={n_jobs}", f"tracking.uri={uri}", f"hydra.sweep.dir={folder}/sweep{n_jobs}", *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"error: the {sweep} sweep at n_jobs={n_jobs} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return uri, wall


def load(uri: str):
    from mlflow.tracking import MlflowClient
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("specsweep")
    runs = client.search_runs([exp.experiment_id], "tags.`specsweep.kind` = 'trial'", max_results=5000)
    return {(r.data.params["draft"], int(r.data.params["k"]), int(r.data.params["seed"])): r.data.metrics
            for r in runs if r.info.status == "FINISHED"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", default="paper")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for both runs")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        for n_jobs in (1, 2):
            print(f"running the {args.sweep} sweep at n_jobs={n_jobs} ...", flush=True)
            uri, wall = run_sweep(args.sweep, n_jobs, Path(tmp), args.overrides)
            results[n_jobs] = (load(uri), wall)
    (one, wall1), (two, wall2) = results[1], results[2]
    cells = sorted(set(one) & set(two))
    print(f"\n## Timing under parallelism: {len(cells)} cells, each at n_jobs=1 and n_jobs=2\n")
    print("| draft | k | seed | n_jobs=1 median [min-max] | n_jobs=2 median [min-max] | each within the other | counters equal |")
    print("|---|---|---|---|---|---|---|")
    agree = same = 0
    for cell in cells:
        a, b = one[cell], two[cell]
        within = (a["speedup_min"] <= b["speedup_median"] <= a["speedup_max"]
                  and b["speedup_min"] <= a["speedup_median"] <= b["speedup_max"])
        equal = all(a[c] == b[c] for c in COUNTERS)
        agree += within
        same += equal
        print(f"| {cell[0]} | {cell[1]} | {cell[2]} | {a['speedup_median']:.3f} [{a['speedup_min']:.3f}-"
              f"{a['speedup_max']:.3f}] | {b['speedup_median']:.3f} [{b['speedup_min']:.3f}-{b['speedup_max']:.3f}]"
              f" | {'yes' if within else 'NO'} | {'yes' if equal else 'NO'} |")
    print(f"\nmedians within each other's range: {agree}/{len(cells)} cells; counters identical: {same}/{len(cells)}")
    trial_s = sum(m["trial_s"] for m in one.values())
    job_s = sum(m["job_s"] for m in one.values())
    print(f"\n## Harness overhead at n_jobs=1 ({len(one)} trials)\n")
    print("| sweep wall s | sum of trial s | sum of job s | overhead share of wall (1 - trial/wall) | of which outside jobs |")
    print("|---|---|---|---|---|")
    print(f"| {wall1:.1f} | {trial_s:.1f} | {job_s:.1f} | {1 - trial_s / wall1:.1%} | {1 - job_s / wall1:.1%} |")
    print("\n## Sweep wall time\n")
    print("| n_jobs=1 s | n_jobs=2 s | ratio 1/2 |")
    print("|---|---|---|")
    print(f"| {wall1:.1f} | {wall2:.1f} | {wall1 / wall2:.2f} |")


if __name__ == "__main__":
    main()
