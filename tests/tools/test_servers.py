"""The cluster servers (src/cluster/servers.py): PostgreSQL + MLflow tracking server, and a Ray
head with a worker node, all on 127.0.0.1, all gone after stop(). Needs the cluster extra
(make setup-cluster) and PostgreSQL's server programs; skipped without them."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

MISSING = [m for m in ("ray", "psycopg2") if importlib.util.find_spec(m) is None]
if MISSING:
    pytest.skip(f"cluster extra not installed (no {', '.join(MISSING)}): make setup-cluster",
                allow_module_level=True)

from src.paths import REPO  # noqa: E402
from src.cluster.servers import (RAY_DRIVER_ENV, ServerError, free_port, listening_sockets,  # noqa: E402
                                 main, pg_bindir, start_mlflow_server, start_postgres,
                                 start_ray_head, start_ray_worker)

pytestmark = pytest.mark.slow  # real servers: minutes (make test-fast skips them)
# one worker runs this file and test_cluster.py, one test after another (ONE_WORKER_FILES in conftest)


@pytest.fixture
def short_dir():
    """A folder in /tmp that the postgres user can reach (pytest's tmp_path is 0700) and whose
    path is short enough for the unix sockets of PostgreSQL and Ray."""
    path = Path(tempfile.mkdtemp(prefix="ss-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def assert_loopback_only(pids: set[int], must_listen: set[int]) -> set[int]:
    """Every listening socket of `pids` is on 127.0.0.1, and the ports `must_listen` are among
    them; returns all their ports."""
    held = [(ip, port) for ip, port, owners in listening_sockets() if owners & pids]
    assert held and all(ip == "127.0.0.1" for ip, _ in held), held
    ports = {port for _, port in held}
    assert must_listen <= ports, (must_listen, held)
    return ports


def assert_gone(pids: set[int], ports: set[int]) -> None:
    assert not [p for p in pids if Path(f"/proc/{p}").exists()
                and Path(f"/proc/{p}/stat").read_text().split(") ")[1][0] != "Z"]
    assert not {port for _, port, _ in listening_sockets()} & ports
    if shutil.which("ss"):
        out = subprocess.run(["ss", "-Hltn"], capture_output=True, text=True).stdout
        assert not {int(line.split()[3].rsplit(":", 1)[1]) for line in out.splitlines()} & ports


@pytest.fixture
def psql() -> Path:
    """PostgreSQL's client program (its server programs beside it); the test is skipped without them."""
    try:
        return pg_bindir() / "psql"
    except ServerError as e:
        pytest.skip(str(e))


def param_in_postgres(psql: Path, port: int, key: str) -> str:
    """The value of param `key` as the `mlflow` database on 127.0.0.1:`port` holds it."""
    return subprocess.run([str(psql), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-d", "mlflow", "-tAc",
                           f"SELECT value FROM params WHERE key = '{key}'"], capture_output=True, text=True).stdout.strip()


def test_tracking_server_on_postgres(tmp_path, short_dir, psql):
    from mlflow import MlflowClient

    pg = start_postgres(short_dir / "pg", free_port())
    try:
        ml = start_mlflow_server(pg.address, tmp_path / "artifacts", free_port())
        try:
            pids = pg.pids() | ml.pids()
            ports = assert_loopback_only(pids, {pg.port, ml.port})
            client = MlflowClient(ml.address)
            run = client.create_run(client.create_experiment("servers"))
            run_id = run.info.run_id
            client.log_param(run_id, "k", 4)
            client.log_metric(run_id, "speedup", 1.5)
            (tmp_path / "note.txt").write_text("served")
            client.log_artifact(run_id, str(tmp_path / "note.txt"))
            client.set_terminated(run_id)

            got = client.get_run(run_id)
            assert got.info.status == "FINISHED"
            assert got.data.params == {"k": "4"} and got.data.metrics == {"speedup": 1.5}
            assert run.info.artifact_uri.startswith("mlflow-artifacts:")   # served, not a path
            assert [a.path for a in client.list_artifacts(run_id)] == ["note.txt"]
            local = client.download_artifacts(run_id, "note.txt", str(tmp_path))
            assert Path(local).read_text() == "served"
            assert len(list((tmp_path / "artifacts").rglob("note.txt"))) == 1  # the server's copy
            assert param_in_postgres(psql, pg.port, "k") == "4"  # in PostgreSQL
        finally:
            ml.stop()
    finally:
        pg.stop()
    assert_gone(pids, ports)


def test_a_plain_postgresql_uri_works_with_the_cluster_extra(short_dir, psql):
    """`postgresql://USER@HOST:PORT/DB` (no driver named): SQLAlchemy 2.1 takes psycopg 3 for it, which
    the cluster extra pins. Against a PostgreSQL server of this test's own on loopback, the store
    checks pass, the sweep's first write (the experiment) and a run's params and metrics land in
    PostgreSQL and read back, through that URI."""
    if importlib.util.find_spec("psycopg") is None:
        pytest.fail("the cluster extra lacks psycopg 3 (requirements-cluster.txt pins it): make setup-cluster")
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param
    from src.sweep.store import check_database
    from src.sweep.tracking import check_store, setup_experiment

    with start_postgres(short_dir / "pg", free_port()) as pg:
        uri = f"postgresql://postgres@127.0.0.1:{pg.port}/mlflow"
        check_database.cache_clear()
        check_store(uri)                                              # the checks every command runs first
        writer = MlflowClient(uri)
        run_id = writer.create_run(setup_experiment(uri, "plain")).info.run_id
        writer.log_batch(run_id, params=[Param("k", "4")], metrics=[Metric("speedup", 1.5, 0, 0)])
        writer.set_terminated(run_id)
        got = MlflowClient(uri).get_run(run_id).data
        assert (got.params, got.metrics) == ({"k": "4"}, {"speedup": 1.5})
        assert param_in_postgres(psql, pg.port, "k") == "4"           # in PostgreSQL


DRIVER = """
import json, os, sys
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init(address=sys.argv[1], log_to_driver=False)

@ray.remote(num_cpus=1, max_retries=0)
def where():
    import specsweep_clone
    return ray.get_runtime_context().get_node_id(), specsweep_clone.NAME

nodes = [n for n in ray.nodes() if n["Alive"]]
head = [n["NodeID"] for n in nodes if "node:__internal_head__" in n["Resources"]]
ran = ray.get([where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
               .remote() for n in nodes])
sys.path.append(sys.argv[2])
from src.cluster.servers import listening_sockets
listens = [ip for ip, _, pids in listening_sockets() if os.getpid() in pids]
print(json.dumps({"head": head, "ran": ran, "driver_listens": listens}))
"""


def run_driver(address: str, cwd: Path, **env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", DRIVER, address, str(REPO)], cwd=cwd, timeout=120,
                         env={**os.environ, **RAY_DRIVER_ENV, **env}, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_ray_cluster_on_loopback(tmp_path, short_dir):
    """Two nodes on 127.0.0.1, each from its own 'clone' (a folder with specsweep_clone.py on
    its PYTHONPATH). Ray puts the driver's working directory first on every worker's sys.path:
    a driver started in clone a makes the node of clone b import clone a's code too; started
    elsewhere (clone a on its PYTHONPATH, which Ray does not pass on), each node imports its own."""
    clones = {}
    for name in ("a", "b", "elsewhere"):
        clones[name] = tmp_path / name
        clones[name].mkdir()
    for name in ("a", "b"):
        (clones[name] / "specsweep_clone.py").write_text(f"NAME = {name!r}\n")

    head = start_ray_head(short_dir / "head", free_port(), 1, cwd=clones["a"],
                          env={"PYTHONPATH": str(clones["a"])})
    try:
        worker = start_ray_worker(head.address, short_dir / "worker", 1, cwd=clones["b"],
                                  env={"PYTHONPATH": str(clones["b"])})
        try:
            from_a = run_driver(head.address, clones["a"])
            from_elsewhere = run_driver(head.address, clones["elsewhere"], PYTHONPATH=str(clones["a"]))
            pids = head.pids() | worker.pids()
            ports = assert_loopback_only(pids, {head.port})
        finally:
            worker.stop()
    finally:
        head.stop()

    for result in (from_a, from_elsewhere):
        assert len({node for node, _ in result["ran"]}) == 2
        assert result["driver_listens"] and set(result["driver_listens"]) == {"127.0.0.1"}
    (head_id,) = from_a["head"]
    assert {node == head_id: name for node, name in from_a["ran"]} == {True: "a", False: "a"}
    assert {node == head_id: name for node, name in from_elsewhere["ran"]} == {True: "a", False: "b"}
    assert_gone(pids, ports)


def test_cli_one_line_answers(tmp_path, capsys):
    assert main(["status", "--dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == ["tracking server: not running", "ray cluster: not running"]
    assert main(["ray-down", "--dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "ray cluster: not running\n"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["ray-up", "--dir", str(tmp_path), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: port {port} on 127.0.0.1 is already in use\n"
