"""One Hydra job: validate, load the target, run the trial, record it in MLflow.

In a multirun the job reads the sweep's `sweep.json` (written by the parent's callback) for
the store, the experiment, its parent run and the cells already done; alone it sets them up
itself. A failing trial is recorded FAILED and, in a sweep, does not abort the other trials
(the job returns instead of raising, so Hydra goes on and still calls on_multirun_end).
"""
from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import sys
import time
import traceback
from contextlib import nullcontext
from pathlib import Path

import torch
from filelock import FileLock
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from ..engine.atomic import write_text
from .callbacks import PROGRESS_DIR, SWEEP_FILE, mark_done, report_progress
from ..engine.errors import SpecsweepError
from .tracking import (KIND_TAG, client_for, config_hash, ensure_target_run, environment_tags,
                       log_trial_result, setup_experiment, trial_params, tracking_uri)

log = logging.getLogger(__name__)


def _sweep_info() -> dict | None:
    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN:
        return None
    path = Path(hc.sweep.dir) / SWEEP_FILE
    return json.loads(path.read_text()) if path.is_file() else {"sweep_dir": str(Path(hc.sweep.dir).resolve())}


class TrialRecord:
    """The trial's MLflow run: created RUNNING before the work, ended FINISHED or FAILED."""

    def __init__(self, cfg: DictConfig, sweep: dict | None, target, experiment_id: str):
        from mlflow.entities import Param
        self.uri = (sweep or {}).get("tracking_uri") or tracking_uri(cfg)
        self.client = client_for(self.uri)
        target_run = ensure_target_run(self.client, experiment_id, self.uri, target, cfg)
        tags = {KIND_TAG: "trial", "config_hash": config_hash(cfg), "target_key": target.key,
                "target_run_id": target_run, "torch_threads": str(cfg.threads), **environment_tags()}
        if sweep:
            tags.update({"mlflow.parentRunId": sweep["parent_run_id"], "sweep_id": sweep["sweep_id"],
                         "sweep_name": sweep["sweep_name"], "n_jobs": str(sweep["n_jobs"])})
        else:
            tags.update({"sweep_id": "none", "n_jobs": "1"})
        name = f"{cfg.draft.name}-k{cfg.k}-s{cfg.seed}"
        self.run_id = self.client.create_run(experiment_id, run_name=name, tags=tags).info.run_id
        params = trial_params(cfg, target.key)
        items = [Param(k, v) for k, v in params.items()]
        for start in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[start:start + 100])

    def finish(self, cfg, result, job_started: float) -> None:
        log_trial_result(self.client, self.run_id, cfg, result)
        # the whole job so far (load, trial, tracking writes): for the harness-overhead benchmark
        self.client.log_metric(self.run_id, "job_s", time.perf_counter() - job_started)
        self.client.set_terminated(self.run_id, "FINISHED")

    def fail(self, message: str, status: str = "FAILED") -> None:
        try:
            self.client.set_tag(self.run_id, "error", message[:5000])
            self.client.set_terminated(self.run_id, status)
        except Exception as e:  # the store itself may be what failed
            log.warning("could not mark run %s %s: %s", self.run_id, status, e)


def run_job(cfg: DictConfig) -> None:
    """One trial. Alone, or in a sweep at n_jobs=1: in this process. In a sweep on joblib
    workers: in a forked child of the worker, so that a trial that dies (SIGKILL, out of
    memory) takes neither its worker nor the sweep down; the worker then records the
    trial's run FAILED and the sweep goes on."""
    sweep = _sweep_info()
    if sweep is None:
        run_trial_job(cfg, None)
        return
    num = HydraConfig.get().job.num
    if num in sweep.get("skip_jobs", []):
        log.info("trial #%d: an identical run already FINISHED, skipped", num)
        return
    if os.getpid() == sweep.get("parent_pid"):
        # n_jobs=1: joblib runs the jobs in the main process, which holds the store's
        # connections and torch's thread pool; a fork there is not safe, so run in-process
        run_trial_job(cfg, sweep)
        return
    child = mp.get_context("fork").Process(target=run_trial_job, args=(cfg, sweep))
    child.start()
    child.join()
    if child.exitcode != 0:
        record_death(sweep, num, child.exitcode)


def _run_file(sweep: dict, num: int) -> Path:
    return Path(sweep["sweep_dir"]) / PROGRESS_DIR / f"{num}.run"


def record_death(sweep: dict, num: int, exitcode: int) -> None:
    cause = f"killed by signal {-exitcode}" if exitcode < 0 else f"exited with status {exitcode}"
    log.error("trial #%d: its process %s; its run is marked FAILED", num, cause)
    run_file = _run_file(sweep, num)
    if run_file.is_file() and sweep.get("tracking_uri"):
        run_id = json.loads(run_file.read_text())["run_id"]
        try:
            client = client_for(sweep["tracking_uri"])
            client.set_tag(run_id, "error", f"trial process {cause}")
            client.set_terminated(run_id, "FAILED")
        except Exception as e:
            log.warning("could not mark run %s FAILED: %s", run_id, e)
    mark_done(sweep["sweep_dir"], num, ok=False)
    report_progress(sweep)


def run_trial_job(cfg: DictConfig, sweep: dict | None) -> dict | None:
    from .render import trial_block
    from .trial import load_target, run_trial, validate
    job_started = time.perf_counter()
    record = None
    ok = False
    try:
        validate(cfg)
        torch.set_num_threads(cfg.threads)
        if cfg.tracking.enabled:  # an unusable store is bad input too: find out before any work
            experiment_id = (sweep or {}).get("experiment_id") or setup_experiment(tracking_uri(cfg),
                                                                                   cfg.tracking.experiment)
        corpus, target = load_target(cfg)
        if cfg.tracking.enabled:
            record = TrialRecord(cfg, sweep, target, experiment_id)
            if sweep:  # lets the worker find the run if this process dies
                write_text(_run_file(sweep, HydraConfig.get().job.num),
                           json.dumps({"pid": os.getpid(), "run_id": record.run_id}))
        lock = FileLock(str(Path(sweep["sweep_dir"]) / "timing.lock")) if sweep and cfg.timing.lock else nullcontext()
        trial_started = time.perf_counter()
        result = run_trial(cfg, loaded=(corpus, target), timing_lock=lock)
        result.metrics["trial_s"] = time.perf_counter() - trial_started
        if record:
            record.finish(cfg, result, job_started)
        for line in trial_block(cfg, result).splitlines():
            log.info(line)
        ok = True
        return result.metrics
    except SpecsweepError as e:
        log.error("error: %s", e)
        if record:
            record.fail(str(e))
        if sweep is None:
            sys.exit(2)
    except Exception as e:
        log.error("trial failed: %s: %s", type(e).__name__, e)
        if record:
            record.fail(traceback.format_exc())
        if sweep is None:
            raise
    except BaseException:  # interrupted: do not leave the run RUNNING
        if record:
            record.fail("interrupted", status="KILLED")
        raise
    finally:
        if sweep:
            mark_done(sweep["sweep_dir"], HydraConfig.get().job.num, ok)
            report_progress(sweep)
    return None
