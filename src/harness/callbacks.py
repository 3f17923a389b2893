"""The sweep-level side of tracking, as a Hydra callback (runs in the parent process).

on_multirun_start: plan the sweep (src/harness/plan.py: validate every job, train each target once,
find the cells already done); set up the store and the experiment once, before any worker
starts; open the sweep's parent run (or reopen it, when the same sweep is run again); write
`sweep.json` into the sweep folder for the workers (they report progress as they finish).
on_multirun_end: close the parent run with a summary. Hydra skips
on_multirun_end when a job raised, so the parent run is also closed by an atexit hook.
"""
from __future__ import annotations

import atexit
import shutil
import json
import logging
import os
import time
import uuid
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from ..engine.atomic import write_text
from ..engine.errors import SpecsweepError
from .plan import finished_jobs, plan_jobs, prepare_targets, previous_parent, sweep_signature
from .tracking import KIND_TAG, client_for, code_version, environment_tags, setup_experiment, tracking_uri

log = logging.getLogger(__name__)
SWEEP_FILE = "sweep.json"
PROGRESS_DIR = ".progress"

# the summary of the last sweep this process ran (read by the entry point for its exit status)
last_summary: dict = {}


def n_jobs(config: DictConfig) -> int:
    n = config.hydra.launcher.get("n_jobs", 1) if "launcher" in config.hydra else 1
    return os.cpu_count() if n is None or n < 0 else int(n)


def mark_done(sweep_dir: str | Path, job_num: int, ok: bool) -> None:
    folder = Path(sweep_dir) / PROGRESS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{job_num}.{'ok' if ok else 'failed'}").touch()


def progress_counts(sweep_dir: str | Path) -> tuple[int, int]:
    """(finished, failed) trials of this sweep run so far, from the workers' marker files."""
    folder = Path(sweep_dir) / PROGRESS_DIR
    names = [p.suffix for p in folder.glob("*")] if folder.is_dir() else []
    return names.count(".ok"), names.count(".failed")


def report_progress(sweep: dict) -> None:
    """Logged by each job as it ends: 'trials done / total, ETA'. The workers report, so the
    parent needs no thread (a thread holding a lock while a worker forks can deadlock the child)."""
    ok, failed = progress_counts(sweep["sweep_dir"])
    done, total = ok + failed, sweep["total"] - len(sweep.get("skip_jobs", []))
    elapsed = time.time() - sweep["started"]
    eta = elapsed / done * (total - done) if done else float("nan")
    log.info("progress: %d/%d trials done (%d failed), elapsed %s, ETA %s", done, total, failed,
             _hms(elapsed), _hms(eta))


def _hms(seconds: float) -> str:
    if seconds != seconds:  # NaN: nothing done yet
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class SweepTracking(Callback):
    def __init__(self) -> None:
        self.client = None
        self.parent_run_id = None
        self.t0 = 0.0

    def __getstate__(self):
        # Hydra pickles its callbacks to every joblib worker; the client stays here.
        return {}

    def __setstate__(self, state):
        self.__init__()

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        try:
            self._start(config)
        except SpecsweepError as e:
            log.error("error: %s", e)
            raise SystemExit(2)

    def _start(self, config: DictConfig) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        shutil.rmtree(sweep_dir / PROGRESS_DIR, ignore_errors=True)  # markers of an earlier run in this folder
        jobs = plan_jobs(config)                       # bad input stops here, before any write
        uri = tracking_uri(config) if config.tracking.enabled else None
        if uri:
            experiment_id = setup_experiment(uri, config.tracking.experiment)
        prepare_targets(jobs)                          # each distinct target trained once, all cores
        info = {"sweep_id": uuid.uuid4().hex[:12], "sweep_name": str(config.get("sweep_name") or "adhoc"),
                "total": len(jobs), "n_jobs": n_jobs(config), "sweep_dir": str(sweep_dir.resolve()), "skip_jobs": [],
                "started": time.time(), "parent_pid": os.getpid()}
        if uri:
            self.client = client_for(uri)
            version = code_version()
            signature = sweep_signature(jobs, version)
            previous = previous_parent(self.client, experiment_id, signature) if config.resume else None
            if config.resume:
                info["skip_jobs"] = sorted(finished_jobs(self.client, experiment_id, jobs, version))
            if previous is not None:  # the same sweep again: continue it under its parent run
                self.parent_run_id = previous.info.run_id
                info["sweep_id"] = previous.data.tags["sweep_id"]
                self.client.update_run(self.parent_run_id, status="RUNNING")
            else:
                tags = {KIND_TAG: "sweep", "sweep_id": info["sweep_id"], "sweep_name": info["sweep_name"],
                        "n_jobs": str(info["n_jobs"]), "trials_planned": str(len(jobs)), "sweep_signature": signature,
                        "command_overrides": " ".join(config.hydra.overrides.task), **environment_tags()}
                run = self.client.create_run(experiment_id, tags=tags,
                                             run_name=f"sweep-{info['sweep_name']}-{info['sweep_id']}")
                self.parent_run_id = run.info.run_id
            info.update({"tracking_uri": uri, "experiment_id": experiment_id, "parent_run_id": self.parent_run_id})
            atexit.register(self._close, "FAILED")
        write_text(sweep_dir / SWEEP_FILE, json.dumps(info, indent=1))
        skipped = len(info["skip_jobs"])
        log.info("sweep %s (%s): %d cells: %d done, %d to run, on %d workers%s%s", info["sweep_id"],
                 info["sweep_name"], len(jobs), skipped, len(jobs) - skipped, info["n_jobs"],
                 f", tracked in {uri}" if uri else "",
                 "" if config.resume else " (resume=false: rerunning every cell)")
        self.t0 = time.monotonic()
        self.info = info

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        ok, failed = progress_counts(self.info["sweep_dir"])
        wall = time.monotonic() - self.t0
        skipped = len(self.info["skip_jobs"])
        last_summary.update({"total": self.info["total"], "finished": ok, "failed": failed, "skipped": skipped,
                             "wall_s": wall, "sweep_id": self.info["sweep_id"]})
        log.info("sweep %s done: %d finished, %d failed, %d skipped (done before), %d cells, wall %s",
                 self.info["sweep_id"], ok, failed, skipped, self.info["total"], _hms(wall))
        if self.client and self.parent_run_id:
            for key, value in (("trials_finished", ok + skipped), ("trials_failed", failed),
                               ("trials_run_now", ok + failed), ("wall_s", wall)):
                self.client.log_metric(self.parent_run_id, key, value)
            self._close("FINISHED" if failed == 0 else "FAILED")

    def _close(self, status: str) -> None:
        """End the parent run once; from atexit too (a sweep whose job raised)."""
        if self.client is None or self.parent_run_id is None:
            return
        try:
            if self.client.get_run(self.parent_run_id).info.status == "RUNNING":
                self.client.set_terminated(self.parent_run_id, status)
        except Exception as e:  # at exit, the store may be gone: say so, do not raise
            log.warning("could not close the sweep's parent run: %s", e)
