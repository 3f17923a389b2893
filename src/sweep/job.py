"""One Hydra job: resolve the config into a trial spec, load the target, run the trial, record it.

In a sweep the job's config carries the SweepContext (`cfg.sweep`, src/sweep/context.py): the
store, the parent run, the published targets, the code version. The job then
- refuses to run on a checkout whose code version differs from the parent's;
- skips its cell when an identical trial already FINISHED (resume), by asking the server;
- fetches the target the parent published (it never trains) and verifies its sha256;
- claims its cell on the parent run (src/sweep/resume.py): a duplicate gives way;
- runs in a forked child that dies with its worker (a killed worker leaves no trial behind),
  so a trial that dies is recorded FAILED by its worker and the sweep goes on.
Alone (no -m), it sets the store up itself and publishes the target it trained or loaded.
A failing trial is recorded FAILED and, in a sweep, does not abort the other trials.
"""
from __future__ import annotations

import ctypes
import logging
import multiprocessing as mp
import os
import signal
import socket
import sys
import time
import traceback

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from ..engine.errors import SpecsweepError, disk_full, error_line
from ..paths import REPO
from ..trial.checks import check_inputs
from ..trial.load import load_target
from ..trial.render import trial_block
from ..trial.spec import TrialSpec, trial_spec
from ..trial.trial import run_trial
from .context import SweepContext
from .ledger import invocation_runs
from .resume import cell_key, claim_cell, code_version, compute_version, is_done
from .progress import report_progress
from .store import KIND_TAG, TRIAL
from .targets import PublishedTargets, publish_target
from .tracking import check_store, client_for, written_folders, environment_tags, log_trial_result, preload_store, \
    setup_experiment, trial_params, tracking_uri

log = logging.getLogger(__name__)


class TrialRecord:
    """The trial's MLflow run: created RUNNING before the work, ended FINISHED or FAILED."""

    def __init__(self, client, cfg: DictConfig, spec: TrialSpec, ctx: SweepContext | None, experiment_id: str,
                 target, target_run_id: str, job_num: int | None, fetched: bool, chash: str, on_run=None):
        from mlflow.entities import Param
        self.client = client
        tags = {KIND_TAG: TRIAL, "config_hash": chash, "target_key": target.key,
                "target_run_id": target_run_id, "target_fetched": str(fetched).lower(),
                "torch_threads": str(spec.threads), "pid": str(os.getpid()), "repo_path": str(REPO),
                **environment_tags()}
        if ctx:
            tags.update({"mlflow.parentRunId": ctx.parent_run_id, "sweep_id": ctx.sweep_id, "sweep_parent": ctx.parent,
                         "sweep_name": ctx.sweep_name, "sweep_invocation": ctx.invocation, "job_num": str(job_num),
                         "n_jobs": str(ctx.n_jobs)})
        else:
            tags.update({"sweep_id": "none", "n_jobs": "1"})
        self.run_id = client.create_run(experiment_id, run_name=spec.label, tags=tags).info.run_id
        if on_run:  # at once: a worker whose trial dies from here on must find this run to fail it
            on_run(self.run_id)
        self.opened = time.perf_counter()
        items = [Param(k, v) for k, v in trial_params(cfg, spec, target.key).items()]
        for start in range(0, len(items), 100):
            client.log_batch(self.run_id, params=items[start:start + 100])

    def finish(self, cfg, result, job_started: float) -> None:
        # for the harness-overhead benchmark: job_s, the whole job so far (load, trial, tracking writes);
        # prep_s, its part before the run existed (validation, corpus and target, resume check)
        result.metrics["job_s"] = time.perf_counter() - job_started
        result.metrics["prep_s"] = self.opened - job_started
        log_trial_result(self.client, self.run_id, cfg, result)
        self.client.set_terminated(self.run_id, "FINISHED")

    def fail(self, message: str, status: str = "FAILED") -> None:
        try:
            self.client.set_tag(self.run_id, "error", message[:5000])
            self.client.set_terminated(self.run_id, status)
        except Exception as e:  # the store itself may be what failed
            log.warning("could not mark run %s %s: %s", self.run_id, status, e)


def die_with_parent() -> None:
    """Linux: this process gets SIGKILL when the thread that forked it ends, so a trial never
    outlives its worker (a killed Ray worker would otherwise leave its trial running on)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_job(cfg: DictConfig) -> None:
    """One trial. Alone, or in a sweep's parent process (joblib at n_jobs=1): in this process.
    On a sweep's worker: in a forked child, so that a trial that dies (SIGKILL, out of memory)
    takes neither its worker nor the sweep down; the worker then records its run FAILED."""
    ctx = SweepContext.from_cfg(cfg)
    if ctx is None:
        run_trial_job(cfg, None)
        return
    num = HydraConfig.get().job.num
    if ctx.in_parent():  # forking the parent (store connections, torch's threads) is not safe
        run_trial_job(cfg, ctx, num)
    else:
        preload_store(ctx.tracking_uri)   # before the fork: the trial's child inherits MLflow, loaded once
        forked = mp.get_context("fork")
        receive, send = forked.Pipe(duplex=False)
        parent_pid = os.getpid()
        child = forked.Process(target=_trial_child, args=(cfg, ctx, num, send, parent_pid))
        child.start()
        send.close()
        run_id = None
        try:
            while run_id is None and receive.poll(None):  # the child sends its run id, then closes
                run_id = receive.recv()
        except EOFError:
            pass
        child.join()
        if child.exitcode != 0:
            record_death(ctx, num, child.exitcode, run_id, child.pid)
    report_progress_safely(ctx)


def _trial_child(cfg, ctx, num, send, parent_pid) -> None:
    die_with_parent()
    if os.getppid() != parent_pid:  # the worker died before the death signal was armed
        os._exit(1)
    try:
        run_trial_job(cfg, ctx, num, on_run=send.send)
    finally:
        send.close()


def report_progress_safely(ctx: SweepContext) -> None:
    try:
        report_progress(client_for(ctx.tracking_uri), ctx)
    except Exception as e:
        log.warning("progress unavailable: %s", e)


def record_death(ctx: SweepContext, num: int, exitcode: int, run_id: str | None, pid: int) -> None:
    cause = f"killed by signal {-exitcode}" if exitcode < 0 else f"exited with status {exitcode}"
    log.error("trial #%d: its process %s; its run is marked FAILED", num, cause)
    try:
        client = client_for(ctx.tracking_uri)
        if run_id is None:  # it died before it could say: its run, if any, carries its pid
            mine = [r for r in invocation_runs(client, ctx.experiment_id, ctx.invocation, status="RUNNING")
                    if r.data.tags.get("pid") == str(pid) and r.data.tags.get("job_num") == str(num)]
            if not mine:
                return  # it died before its run existed: the sweep counts the cell as not finished
            run_id = mine[0].info.run_id
        if client.get_run(run_id).info.status == "RUNNING":
            client.set_tag(run_id, "error", f"trial process {cause}")
            client.set_terminated(run_id, "FAILED")
    except Exception as e:
        log.warning("could not mark run %s FAILED: %s", run_id, e)


def record_early_failure(cfg: DictConfig, ctx: SweepContext, num: int | None, message: str) -> None:
    """A trial of a sweep that failed before its run existed (wrong code, no target) still
    leaves a FAILED run under the sweep, so the failure is seen and counted on the server."""
    try:
        client = client_for(ctx.tracking_uri)
        tags = {KIND_TAG: TRIAL, "mlflow.parentRunId": ctx.parent_run_id, "sweep_id": ctx.sweep_id,
                "sweep_parent": ctx.parent,
                "sweep_name": ctx.sweep_name, "sweep_invocation": ctx.invocation, "job_num": str(num),
                "error": message[:5000], **environment_tags()}
        try:   # the cell, when the config resolves (a failure after the spec: the target, say)
            tags["config_hash"] = cell_key(trial_spec(cfg))
        except Exception:  # noqa: BLE001 - the failure to record may be that very config
            pass
        run_id = client.create_run(ctx.experiment_id, run_name=early_name(cfg), tags=tags).info.run_id
        client.set_terminated(run_id, "FAILED")
    except Exception as e:
        log.warning("could not record the failure on the server: %s", e)


def hydra_output_dir() -> str | None:
    """This job's Hydra output folder; None outside Hydra."""
    try:
        return HydraConfig.get().runtime.output_dir
    except ValueError:
        return None


def early_name(cfg: DictConfig) -> str:
    """A run name for a job whose config did not resolve into a spec."""
    return f"{cfg.get('draft', {}).get('name', '?')}-k{cfg.get('k', '?')}-s{cfg.get('seed', '?')}"


def run_trial_job(cfg: DictConfig, ctx: SweepContext | None, num: int | None = None, on_run=None):
    """The trial with its bookkeeping: alone (`single_run`) or as job `num` of a sweep (`sweep_job`).
    on_run(run_id) is called once its run exists. A failure marks that run (when there is one) and
    is said in one line: on stderr with exit 2 (bad input) or 1 (a full disk) alone, in the log in a
    sweep; any other failure alone ends with its traceback."""
    job_started = time.perf_counter()
    held = _Held()
    try:
        spec = trial_spec(cfg)  # the config is read here, once; the trial gets the spec
        if ctx is None:
            return single_run(cfg, spec, held, job_started)
        return sweep_job(cfg, spec, ctx, num, on_run, held, job_started)
    except SpecsweepError as e:
        if ctx is None:  # a single run: bad input, one line on stderr
            error_line(str(e))
        else:
            log.error("trial #%s: error: %s", num, e)
        if held.record:
            held.record.fail(str(e))
        elif ctx:
            record_early_failure(cfg, ctx, num, str(e))
        if ctx is None:
            sys.exit(2)
    except Exception as e:
        full = disk_full(e, written_folders(cfg, hydra_output_dir()))
        if full:   # said in one line, not a traceback; what finished is kept, so the rerun resumes
            message = f"the disk is full ({full}): free space and rerun the same command"
            if ctx is None:
                error_line(str(message))
            else:
                log.error("trial #%s: error: %s", num, message)
        else:
            log.error("trial failed: %s: %s", type(e).__name__, e)
        if held.record:
            held.record.fail(message if full else traceback.format_exc())
        elif ctx:
            record_early_failure(cfg, ctx, num, message if full else traceback.format_exc())
        if ctx is None:
            if full:
                sys.exit(1)
            raise
    except BaseException:  # interrupted: do not leave the run RUNNING
        if held.record:
            held.record.fail("interrupted", status="KILLED")
        raise
    return None


class _Held:
    """The trial's run, once it exists (run_trial_job's error handling marks it)."""
    record: "TrialRecord | None" = None


def check_single_run(cfg: DictConfig) -> TrialSpec:
    """Every check of a single run, writing nothing: its spec, its store (when tracked), its inputs.
    Hydra's on_run_start runs it before Hydra makes the run's output folder (src/sweep/callbacks.py),
    so a refused run leaves no outputs/runs/<time>/ behind; single_run runs the same checks again
    (from this process's caches: seconds saved nowhere else)."""
    spec = trial_spec(cfg)
    if cfg.tracking.enabled:
        check_store(tracking_uri(cfg))
    check_inputs(spec)
    return spec


def single_run(cfg: DictConfig, spec: TrialSpec, held: _Held, job_started: float):
    """One trial alone: untracked (tracking.enabled=false), or into its store, every check before any
    work (writing nothing), then the target (trained on first use), then the store's first write."""
    if not cfg.tracking.enabled:
        check_inputs(spec)
        return _run(spec, None, load_target(spec.target), None, cfg, job_started)
    uri = tracking_uri(cfg)
    check_store(uri)
    check_inputs(spec)
    corpus, target = load_target(spec.target)
    experiment_id = setup_experiment(uri, cfg.tracking.experiment)
    client = client_for(uri)
    target_run_id = publish_target(client, experiment_id, uri, target, spec.target).run_id
    held.record = TrialRecord(client, cfg, spec, None, experiment_id, target, target_run_id, None, False,
                              cell_key(spec), None)
    return _run(spec, None, (corpus, target), held.record, cfg, job_started)


def sweep_job(cfg: DictConfig, spec: TrialSpec, ctx: SweepContext, num: int, on_run, held: _Held, job_started: float):
    """Job `num` of a sweep: the same code as the sweep's (compute version), the target from the
    store, skipped when its cell is done, run only once its cell is claimed (a duplicate gives way
    and leaves no run behind)."""
    client = client_for(ctx.tracking_uri)
    if compute_version() != ctx.compute_version:
        raise SpecsweepError(f"this checkout ({socket.gethostname()}: {code_version()}) does not compute as the "
                             f"sweep's ({ctx.code_version}): its engine, trial or conf/ differ; check out "
                             "the same commit")
    source = PublishedTargets(ctx, client)
    corpus, target = load_target(spec.target, source)
    chash = cell_key(spec)
    if cfg.resume and is_done(client, ctx.experiment_id, (ctx.compute_version, ctx.code_version), chash, target.key):
        log.info("trial #%d: an identical run already FINISHED, skipped", num)
        return None
    held.record = TrialRecord(client, cfg, spec, ctx, ctx.experiment_id, target, ctx.target(target.key).run_id, num,
                              target.key in source.fetched, chash, on_run)
    holder = claim_cell(client, ctx.parent_run_id, chash, held.record.run_id)
    if holder is not None:
        client.delete_run(held.record.run_id)
        held.record = None
        log.warning("trial #%d: its cell is held by run %s: this duplicate gives way", num, holder)
        return None
    return _run(spec, source, (corpus, target), held.record, cfg, job_started)


def _run(spec: TrialSpec, source, loaded, record: "TrialRecord | None", cfg: DictConfig, job_started: float):
    """The trial itself, its run finished with the result (when tracked), its lines logged."""
    trial_started = time.perf_counter()
    result = run_trial(spec, source, loaded=loaded)
    result.metrics["trial_s"] = time.perf_counter() - trial_started
    if record is not None:
        record.finish(cfg, result, job_started)
    for line in trial_block(spec, result).splitlines():
        log.info(line)
    return result.metrics
