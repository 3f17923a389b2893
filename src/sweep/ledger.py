"""A sweep's state as the tracking server records it: which cells are done, who holds a cell,
how far this launch has got. No file, no process memory: any host asks the same server and
gets the same answer, and the parent's counts and exit status come from here.

- done: a cell (config hash + target key) is done when a FINISHED trial run with the same
  compute version exists in the experiment (resume skips it): the hash of the code and configs
  that compute a trial's numbers (tracking.compute_version), so a commit of docs or analysis
  keeps it done and a change to the engine, the trial or conf/ runs it again. Runs recorded
  before the compute version existed count by their code version (the commit, plus the diff's
  hash when dirty), as then;
- claims: before its work a trial claims its cell on the sweep's parent run by logging the
  param `claim.<config_hash>.<attempt>` = its run id. MLflow params are write-once (a second,
  different value is refused by the store, atomically, under the database's primary key), so
  exactly one run wins each attempt. A new attempt is opened only when the previous holder
  ended FAILED or KILLED: a retried or duplicated job can never yield a second FINISHED run of
  a cell in one sweep;
- lost runs: a trial run still RUNNING when its launch ends (or when its sweep is resumed) had
  its worker die under it; it is marked FAILED;
- reused runs: a cell done by another sweep's run (an earlier sweep with the same cells) is
  recorded on the parent as the param `reused.<config_hash>` = that run's id, so the sweep's
  analysis finds every cell it planned (analysis/sweep_data.py).
"""
from __future__ import annotations

import logging
import os
import socket
import time

from .store import KIND_TAG, TRIAL

log = logging.getLogger(__name__)
CLAIM_PREFIX = "claim."
ENDED_BADLY = ("FAILED", "KILLED")


def search_all(client, experiment_id: str, filter_string: str) -> list:
    """Every run matching the filter, across result pages."""
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], filter_string, max_results=5000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


FINISHED_TRIALS = f"tags.`{KIND_TAG}` = '{TRIAL}' and attributes.status = 'FINISHED'"


def finished_runs(client, experiment_id: str, versions: tuple[str, str], where: str = "") -> list:
    """Every FINISHED trial run of these versions, (compute version, code version): a run that has
    the compute version, or an older run without one that has the code version."""
    compute, code = versions
    runs = search_all(client, experiment_id, f"{FINISHED_TRIALS} and tags.compute_version = '{compute}'{where}")
    legacy = search_all(client, experiment_id, f"{FINISHED_TRIALS} and tags.code_version = '{code}'{where}")
    return runs + [r for r in legacy if "compute_version" not in r.data.tags]


def cell_of(run) -> tuple[str, str]:
    return run.data.tags.get("config_hash"), run.data.tags.get("target_key")


def done_cells(client, experiment_id: str, versions: tuple[str, str]) -> set[tuple[str, str]]:
    """(config_hash, target_key) of every FINISHED trial run of these versions (finished_runs)."""
    return {cell_of(r) for r in finished_runs(client, experiment_id, versions)}


def reused_runs(runs: list, cells: set[tuple[str, str]], sweep_id: str) -> dict[str, str]:
    """config_hash -> the run id of another sweep's FINISHED run that stands for the cell, for
    each cell of `cells` that has no FINISHED run of its own sweep (resume skipped it as done):
    the oldest such run, so that a later close names the same one."""
    own = {cell_of(r) for r in runs if r.data.tags.get("sweep_id") == sweep_id}
    out = {}
    for r in sorted(runs, key=lambda r: r.info.start_time, reverse=True):
        cell = cell_of(r)
        if cell in cells and cell not in own:
            out[cell[0]] = r.info.run_id
    return out


def is_done(client, experiment_id: str, versions: tuple[str, str], config_hash: str, target_key: str) -> bool:
    where = f" and tags.config_hash = '{config_hash}' and tags.target_key = '{target_key}'"
    return bool(finished_runs(client, experiment_id, versions, where))


def claim_cell(client, parent_run_id: str, config_hash: str, run_id: str, tries: int = 20) -> str | None:
    """Claim the cell for `run_id`. None when claimed; else the id of the run that holds it
    (FINISHED, or still RUNNING: this job is a duplicate and must not run)."""
    from mlflow.exceptions import MlflowException
    prefix = f"{CLAIM_PREFIX}{config_hash}."
    for _ in range(tries):
        params = client.get_run(parent_run_id).data.params
        attempts = sorted(int(key[len(prefix):]) for key in params if key.startswith(prefix))
        if attempts:
            holder = params[f"{prefix}{attempts[-1]}"]
            if holder == run_id:
                return None
            if client.get_run(holder).info.status not in ENDED_BADLY:
                return holder
        attempt = attempts[-1] + 1 if attempts else 0
        try:
            client.log_param(parent_run_id, f"{prefix}{attempt}", run_id)
            return None
        except MlflowException:
            continue  # another run took this attempt first: look again at who holds the cell
    raise RuntimeError(f"could not claim cell {config_hash} after {tries} tries")


def invocation_runs(client, experiment_id: str, invocation: str, status: str | None = None) -> list:
    """The trial runs of one launch of a sweep (with `status`: those in that status)."""
    where = f" and attributes.status = '{status}'" if status else ""
    return search_all(client, experiment_id,
                      f"tags.`{KIND_TAG}` = '{TRIAL}' and tags.sweep_invocation = '{invocation}'{where}")


def status_counts(runs) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.info.status] = counts.get(r.info.status, 0) + 1
    return counts


def invocation_counts(client, experiment_id: str, invocation: str) -> dict[str, int]:
    """The trial runs of one launch by status: `status_counts(invocation_runs(...))`, but on an
    SQL store counted by the database in one query, instead of loading every run with its params,
    metrics and tags (each job counts after its trial: that load grew with the sweep)."""
    counts = _sql_status_counts(client, experiment_id, {KIND_TAG: TRIAL, "sweep_invocation": invocation})
    return counts if counts is not None else status_counts(invocation_runs(client, experiment_id, invocation))


def _sql_status_counts(client, experiment_id: str, tags: dict[str, str]) -> dict[str, int] | None:
    """Active runs of the experiment carrying all `tags`, counted by status with one SQL query;
    None where the store is not MLflow's SQL store (a tracking server) or the query fails."""
    try:
        from mlflow.store.tracking.dbmodels.models import SqlRun, SqlTag
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
        from sqlalchemy import func
        from sqlalchemy.orm import aliased
        store = client._tracking_client.store
        if not isinstance(store, SqlAlchemyStore):
            return None
        with store.ManagedSessionMaker() as session:
            query = session.query(SqlRun.status, func.count(SqlRun.run_uuid)).filter(
                SqlRun.experiment_id == int(experiment_id), SqlRun.lifecycle_stage == "active")
            for key, value in tags.items():
                tag = aliased(SqlTag)
                query = query.join(tag, tag.run_uuid == SqlRun.run_uuid).filter(tag.key == key, tag.value == value)
            return {status: n for status, n in query.group_by(SqlRun.status).all()}
    except Exception as e:  # another MLflow's schema, say: the search below still counts right
        log.debug("counting with SQL failed (%s): searching instead", e)
        return None


def process_alive(host_pid: str | None) -> bool | None:
    """Whether the process "host:pid" is alive: True or False on this host, None on another
    (or unknown: no tag)."""
    host, _, pid = (host_pid or "").rpartition(":")
    if not host or host != socket.gethostname() or not pid.isdigit():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has exited: only its parent has not reaped it yet
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def orphaned(run) -> bool:
    """A RUNNING trial run whose sweep parent is gone (on this host: its pid is dead; on another
    host it cannot be asked, and a resumed sweep takes its runs over as before)."""
    return process_alive(run.data.tags.get("sweep_parent")) is not True


def held_elsewhere(client, experiment_id: str, invocation: str, config_hashes: set[str]) -> list:
    """The RUNNING trial runs of these cells that another live launch of the sweep is running."""
    if not config_hashes:
        return []
    runs = search_all(client, experiment_id, f"tags.`{KIND_TAG}` = '{TRIAL}' and attributes.status = 'RUNNING'")
    return [r for r in runs if r.data.tags.get("config_hash") in config_hashes
            and r.data.tags.get("sweep_invocation") != invocation and not orphaned(r)]


def wait_for_others(client, experiment_id: str, invocation: str, config_hashes: set[str], timeout: float,
                    poll: float = 5.0) -> list:
    """Wait (at most `timeout` s) while another live launch runs some of these cells; returns the
    runs still held when it gave up ([] when none is left)."""
    held = held_elsewhere(client, experiment_id, invocation, config_hashes)
    deadline = time.monotonic() + timeout
    if held:
        log.info("waiting for %d cell(s) that another launch of this sweep is running (at most %.0f s)",
                 len(held), timeout)
    while held and time.monotonic() < deadline:
        time.sleep(poll)
        held = held_elsewhere(client, experiment_id, invocation, config_hashes)
    return held


def mark_lost(client, runs, why: str) -> int:
    """Mark the RUNNING runs among `runs` FAILED (their process is gone); return how many."""
    lost = [r for r in runs if r.info.status == "RUNNING"]
    for r in lost:
        try:
            client.set_tag(r.info.run_id, "error", why)
            client.set_terminated(r.info.run_id, "FAILED")
        except Exception as e:
            log.warning("could not mark run %s FAILED: %s", r.info.run_id, e)
    return len(lost)


def sweep_trial_runs(client, experiment_id: str, parent_run_id: str) -> list:
    return search_all(client, experiment_id, f"tags.`{KIND_TAG}` = '{TRIAL}' "
                                             f"and tags.`mlflow.parentRunId` = '{parent_run_id}'")
