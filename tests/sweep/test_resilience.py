"""A sweep that survives: parallel writers, a killed trial, resume, bad input, atomic files."""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from src.engine.atomic import atomic_path, write_text
from tests.conftest import FAULT_CELLS, FAULT_GRID, LASTING_TRIAL, REPO, runs_of, smoke_cmd, trial_counters
from tests.commands import run_command

pytestmark = pytest.mark.slow  # real sweeps and servers: minutes (make test-fast skips them)


def _writer(uri: str, barrier, queue) -> None:
    """One process doing what a trial does with the store: set-up, a run, params, metrics."""
    try:
        from mlflow.entities import Metric, Param
        from src.sweep.tracking import client_for, setup_experiment
        barrier.wait(timeout=120)
        exp = setup_experiment(uri, "specsweep")
        client = client_for(uri)
        run = client.create_run(exp, tags={"specsweep.kind": "trial"})
        now = int(time.time() * 1000)
        client.log_batch(run.info.run_id, params=[Param(f"p{i}", str(i)) for i in range(40)],
                         metrics=[Metric(f"m{i}", float(i), now, 0) for i in range(30)])
        client.set_terminated(run.info.run_id, "FINISHED")
        queue.put("ok")
    except Exception as e:  # reported to the test, which fails on it
        queue.put(f"{type(e).__name__}: {e}")


def concurrent_writers(uri: str, n: int = 8) -> list[str]:
    """n processes that open the store at once (a barrier) and each write a run. They are forked from
    a server that imported MLflow and the tool once (a fresh interpreter's imports, times n, were
    most of this test's time on 2 cores); each makes its own client and its own connections."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["mlflow", "mlflow.entities", "src.sweep.tracking", __name__])
    barrier, queue = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(uri, barrier, queue)) for _ in range(n)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=300) for _ in range(n)]
    for p in procs:
        p.join(timeout=60)
    return results


def test_eight_writers_on_a_fresh_sqlite_store(tmp_path):
    uri = f"sqlite:///{tmp_path}/fresh/mlflow.db"
    assert concurrent_writers(uri) == ["ok"] * 8   # no "database is locked", no migration race
    _, runs = runs_of(uri)
    assert len(runs) == 8 and all(r.info.status == "FINISHED" and len(r.data.metrics) == 30 for r in runs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_eight_writers_through_a_local_tracking_server(tmp_path):
    port = _free_port()
    uri = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                               f"sqlite:///{tmp_path}/server.db", "--artifacts-destination", str(tmp_path / "art"),
                               "--host", "127.0.0.1", "--port", str(port), "--workers", "2"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2):
                    break
            except OSError:
                assert server.poll() is None and time.time() < deadline, "the tracking server did not start"
                time.sleep(0.5)
        assert concurrent_writers(uri) == ["ok"] * 8
        _, runs = runs_of(uri)
        assert len(runs) == 8 and all(r.info.status == "FINISHED" for r in runs)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def running_trial(uri: str, proc, job_num: str, timeout: float = 300) -> dict:
    """{"pid", "run_id"} of the sweep's job `job_num` once its run is RUNNING on the server.

    The store is first opened under the sweep's own store lock, once its file exists: an MLflow
    client creates the schema on first use, and one racing the sweep's set-up breaks it."""
    from mlflow.tracking import MlflowClient
    from src.sweep.tracking import store_lock
    deadline = time.time() + timeout
    client = exp = None
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"trial #{job_num} never started: the sweep exited {proc.returncode}:\n"
                                 + (proc.stdout.read() if proc.stdout else "")[-3000:])
        assert time.time() < deadline, f"trial #{job_num} never started within {timeout} s"
        if exp is None and os.path.exists(uri.removeprefix("sqlite:///")):
            with store_lock(uri):   # the sweep holds it while it creates the schema and the experiment
                client = MlflowClient(uri)
                exp = client.get_experiment_by_name("specsweep")
        runs = client.search_runs([exp.experiment_id], f"tags.job_num = '{job_num}' and attributes.status = "
                                  "'RUNNING'") if exp else []
        if runs:
            return {"pid": int(runs[0].data.tags["pid"]), "run_id": runs[0].info.run_id}
        time.sleep(0.05)


def test_killed_trial_fails_alone_and_the_rerun_resumes(tmp_path, smoke_stores):
    store = tmp_path / "store"
    store.mkdir()
    cmd = smoke_cmd(store, 2, *LASTING_TRIAL, *FAULT_GRID)
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    victim = running_trial(f"sqlite:///{store}/mlflow.db", proc, job_num="1")  # int8's, found on the server
    os.kill(victim["pid"], signal.SIGKILL)                # the trial's process, mid-run
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 1, out[-3000:]              # the sweep ran to its end, then reported the failure
    assert "trial #1: its process killed by signal 9; its run is marked FAILED" in out
    client, runs = runs_of(f"sqlite:///{store}/mlflow.db")
    trials = [r for r in runs if r.data.tags.get("specsweep.kind") == "trial"]
    killed = client.get_run(victim["run_id"])
    assert killed.info.status == "FAILED" and "signal 9" in killed.data.tags["error"]
    assert sorted(r.info.status for r in trials) == ["FAILED", "FINISHED"]
    parent = [r for r in runs if r.data.tags.get("specsweep.kind") == "sweep"]
    assert len(parent) == 1 and parent[0].info.status == "FAILED"   # closed, not RUNNING forever

    rerun = run_command(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    out2 = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0, out2[-3000:]
    assert "2 cells: 1 done, 1 to run" in out2
    client, runs = runs_of(f"sqlite:///{store}/mlflow.db")
    trials = [r for r in runs if r.data.tags.get("specsweep.kind") == "trial"]
    assert sorted(r.info.status for r in trials) == ["FAILED"] + ["FINISHED"] * 2   # one new run only
    parents = [r for r in runs if r.data.tags.get("specsweep.kind") == "sweep"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"              # the same sweep, continued
    assert trial_counters(f"sqlite:///{store}/mlflow.db") == trial_counters(smoke_stores[1][0], FAULT_CELLS)

    # resume=false plans every cell again; the plan is all this checks, so the sweep is stopped there
    everything = subprocess.Popen(cmd + ["resume=false"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, start_new_session=True)
    plan = ""
    try:
        for plan in everything.stdout:
            if " cells: " in plan:
                break
    finally:
        os.killpg(everything.pid, signal.SIGKILL)  # the sweep and its workers, by process group
        everything.wait(timeout=60)
        everything.stdout.close()
    assert "2 cells: 0 done, 2 to run" in plan, plan


def _one_line_error(proc, message):
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out
    errors = [line for line in out.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0], out[-3000:]


# each trial's spec is checked by the same code as a single run's (tests/cli/test_errors.py has every
# key's message): here, that a sweep runs those checks over all its trials before anything is written
@pytest.mark.parametrize("override,message", [
    ("k=0,4", "trial #0 (draft=bigram k=0): k must be an integer >= 1"),
    ("n_chars=500", "exceeds the model's context window"),
    ("draft=bigram,nosuch", "unknown draft 'nosuch'"),
])
def test_bad_sweep_input_stops_before_writing_anything(tmp_path, override, message):
    store = tmp_path / "store"
    store.mkdir()
    proc = run_command(smoke_cmd(store, 2, override), cwd=REPO, capture_output=True, text=True, timeout=300)
    _one_line_error(proc, message)
    assert not (store / "mlflow.db").exists()                 # no store, no parent run, no trial run


@pytest.mark.parametrize("launcher", ["ray", "submitit_slurm"])
def test_a_host_local_store_with_a_cluster_launcher_is_refused(tmp_path, launcher):
    """Workers on other hosts could not reach a SQLite file: one line, exit 2, nothing written
    (no store, no sweep folder), whether or not the cluster extra is installed."""
    store = tmp_path / "store"
    store.mkdir()
    cmd = [c for c in smoke_cmd(store, 1) if not c.startswith("hydra.launcher.n_jobs")]
    proc = run_command(cmd + [f"hydra/launcher={launcher}"], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "RAY_ADDRESS": "127.0.0.1:1"})
    _one_line_error(proc, "cannot reach the host-local store")
    assert proc.returncode == 2 and list(store.iterdir()) == []


def _single(tiny, tmp_path, *extra, timeout=300):
    cfg, _, _ = tiny
    return run_command([sys.executable, "-m", "src.run", "model=tiny", "train=quick", f"data.path={cfg.data.path}",
                           f"data.cache_dir={cfg.data.cache_dir}", f"prompt='{cfg.prompt}'", "n_chars=64",
                           "timing.pairs=1", f"hydra.run.dir={tmp_path}/run", *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_unusable_tracking_stores(tiny, tmp_path):
    (tmp_path / "a_file").write_text("not a folder")
    _one_line_error(_single(tiny, tmp_path, f"tracking.uri=sqlite:///{tmp_path}/a_file/mlflow.db"),
                    "cannot create the tracking store in")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "mlflow.db").write_bytes(b"this is no database" * 100)
    _one_line_error(_single(tiny, tmp_path, f"tracking.uri=sqlite:///{tmp_path}/bad/mlflow.db"),
                    "is not an SQLite database")
    # the message comes from the 3 s health check before any MLflow call (no retry loop);
    # a hang instead would hit the subprocess timeout and fail the test
    _one_line_error(_single(tiny, tmp_path, f"tracking.uri=http://127.0.0.1:{_free_port()}", timeout=120),
                    "is not reachable")


def test_atomic_files_leave_nothing_half_written(tmp_path):
    target = tmp_path / "table.csv"
    write_text(target, "old\n")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half a ta")
            raise RuntimeError("crash mid-write")
    assert target.read_text() == "old\n"                       # the old file stands
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table.csv"]   # no temporary left behind
