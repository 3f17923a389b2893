"""What the sweep benchmarks share: run a named sweep into a store of its own, read it back.

`run_sweep` runs `python -m src.run --config-dir sweeps --config-name SWEEP` at a given n_jobs
into a fresh SQLite store in `folder` (a failed sweep ends the benchmark with its output's
tail); `load` reads the store's FINISHED trials and the sweep's parent run back.
"""
from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..paths import REPO
from ..sweep.store import DEFAULT_EXPERIMENT, KIND_TAG, SWEEP, TRIAL


@dataclass
class SweepRun:
    uri: str
    started: float                 # epoch seconds, just before the command was started
    wall: float                    # seconds, from then until the command exited
    trials: dict = field(default_factory=dict)   # (draft, k, seed) -> {metrics..., "pairs", "start", "end"}
    parent: dict = field(default_factory=dict)   # the sweep's parent run's metrics


def store_uri(folder: Path) -> str:
    return f"sqlite:///{folder}/mlflow.db"


def run_sweep(sweep: str, n_jobs: int, folder: Path, extra: list[str]) -> SweepRun:
    """The named sweep at n_jobs into a store in `folder` (Hydra's job folders under folder/sweep)."""
    uri = store_uri(folder)
    cmd = [sys.executable, "-m", "src.run", "--config-dir", "sweeps", "--config-name", sweep,
           f"hydra.launcher.n_jobs={n_jobs}", f"tracking.uri={uri}", f"hydra.sweep.dir={folder}/sweep", *extra]
    started = time.time()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"error: the {sweep} sweep at n_jobs={n_jobs} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return SweepRun(uri, started, wall)


def load(run: SweepRun) -> SweepRun:
    """The FINISHED trials ((draft, k, seed) -> metrics, pair ratios, start and end in epoch
    seconds) and the parent run's metrics."""
    from mlflow.tracking import MlflowClient
    client = MlflowClient(run.uri)
    exp = client.get_experiment_by_name(DEFAULT_EXPERIMENT)
    runs = client.search_runs([exp.experiment_id], f"tags.`{KIND_TAG}` = '{TRIAL}'", max_results=5000)
    for r in runs:
        if r.info.status == "FINISHED":
            pairs = [m.value for m in client.get_metric_history(r.info.run_id, "speedup_pair")]
            run.trials[(r.data.params["draft"], int(r.data.params["k"]), int(r.data.params["seed"]))] = {
                **r.data.metrics, "pairs": pairs, "start": r.info.start_time / 1000, "end": r.info.end_time / 1000}
    parents = client.search_runs([exp.experiment_id], f"tags.`{KIND_TAG}` = '{SWEEP}'", max_results=1)
    run.parent = dict(parents[0].data.metrics) if parents else {}
    return run
