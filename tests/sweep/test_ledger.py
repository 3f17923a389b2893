"""The sweep's ledger on the tracking server: cell claims are exclusive, reopened only after a
failure, and lost runs are marked FAILED (src/sweep/ledger.py)."""
from __future__ import annotations

import multiprocessing as mp

import pytest
from mlflow.tracking import MlflowClient

from src.sweep.ledger import mark_lost
from src.sweep.resume import claim_cell


@pytest.fixture
def store(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("specsweep", artifact_location=(tmp_path / "artifacts").as_uri())
    parent = client.create_run(exp).info.run_id
    return uri, client, exp, parent


def test_a_cell_is_claimed_once_and_reopened_only_after_a_failure(store):
    _, client, exp, parent = store
    first, second, third = (client.create_run(exp).info.run_id for _ in range(3))
    assert claim_cell(client, parent, "cellA", first) is None            # claimed
    assert claim_cell(client, parent, "cellA", first) is None            # idempotent for its holder
    assert claim_cell(client, parent, "cellA", second) == first          # RUNNING holder: a duplicate gives way
    assert claim_cell(client, parent, "cellB", second) is None           # another cell is free
    client.set_terminated(first, "FAILED")
    assert claim_cell(client, parent, "cellA", second) is None           # reopened after the failure
    assert claim_cell(client, parent, "cellA", third) == second
    client.set_terminated(second, "FINISHED")
    assert claim_cell(client, parent, "cellA", third) == second          # never a second FINISHED run
    params = client.get_run(parent).data.params
    assert params["claim.cellA.0"] == first and params["claim.cellA.1"] == second and "claim.cellA.2" not in params


def _claimer(uri, parent, exp, barrier, queue):
    client = MlflowClient(uri)
    run_id = client.create_run(exp).info.run_id
    barrier.wait()
    queue.put((run_id, claim_cell(client, parent, "contested", run_id)))


@pytest.mark.slow
def test_concurrent_claims_have_exactly_one_winner(store):
    uri, client, exp, parent = store
    ctx = mp.get_context("spawn")
    n = 6
    barrier, queue = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_claimer, args=(uri, parent, exp, barrier, queue)) for _ in range(n)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in range(n)]
    for p in procs:
        p.join(timeout=60)
    winners = [run for run, holder in results if holder is None]
    assert len(winners) == 1
    assert all(holder == winners[0] for run, holder in results if holder is not None)
    assert client.get_run(parent).data.params["claim.contested.0"] == winners[0]


def test_lost_runs_are_marked_failed(store):
    _, client, exp, _ = store
    running, done = client.create_run(exp).info.run_id, client.create_run(exp).info.run_id
    client.set_terminated(done, "FINISHED")
    runs = [client.get_run(running), client.get_run(done)]
    assert mark_lost(client, runs, "lost: test") == 1
    assert client.get_run(running).info.status == "FAILED"
    assert client.get_run(running).data.tags["error"] == "lost: test"
    assert client.get_run(done).info.status == "FINISHED"


def test_counts_by_status_from_sql_equal_the_search(store):
    """The progress line's counts, taken with one SQL query on MLflow's SQL store, are what
    searching the runs gives: only trial runs of that launch, deleted runs left out."""
    from src.sweep.ledger import _sql_status_counts, invocation_counts, invocation_runs, status_counts
    _, client, exp, _ = store
    trial = {"specsweep.kind": "trial", "sweep_invocation": "inv1"}
    for status in ("FINISHED", "FINISHED", "FAILED", "KILLED", None):
        run = client.create_run(exp, tags=trial).info.run_id
        if status:
            client.set_terminated(run, status)
    client.delete_run(client.create_run(exp, tags=trial).info.run_id)                  # gave way: deleted
    client.create_run(exp, tags={**trial, "sweep_invocation": "inv2"})                  # another launch
    client.create_run(exp, tags={"specsweep.kind": "sweep", "sweep_invocation": "inv1"})  # not a trial
    expected = status_counts(invocation_runs(client, exp, "inv1"))
    assert expected == {"FINISHED": 2, "FAILED": 1, "KILLED": 1, "RUNNING": 1}
    assert _sql_status_counts(client, exp, {"specsweep.kind": "trial", "sweep_invocation": "inv1"}) == expected
    assert invocation_counts(client, exp, "inv1") == expected
    assert invocation_counts(client, exp, "nosuch") == {}
    assert [r.info.status for r in invocation_runs(client, exp, "inv1", status="RUNNING")] == ["RUNNING"]


def test_a_trial_killed_before_it_sent_its_run_id_is_still_failed_by_its_worker(store):
    """The worker learns its trial's run id over a pipe; a trial killed before sending it leaves
    a RUNNING run that the worker finds by the trial's pid and job number in its launch."""
    from src.sweep.context import SweepContext
    from src.sweep.job import record_death
    uri, client, exp, parent = store
    tags = {"specsweep.kind": "trial", "sweep_invocation": "inv", "job_num": "3"}
    victim = client.create_run(exp, tags={**tags, "pid": "4242"}).info.run_id
    other_pid = client.create_run(exp, tags={**tags, "pid": "4343"}).info.run_id      # another worker's
    other_launch = client.create_run(exp, tags={**tags, "sweep_invocation": "old", "pid": "4242"}).info.run_id
    ctx = SweepContext("s", "n", "inv", parent, exp, uri, "v", 4, 4, 1, 0.0, "elsewhere:1")
    record_death(ctx, 3, -9, None, 4242)
    killed = client.get_run(victim)
    assert killed.info.status == "FAILED" and "signal 9" in killed.data.tags["error"]
    assert [client.get_run(r).info.status for r in (other_pid, other_launch)] == ["RUNNING", "RUNNING"]
    record_death(ctx, 3, -9, None, 9999)             # no run carries this pid: nothing is touched
    assert client.get_run(other_pid).info.status == "RUNNING"
