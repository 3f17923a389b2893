"""The sweep-level side of tracking, as a Hydra callback (runs in the parent process).

on_multirun_start: set up the store and the experiment once, before any worker starts; open
the sweep's parent run; write `sweep.json` into the sweep folder for the workers; start the
progress reporter. on_multirun_end: close the parent run with a summary. Hydra skips
on_multirun_end when a job raised, so the parent run is also closed by an atexit hook.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
import uuid
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from .atomic import write_text
from .tracking import KIND_TAG, environment_tags, setup_experiment, tracking_uri, client_for

log = logging.getLogger(__name__)
SWEEP_FILE = "sweep.json"
PROGRESS_DIR = ".progress"

# the summary of the last sweep this process ran (read by the entry point for its exit status)
last_summary: dict = {}


def count_jobs(config: DictConfig) -> int:
    """How many jobs Hydra's basic sweeper will launch for this command line and sweep file."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    params = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
    overrides = OverridesParser.create().parse_overrides(params + list(config.hydra.overrides.task))
    return sum(len(batch) for batch in BasicSweeper.split_arguments(overrides, None))


def n_jobs(config: DictConfig) -> int:
    n = config.hydra.launcher.get("n_jobs", 1) if "launcher" in config.hydra else 1
    return os.cpu_count() if n is None or n < 0 else int(n)


def mark_done(sweep_dir: str | Path, job_num: int, ok: bool) -> None:
    folder = Path(sweep_dir) / PROGRESS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{job_num}.{'ok' if ok else 'failed'}").touch()


class Progress(threading.Thread):
    """Logs 'trials done / total, ETA' whenever a worker finishes a trial."""

    def __init__(self, sweep_dir: Path, total: int, interval: float = 1.0):
        super().__init__(daemon=True)
        self.folder, self.total, self.interval = sweep_dir / PROGRESS_DIR, total, interval
        self.stop_event = threading.Event()
        self.t0 = time.monotonic()
        self.seen = 0

    def counts(self) -> tuple[int, int]:
        names = [p.suffix for p in self.folder.glob("*")] if self.folder.is_dir() else []
        return names.count(".ok"), names.count(".failed")

    def run(self) -> None:
        while not self.stop_event.wait(self.interval):
            self.report()

    def report(self) -> None:
        ok, failed = self.counts()
        done = ok + failed
        if done == self.seen:
            return
        self.seen = done
        elapsed = time.monotonic() - self.t0
        eta = elapsed / done * (self.total - done)
        log.info("progress: %d/%d trials done (%d failed), elapsed %s, ETA %s", done, self.total, failed,
                 _hms(elapsed), _hms(eta))

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=5)
        self.report()


def _hms(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class SweepTracking(Callback):
    def __init__(self) -> None:
        self.client = None
        self.parent_run_id = None
        self.progress: Progress | None = None
        self.t0 = 0.0

    def __getstate__(self):
        # Hydra pickles its callbacks to every joblib worker; the thread and the client stay here.
        return {}

    def __setstate__(self, state):
        self.__init__()

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        from .errors import SpecsweepError
        sweep_dir = Path(str(config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        total = count_jobs(config)
        info = {"sweep_id": uuid.uuid4().hex[:12], "sweep_name": str(config.get("sweep_name") or "adhoc"),
                "total": total, "n_jobs": n_jobs(config), "sweep_dir": str(sweep_dir.resolve())}
        if config.tracking.enabled:
            uri = tracking_uri(config)
            try:
                experiment_id = setup_experiment(uri, config.tracking.experiment)
            except SpecsweepError as e:
                log.error("error: %s", e)
                raise SystemExit(2)
            self.client = client_for(uri)
            tags = {KIND_TAG: "sweep", "sweep_id": info["sweep_id"], "sweep_name": info["sweep_name"],
                    "n_jobs": str(info["n_jobs"]), "trials_planned": str(total),
                    "command_overrides": " ".join(config.hydra.overrides.task), **environment_tags()}
            run = self.client.create_run(experiment_id, run_name=f"sweep-{info['sweep_name']}-{info['sweep_id']}",
                                         tags=tags)
            self.parent_run_id = run.info.run_id
            info.update({"tracking_uri": uri, "experiment_id": experiment_id, "parent_run_id": self.parent_run_id})
            atexit.register(self._close, "FAILED")
        write_text(sweep_dir / SWEEP_FILE, json.dumps(info, indent=1))
        log.info("sweep %s (%s): %d trials on %d workers%s", info["sweep_id"], info["sweep_name"], total,
                 info["n_jobs"], f", tracked in {info.get('tracking_uri')}" if self.parent_run_id else "")
        self.t0 = time.monotonic()
        self.progress = Progress(sweep_dir, total)
        self.progress.start()
        self.info = info

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        if self.progress:
            self.progress.stop()
        ok, failed = self.progress.counts() if self.progress else (0, 0)
        wall = time.monotonic() - self.t0
        last_summary.update({"total": self.info["total"], "finished": ok, "failed": failed, "wall_s": wall,
                             "sweep_id": self.info["sweep_id"]})
        log.info("sweep %s done: %d finished, %d failed, %d planned, wall %s", self.info["sweep_id"], ok, failed,
                 self.info["total"], _hms(wall))
        if self.client and self.parent_run_id:
            for key, value in (("trials_finished", ok), ("trials_failed", failed), ("wall_s", wall)):
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
