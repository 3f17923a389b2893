"""The sweep-level side of tracking, as a Hydra callback (runs in the parent process only).

on_run_start (a single run, no -m): the run's checks (src/sweep/job.py: check_single_run) before
Hydra makes the run's output folder, so a refused run leaves no outputs/runs/<time>/ behind.

on_multirun_start: refuse what cannot work (a host-local store with a launcher beyond this
host); plan the sweep (src/sweep/plan.py: validate every job, train each target once and
publish it to the tracking server); open the sweep's parent run (or reopen it, when the same
sweep is run again); hand every job the SweepContext (src/sweep/context.py) by appending
one override to the task overrides. Nothing is written where only this host could read it.
on_multirun_end: count, from the child runs on the server, what finished and what failed
(runs left RUNNING by a dead worker are marked FAILED), log it on the parent run and close it.
Hydra skips on_multirun_end when a launcher raises, so an atexit hook does the same then.
"""
from __future__ import annotations

import atexit
import gc
import logging
import os
import signal
import time
import uuid

from hydra.core.global_hydra import GlobalHydra
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, open_dict, read_write

from ..engine.errors import SpecsweepError, disk_full, error_line
from ..trial.checks import check_inputs
from .compose import Compositions
from .context import SweepContext, this_process
from .launchers import check_launcher, launcher_name, n_workers
from .ledger import invocation_counts, invocation_runs, mark_lost, orphaned, sweep_trial_runs, wait_for_others
from .plan import PlannedJob, plan_jobs, prepare_targets
from .resume import (cell_of, code_version, compute_version, done_cells, finished_jobs, finished_runs, previous_parent,
                     reused_runs, sweep_signature)
from .progress import hms
from .store import KIND_TAG, REUSED_PREFIX, SWEEP
from .targets import publish_target
from .processes import stop_descendants
from .store import check_uri
from .tracking import check_store, client_for, environment_tags, written_folders, setup_experiment, store_lock, \
    tracking_uri

log = logging.getLogger(__name__)

HELD_WAIT_S = 6 * 3600   # how long a sweep ending waits for cells another live launch of it is running


class _ShortContext(logging.Filter):
    """The launcher logs every job's overrides: show the long `sweep={...}` one as `sweep=<id>`."""

    def __init__(self, override: str, short: str) -> None:
        super().__init__()
        self.override, self.short = override, short

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and self.override in record.msg:
            record.msg = record.msg.replace(self.override, self.short)
        return True


class SweepTracking(Callback):
    def __init__(self) -> None:
        self.client = None
        self.ctx: SweepContext | None = None
        self.jobs: list[PlannedJob] = []
        self.closed = False
        self.timers: dict[str, float] = {}   # the parent's own set-up times, logged on the parent run
        self.compositions: Compositions | None = None
        self.close_error: Exception | None = None   # why the parent run could not be counted and closed
        self.counted_failed = 0                     # cells without a FINISHED run, once counted

    def __getstate__(self):
        # Hydra pickles its callbacks to every worker; the client and the plan stay here.
        return {}

    def __setstate__(self, state):
        self.__init__()

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        # a single run (no -m): its checks before Hydra makes its output folder (outputs/runs/<time>/),
        # so a refused run leaves none behind; one line and exit 2, as the job would say it
        from .job import check_single_run
        try:
            check_single_run(config)
        except SpecsweepError as e:
            error_line(str(e))
            raise SystemExit(2) from None
        except Exception as e:   # Hydra would turn it into a warning: said once, by the job, as before
            log.debug("a single run's checks failed before its job: %s", e)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        # Hydra turns an exception here into a warning and launches the jobs anyway: so every
        # failure of the set-up ends the sweep here, with one line and exit status 2; a SIGTERM
        # or SIGINT (Ctrl-C) while it sets up (planning, training a target) ends it as once the
        # trials run (_stop: the stop line, 128 + the signal), not with a KeyboardInterrupt's
        # traceback (an exception raised by a handler can also be swallowed where it lands)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._stop)
        try:
            self._start(config)
        except SpecsweepError as e:
            self._abandon()
            error_line(str(e))
            raise SystemExit(2) from None
        except Exception as e:
            log.debug("the sweep's set-up failed", exc_info=True)
            self._abandon()
            full = disk_full(e, written_folders(config, config.hydra.sweep.get("dir")))
            if full:
                error_line(f"the disk is full ({full}): free space and rerun the same command")
                raise SystemExit(1) from None
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            error_line(f"the sweep's set-up failed: {type(e).__name__}: {first}")
            raise SystemExit(2) from None

    def _start(self, config: DictConfig) -> None:
        started = time.perf_counter()
        if not config.tracking.enabled:
            raise SpecsweepError("a sweep records its trials in a tracking store: tracking.enabled must be true")
        # every check before any work: the store's URI and the launcher's settings, every job's
        # config, every corpus against its trials, the store itself (nothing is written yet)
        uri = check_uri(tracking_uri(config))
        check_launcher(config, uri)
        compositions = Compositions(GlobalHydra.instance().config_loader(), config)
        jobs = plan_jobs(config, compositions)
        for job in jobs:
            check_inputs(job.spec)
        import mlflow.tracking  # noqa: F401  (imported here, so that the store's timer below holds the store alone)
        check_store(uri)
        store_started = time.perf_counter()
        experiment_id = setup_experiment(uri, config.tracking.experiment)   # the first write
        self.client = client = client_for(uri)
        self.timers["setup_store_s"] = time.perf_counter() - store_started  # schema creation on a fresh store
        targets = prepare_targets(jobs, lambda target, spec: publish_target(client, experiment_id, uri, target, spec))
        version, compute = code_version(), compute_version()
        signature = sweep_signature(jobs, compute)
        skipped = finished_jobs(client, experiment_id, jobs, (compute, version)) if config.resume else set()
        name = str(config.get("sweep_name") or "adhoc")
        with store_lock(uri):  # two launches of one sweep at once (enter pressed twice) share one parent run
            previous = previous_parent(client, experiment_id, signature) if config.resume else None
            if previous is not None:  # the same sweep again: continue it under its parent run
                parent_run_id, sweep_id = previous.info.run_id, previous.data.tags["sweep_id"]
                orphans = [r for r in sweep_trial_runs(client, experiment_id, parent_run_id) if orphaned(r)]
                lost = mark_lost(client, orphans, "lost: still RUNNING when its sweep was resumed (its worker died)")
                if lost:
                    log.warning("%d trial run(s) of an earlier launch were left RUNNING: marked FAILED", lost)
                client.update_run(parent_run_id, status="RUNNING")
            else:
                sweep_id = uuid.uuid4().hex[:12]
                tags = {KIND_TAG: SWEEP, "sweep_id": sweep_id, "sweep_name": name, "launcher": launcher_name(config),
                        "n_jobs": str(n_workers(config)), "trials_planned": str(len(jobs)),
                        "sweep_signature": signature, "command_overrides": " ".join(config.hydra.overrides.task),
                        **environment_tags()}
                parent_run_id = client.create_run(experiment_id, tags=tags,
                                                  run_name=f"sweep-{name}-{sweep_id}").info.run_id
        self.jobs = jobs
        self.ctx = SweepContext(sweep_id=sweep_id, sweep_name=name, invocation=uuid.uuid4().hex[:12],
                                parent_run_id=parent_run_id, experiment_id=experiment_id, tracking_uri=uri,
                                code_version=version, compute_version=compute, total=len(jobs), to_run=len(jobs) - len(skipped),
                                n_jobs=n_workers(config), started=time.time(), parent=this_process(),
                                targets=tuple(targets))
        with read_write(config), open_dict(config):
            config.hydra.overrides.task.append(self.ctx.override())  # every job's config gets `sweep`
        # the sweeper's check and the launcher (in this process) get every job's config from the
        # plan's compositions, the context added, instead of composing it twice more
        self.compositions = compositions
        compositions.serve()
        short = _ShortContext(self.ctx.override(), f"sweep=<context of sweep {sweep_id}>")
        for handler in logging.getLogger().handlers:
            handler.addFilter(short)
        # at exit, freeze the heap first: the interpreter's teardown then skips collecting every
        # object of torch, MLflow and Hydra (about 1 s of a sweep's wall time, for nothing)
        atexit.register(gc.freeze)
        atexit.register(self._close, abnormal=True)
        log.info("sweep %s (%s): %d cells: %d done, %d to run, on %s (%s workers), tracked in %s%s", sweep_id, name,
                 len(jobs), len(skipped), len(jobs) - len(skipped), launcher_name(config),
                 self.ctx.n_jobs or "cluster's", uri, "" if config.resume else " (resume=false: rerunning every cell)")
        self.t0 = time.monotonic()
        self.timers["setup_s"] = time.perf_counter() - started

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        failed = self._close(abnormal=False)
        if failed:
            # a full disk fails every trial after it the same way: the last line says so
            full = disk_full(self.close_error or Exception(), written_folders(config, config.hydra.sweep.get("dir")))
            if full:
                n = failed if failed > 0 else self.counted_failed
                cells = f"{n} of {self.ctx.total} cells" if n > 0 else "cells"
                error_line(f"{cells} not finished: the disk is full ({full}); free space and rerun the same "
                           "command to resume")
            raise SystemExit(1)  # a sweep with failed trials: all others ran, and the failures are recorded

    def _close(self, abnormal: bool) -> int:
        """Count from the server, log the counts on the parent run and close it; once.
        Returns the planned cells without a FINISHED run (-1 when they could not be counted)."""
        if self.closed or self.ctx is None:
            return 0
        self.closed = True
        if self.compositions is not None:
            self.compositions.stop()
        ctx, client = self.ctx, self.client
        try:
            running = invocation_runs(client, ctx.experiment_id, ctx.invocation, status="RUNNING")
            lost = mark_lost(client, running, "lost: still RUNNING when its sweep ended (its worker died)")
            done = done_cells(client, ctx.experiment_id, (ctx.compute_version, ctx.code_version))
            pending = {j.cell_key for j in self.jobs if (j.cell_key, j.target_key) not in done}
            # a cell another live launch of this sweep holds is neither done nor failed: wait for it
            held = [] if abnormal else wait_for_others(client, ctx.experiment_id, ctx.invocation, pending,
                                                         HELD_WAIT_S)
            if held:
                log.warning("%d cell(s) still held by another launch of this sweep after %.0f s: not counted "
                            "finished; rerun the command once it ends", len(held), HELD_WAIT_S)
            counts = invocation_counts(client, ctx.experiment_id, ctx.invocation)
            runs = finished_runs(client, ctx.experiment_id, (ctx.compute_version, ctx.code_version))
            done = {cell_of(r) for r in runs}
            finished = sum((j.cell_key, j.target_key) in done for j in self.jobs)
            reused = reused_runs(runs, {(j.cell_key, j.target_key) for j in self.jobs}, ctx.sweep_id)
            failed = ctx.total - finished          # every planned cell without a FINISHED run
            self.counted_failed = failed
            run_now = sum(counts.values())
            wall = time.monotonic() - self.t0
            log.info("sweep %s done: %d/%d cells finished, %d failed, %d trials run now (%d lost), wall %s",
                     ctx.sweep_id, finished, ctx.total, failed, run_now, lost, hms(wall))
            from mlflow.entities import Metric, Param
            from mlflow.exceptions import MlflowException
            now = int(time.time() * 1000)
            if reused:
                try:   # params are write-once: a later close names the same (oldest) runs again
                    client.log_batch(ctx.parent_run_id, params=[Param(f"{REUSED_PREFIX}{h}", run_id)
                                                                for h, run_id in reused.items()])
                except MlflowException as e:
                    log.warning("could not record the %d cells done by other sweeps' runs: %s", len(reused), e)
            client.log_batch(ctx.parent_run_id, metrics=[
                Metric("trials_finished", finished, now, 0), Metric("trials_failed", failed, now, 0),
                Metric("trials_run_now", run_now, now, 0), Metric("trials_lost", lost, now, 0),
                Metric("wall_s", wall, now, 0), *(Metric(k, v, now, 0) for k, v in self.timers.items())])
            status = "FINISHED" if failed == 0 and not abnormal else "FAILED"
            client.set_terminated(ctx.parent_run_id, status)
            return failed
        except Exception as e:  # at exit, the store may be gone: say so, do not raise
            self.close_error = e
            log.warning("could not count and close the sweep's parent run: %s", e)
            return -1

    def _abandon(self) -> None:
        """A set-up that failed after the parent run opened leaves it FAILED, not RUNNING."""
        if self.ctx is not None and self.client is not None and not self.closed:
            self.closed = True
            try:
                self.client.set_terminated(self.ctx.parent_run_id, "FAILED")
            except Exception as e:
                log.warning("could not close the sweep's parent run: %s", e)

    def _stop(self, signum, frame) -> None:
        """SIGTERM or SIGINT to the sweep's parent, from the start of its set-up on: stop every
        process it started (by pid: the launcher's workers, their trials, loky's resource
        tracker), mark this launch's RUNNING trial runs KILLED with the reason, close the parent
        run KILLED, exit 128 + signum. A rerun of the command resumes the sweep. (Trials a cluster
        launcher placed on other hosts are not this process's children: they end as their own
        trials do.)"""
        signal.signal(signum, signal.SIG_DFL)   # a second signal ends the process at once
        why = f"stopped: the sweep's parent got {signal.Signals(signum).name}"
        if self.ctx is None:   # still setting the sweep up (planning, training a target): no trial yet
            error_line(f"{why} while it set the sweep up, before any trial; rerun the same command to resume")
        else:
            error_line(f"{why}; stopping its workers and their trials")
        stopped = stop_descendants()
        if self.ctx is not None and not self.closed:
            self.closed = True
            ctx, client = self.ctx, self.client
            try:
                running = invocation_runs(client, ctx.experiment_id, ctx.invocation, status="RUNNING")
                for r in running:
                    client.set_tag(r.info.run_id, "error", why)
                    client.set_terminated(r.info.run_id, "KILLED")
                client.set_tag(ctx.parent_run_id, "stopped", why)
                client.set_terminated(ctx.parent_run_id, "KILLED")
                log.warning("%s: %d process(es) stopped, %d trial run(s) marked KILLED; rerun the command to "
                            "resume", why, len(stopped), len(running))
            except Exception as e:
                log.warning("could not mark the stopped sweep's runs: %s", e)
        logging.shutdown()
        os._exit(128 + signum)
