"""The smoke sweep beyond one host: a Ray cluster on loopback (a head and two worker nodes, each
with its own temp dir; node 1 runs from checkout A, the parent's, node 2 from checkout B at
another path, so the two share nothing but the tracking server) against an MLflow server on
PostgreSQL; and the smoke sweep's k = 1 half on submitit_local. Needs the cluster extra (make setup-cluster)
and PostgreSQL's server programs; skipped without them (CI installs both)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import cluster_extra_missing

MISSING = cluster_extra_missing()
if MISSING:
    pytest.skip(f"cluster extra not installed (no {', '.join(MISSING)}): make setup-cluster", allow_module_level=True)

from mlflow.tracking import MlflowClient  # noqa: E402

from src.cluster.servers import (free_port, start_mlflow_server, start_postgres, start_ray_head,  # noqa: E402
                                 start_ray_worker)
from src.engine.atomic import file_sha256  # noqa: E402
from tests.conftest import COUNTERS, LASTING_TRIAL, MODEL_DRAFTS, REPO, smoke_cmd, trial_counters  # noqa: E402

pytestmark = pytest.mark.slow  # real sweeps and servers: minutes (make test-fast skips them)
# one worker runs this file and test_servers.py, one test after another (ONE_WORKER_FILES in conftest)

NOT_COPIED = {".venv", "data", "mlruns", "outputs", "results", ".cluster", ".pytest_cache"}  # at the top


def copy_checkout(dest: Path) -> Path:
    """A second checkout of the same code at another path: the working tree and its .git (so the
    code version, commit plus any uncommitted diff, is the same), without data or outputs."""
    def ignore(folder, names):
        return [n for n in names if n == "__pycache__" or (Path(folder) == REPO and n in NOT_COPIED)]
    shutil.copytree(REPO, dest, ignore=ignore, symlinks=True)
    return dest


class Cluster:
    def __init__(self, root: Path):
        self.root, self.servers = root, []
        self.a, self.b = copy_checkout(root / "a"), copy_checkout(root / "b")
        self.driver_dir = root / "driver"   # the driver runs here, in a folder holding no code:
        self.driver_dir.mkdir()             # Ray puts a driver's cwd first on every worker's sys.path
        pg = self._start(start_postgres(root / "pg", free_port()))
        self.url = self._start(start_mlflow_server(pg.address, root / "artifacts", free_port())).address
        head = self._start(start_ray_head(root / "ray-head", free_port(), num_cpus=0, cwd=self.a,
                                          env={"PYTHONPATH": str(self.a)}))
        self.address = head.address
        for name, checkout in (("ray-1", self.a), ("ray-2", self.b)):
            self._start(start_ray_worker(head.address, root / name, num_cpus=1, cwd=checkout,
                                         env={"PYTHONPATH": str(checkout)}))

    def _start(self, server):
        self.servers.append(server)
        return server

    def stop(self):
        for server in reversed(self.servers):
            server.stop()

    def sweep_cmd(self, *extra: str) -> list[str]:
        return [sys.executable, "-m", "src.run", "--config-dir", str(self.a / "sweeps"), "--config-name", "smoke",
                "hydra/launcher=ray", f"tracking.uri={self.url}", *extra]

    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")}
        return {**env, "PYTHONPATH": str(self.a), "RAY_ADDRESS": self.address}

    def popen(self, *extra: str) -> subprocess.Popen:
        return subprocess.Popen(self.sweep_cmd(*extra), cwd=self.driver_dir, env=self.env(), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def run(self, *extra: str) -> tuple[int, str]:
        proc = self.popen(*extra)
        out, _ = proc.communicate(timeout=900)
        return proc.returncode, out


@pytest.fixture(scope="module")
def cluster():
    root = Path(tempfile.mkdtemp(prefix="ssc-"))  # short (unix sockets) and reachable by the postgres user
    root.chmod(0o755)
    c = None
    try:
        c = Cluster(root)
        yield c
    finally:
        if c is not None:
            c.stop()
        shutil.rmtree(root, ignore_errors=True)


def runs_by_kind(url: str, experiment: str) -> tuple[MlflowClient, dict]:
    client = MlflowClient(url)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    kinds: dict = {"sweep": [], "trial": [], "target": []}
    for r in runs:
        kinds[r.data.tags.get("specsweep.kind")].append(r)
    return client, kinds


def wait_for_running_trial(url: str, experiment: str, proc, where=lambda run: True, timeout=600):
    """A trial run that is RUNNING on the server (and matches `where`), once there is one."""
    deadline = time.time() + timeout
    client = MlflowClient(url)
    while True:
        assert proc.poll() is None and time.time() < deadline, "no trial ran where expected"
        exp = client.get_experiment_by_name(experiment)
        if exp is not None:
            for run in client.search_runs([exp.experiment_id], "attributes.status = 'RUNNING' and "
                                          "tags.`specsweep.kind` = 'trial'"):
                if where(run):
                    return run
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


def test_smoke_sweep_on_two_ray_nodes_shares_nothing_but_the_tracking_server(cluster, smoke_stores):
    rc, out = cluster.run("tracking.experiment=two-nodes")
    assert rc == 0, out[-4000:]
    client, runs = runs_by_kind(cluster.url, "two-nodes")
    (parent,) = runs["sweep"]
    assert parent.info.status == "FINISHED" and parent.data.tags["launcher"] == "RayLauncher"
    assert parent.data.metrics["trials_finished"] == 6 == int(parent.data.tags["trials_planned"])
    assert parent.data.metrics["trials_failed"] == 0
    trials = runs["trial"]
    assert len(trials) == 6 and all(r.info.status == "FINISHED" for r in trials)
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in trials)
    by_checkout = {str(cluster.a): [], str(cluster.b): []}
    for r in trials:
        by_checkout[r.data.tags["repo_path"]].append(r)
    assert by_checkout[str(cluster.a)] and by_checkout[str(cluster.b)], "both nodes ran trials"
    # counters: exactly those of the joblib sweep
    assert {(r.data.params["draft"], r.data.params["k"]): {c: r.data.metrics[c] for c in COUNTERS}
            for r in trials} == trial_counters(smoke_stores[1][0])
    # the target: trained once by the parent, one target run, the same bytes on every node
    (target,) = runs["target"]
    key, sha = target.data.tags["target_key"], target.data.tags["sha256"]
    for checkout in (cluster.a, cluster.b):
        assert file_sha256(checkout / "data" / "models" / f"target-{key}.pt") == sha
    assert any(r.data.tags["target_fetched"] == "true" for r in by_checkout[str(cluster.b)])   # from the server
    assert all(r.data.tags["target_fetched"] == "false" for r in by_checkout[str(cluster.a)])  # the parent's copy
    assert all(r.data.tags["target_run_id"] == target.info.run_id for r in trials)
    assert out.count("trained target") == 1       # the parent's training; a worker cannot train (never asked to)


# the kill tests' sweep: two model drafts' cells (each lasts: LASTING_TRIAL), one a node at once
KILL_GRID = (f"draft={','.join(MODEL_DRAFTS)}", "k=4")


def test_a_trial_killed_on_the_second_node_fails_the_sweep_and_the_rerun_resumes(cluster):
    args = ("tracking.experiment=kill-trial", *LASTING_TRIAL, *KILL_GRID)
    proc = cluster.popen(*args)
    victim = wait_for_running_trial(cluster.url, "kill-trial", proc,
                                    lambda run: run.data.tags.get("repo_path") == str(cluster.b))
    os.kill(int(victim.data.tags["pid"]), signal.SIGKILL)      # the trial's process on node 2
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 1, out[-4000:]
    client, runs = runs_by_kind(cluster.url, "kill-trial")
    killed = client.get_run(victim.info.run_id)
    assert killed.info.status == "FAILED" and "signal 9" in killed.data.tags["error"]
    assert sorted(r.info.status for r in runs["trial"]) == ["FAILED", "FINISHED"]   # the other node's ran on
    (parent,) = runs["sweep"]
    assert parent.info.status == "FAILED" and parent.data.metrics["trials_failed"] == 1

    rc, out2 = cluster.run(*args)
    assert rc == 0, out2[-4000:]
    assert "2 cells: 1 done, 1 to run" in out2
    client, runs = runs_by_kind(cluster.url, "kill-trial")
    assert sorted(r.info.status for r in runs["trial"]) == ["FAILED"] + ["FINISHED"] * 2   # one new run
    (parent2,) = runs["sweep"]                                                            # the same parent
    assert parent2.info.run_id == parent.info.run_id and parent2.info.status == "FINISHED"
    assert parent2.data.metrics["trials_failed"] == 0 and parent2.data.metrics["trials_finished"] == 2
    new = [r for r in runs["trial"] if r.data.tags["sweep_invocation"] != killed.data.tags["sweep_invocation"]]
    assert len(new) == 1 and new[0].data.params["draft"] == killed.data.params["draft"]


def test_a_killed_ray_worker_takes_its_trial_along_and_leaves_no_duplicate(cluster):
    proc = cluster.popen("tracking.experiment=kill-worker", *LASTING_TRIAL, *KILL_GRID)
    victim = wait_for_running_trial(cluster.url, "kill-worker", proc)
    trial_pid = int(victim.data.tags["pid"])
    worker_pid = int(Path(f"/proc/{trial_pid}/stat").read_text().split(") ")[1].split()[1])  # its parent
    os.kill(worker_pid, signal.SIGKILL)                        # the Ray worker, mid-trial
    deadline = time.time() + 30
    while alive(trial_pid) and time.time() < deadline:
        time.sleep(0.1)
    assert not alive(trial_pid), "the trial outlived its worker"
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 1, out[-4000:]                   # a lost trial is a failed sweep
    client, runs = runs_by_kind(cluster.url, "kill-worker")
    finished: dict = {}
    for r in runs["trial"]:
        if r.info.status == "FINISHED":
            cell = r.data.tags["config_hash"]
            finished[cell] = finished.get(cell, 0) + 1
    assert max(finished.values()) == 1 and len(finished) == 1  # no cell twice; the other one ran on
    lost = client.get_run(victim.info.run_id)
    assert lost.info.status == "FAILED" and lost.data.tags["error"].startswith("lost")
    (parent,) = runs["sweep"]
    assert parent.info.status == "FAILED" and parent.data.metrics["trials_failed"] == 1


def test_the_ray_trap_a_node_without_the_code_fails_each_trial_with_its_reason(cluster):
    """The set-up trap of docs/clusters.md: a node started without the checkout on its PYTHONPATH
    (and a driver in a folder without code, so Ray's cwd-on-sys.path does not save it). Each of its
    trials is recorded FAILED on the server with the one-line reason, the driver logs it, the sweep
    exits 1 and nothing is recorded FINISHED; then, on a cluster whose node has the code, the same
    command resumes and finishes every cell."""
    root = Path(tempfile.mkdtemp(prefix="ssb-"))   # short: Ray's unix sockets
    bare = {"PYTHONPATH": str(root)}               # a PYTHONPATH without the code, not the test's own
    servers = []
    args = ("tracking.experiment=no-code", "draft=bigram", "k=1,2")
    try:
        head = start_ray_head(root / "head", free_port(), num_cpus=0, cwd=root, env=bare)
        servers.append(head)
        servers.append(start_ray_worker(head.address, root / "bare", num_cpus=1, cwd=root, env=bare))
        proc = subprocess.run(cluster.sweep_cmd(*args), cwd=cluster.driver_dir, text=True, timeout=900,
                              env={**cluster.env(), "RAY_ADDRESS": head.address},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    finally:
        for server in reversed(servers):
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
    out = proc.stdout
    assert proc.returncode == 1, out[-4000:]
    assert "was lost on the cluster: ModuleNotFoundError: No module named 'src'" in out, out[-4000:]
    client, runs = runs_by_kind(cluster.url, "no-code")
    assert len(runs["trial"]) == 2 and all(r.info.status == "FAILED" for r in runs["trial"]), out[-4000:]
    assert all("No module named 'src'" in r.data.tags["error"] for r in runs["trial"])
    (parent,) = runs["sweep"]
    assert parent.info.status == "FAILED" and parent.data.metrics["trials_failed"] == 2

    rc, out2 = cluster.run(*args)                  # the cluster whose nodes have the code
    assert rc == 0, out2[-4000:]
    assert "2 cells: 0 done, 2 to run" in out2
    client, runs = runs_by_kind(cluster.url, "no-code")
    assert sorted(r.info.status for r in runs["trial"]) == ["FAILED"] * 2 + ["FINISHED"] * 2


def test_smoke_sweep_on_submitit_local(tmp_path, smoke_stores):
    store = tmp_path / "store"
    store.mkdir()
    # the smoke sweep's k = 1 half: submitit starts a fresh process per job, which is the slow part
    cmd = ([c for c in smoke_cmd(store, 1) if not c.startswith("hydra.launcher.n_jobs")]
           + ["hydra/launcher=submitit_local", "hydra.sweeper.params.k=1"])
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    uri = f"sqlite:///{store}/mlflow.db"
    client, runs = runs_by_kind(uri, "specsweep")
    (parent,) = runs["sweep"]
    assert parent.info.status == "FINISHED" and parent.data.tags["launcher"] == "LocalLauncher"
    assert parent.data.metrics["trials_finished"] == 3 and parent.data.metrics["trials_failed"] == 0
    assert trial_counters(uri) == {key: c for key, c in trial_counters(smoke_stores[1][0]).items() if key[1] == "1"}
