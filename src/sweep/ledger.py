"""A sweep's state as the tracking server records it: how far each launch has got, which runs
another live launch holds, which runs were lost. No file, no process memory: any host asks the
same server and gets the same answer, and the parent's counts and exit status come from here.
Which cells are done and who runs each is resume's (src/sweep/resume.py).

- lost runs: a trial run still RUNNING when its launch ends (or when its sweep is resumed) had
  its worker die under it; it is marked FAILED.
"""
from __future__ import annotations

import logging
import os
import socket
import time

from .resume import search_all
from .store import KIND_TAG, TRIAL

log = logging.getLogger(__name__)


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


def held_elsewhere(client, experiment_id: str, invocation: str, cell_keys: set[str]) -> list:
    """The RUNNING trial runs of these cells that another live launch of the sweep is running."""
    if not cell_keys:
        return []
    runs = search_all(client, experiment_id, f"tags.`{KIND_TAG}` = '{TRIAL}' and attributes.status = 'RUNNING'")
    return [r for r in runs if r.data.tags.get("config_hash") in cell_keys
            and r.data.tags.get("sweep_invocation") != invocation and not orphaned(r)]


def wait_for_others(client, experiment_id: str, invocation: str, cell_keys: set[str], timeout: float,
                    poll: float = 5.0) -> list:
    """Wait (at most `timeout` s) while another live launch runs some of these cells; returns the
    runs still held when it gave up ([] when none is left)."""
    held = held_elsewhere(client, experiment_id, invocation, cell_keys)
    deadline = time.monotonic() + timeout
    if held:
        log.info("waiting for %d cell(s) that another launch of this sweep is running (at most %.0f s)",
                 len(held), timeout)
    while held and time.monotonic() < deadline:
        time.sleep(poll)
        held = held_elsewhere(client, experiment_id, invocation, cell_keys)
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
