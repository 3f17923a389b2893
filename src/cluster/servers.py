"""Servers for work beyond one process, all on 127.0.0.1 and all stopped by process id: a
PostgreSQL cluster in a folder, an MLflow tracking server on it (artifacts served through the
server, so clients need no shared folder), and a Ray cluster (a head and worker nodes).

Each server runs as a child in its own session; `Server.stop()` signals it, then kills what is
left of its process tree. Stdlib only at import: ray, mlflow and psycopg2 run in the children.

Ray and loopback: Ray turns 127.0.0.1 into the host's routable address (its servers then listen
there or on all interfaces) unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, and with that variable
`ray start --address` refuses to join. So every node starts through a small wrapper that keeps
127.0.0.1 as it is and sets the variable for the node's children; a driver needs the variable
too (RAY_DRIVER_ENV). Ports Ray would otherwise fix (client server, metrics, agent) are free ones.

Ray and sys.path: a driver's working directory (and its script's folder, when it runs as a
script) goes first on the sys.path of every worker of its job, on every node (the job config's
py_driver_sys_path, inserted by each worker). A node started from another checkout thus imports
the driver's checkout wherever that path exists on its host (always, on one machine); a driver
started in a folder holding no code, its checkout named by PYTHONPATH (which is not passed on),
lets each node import its own.

    python -m src.cluster.servers tracking-up    # PostgreSQL + `mlflow server` (make tracking-server)
    python -m src.cluster.servers tracking-down
    python -m src.cluster.servers ray-up          # a Ray head, --workers N more nodes (make ray-up)
    python -m src.cluster.servers ray-down
    python -m src.cluster.servers status
What the CLI started is recorded in .cluster/state.json (git-ignored), so that a later call can
stop it.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import ipaddress
import json
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from ..door import ArgParser, at_least, command
from ..engine.errors import error_line
from ..paths import REPO

LOOPBACK = "127.0.0.1"
CLUSTER_DIR = REPO / ".cluster"
# What a process that connects to a loopback Ray cluster (a driver) needs in its environment.
RAY_DRIVER_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
# Ray nodes: no 30 s drain on SIGTERM (nothing here needs draining).
_RAY_NODE_ENV = {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
# `ray start ARGS` that keeps a loopback address: the variable is set only after Ray's constants
# are read (else a worker node refuses to join), so that the node's children inherit it.
_RAY_START = """\
import os, sys
import ray._private.services as services
from ray._common.network_utils import get_localhost_ip, is_localhost
services.resolve_ip_for_localhost = lambda host: get_localhost_ip() if is_localhost(host) else host
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
from ray.scripts.scripts import main
sys.argv = ["ray", "start", *sys.argv[1:]]
sys.exit(main())
"""


class ServerError(RuntimeError):
    """A server could not be started or stopped; the message says why in one line."""


# -- processes ---------------------------------------------------------------------------------

def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (index 0 = state), None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def _alive(pid: int, start_ticks: int | None = None) -> bool:
    """Running (not a zombie), and, if given, started at `start_ticks` (no reused pid)."""
    fields = _proc_stat(pid)
    if fields is None or fields[0] in "ZX":
        return False
    return start_ticks is None or int(fields[19]) == start_ticks


def _tree(pid: int, descendants: bool = True) -> dict[int, int]:
    """{pid: start ticks} of the members of process group `pid` and, if `descendants`, of `pid`
    and all its descendants (only ask for those while `pid` is known to be ours and alive)."""
    procs = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _proc_stat(int(entry.name))) is not None:
            procs[int(entry.name)] = (int(fields[1]), int(fields[2]), int(fields[19]))
    tree = {p for p, (_, pgrp, _) in procs.items() if pgrp == pid}
    if descendants and pid in procs:
        tree.add(pid)
        todo = [pid]
        while todo:
            parent = todo.pop()
            kids = {p for p, (ppid, _, _) in procs.items() if ppid == parent} - tree
            tree |= kids
            todo.extend(kids)
    return {p: procs[p][2] for p in tree}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (another process may still take it before it is used)."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((LOOPBACK, port)) == 0


def listening_sockets() -> list[tuple[str, int, set[int]]]:
    """Every listening TCP socket as (address, port, pids holding it), read from /proc.
    An IPv4-mapped IPv6 address is given as the IPv4 address."""
    owners: dict[str, set[int]] = {}
    for fd_dir in glob.glob("/proc/[0-9]*/fd"):
        try:
            for fd in os.listdir(fd_dir):
                target = os.readlink(f"{fd_dir}/{fd}")
                if target.startswith("socket:["):
                    owners.setdefault(target[8:-1], set()).add(int(fd_dir.split("/")[2]))
        except OSError:
            continue
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] != "0A":                     # 0A: LISTEN
                continue
            hex_ip, hex_port = cols[1].split(":")
            raw = bytes.fromhex(hex_ip)             # 32-bit words in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            ip = ipaddress.ip_address(raw)
            if ip.version == 6 and ip.ipv4_mapped:
                ip = ip.ipv4_mapped
            found.append((str(ip), int(hex_port, 16), owners.get(cols[9], set())))
    return found


@dataclasses.dataclass
class Server:
    """A server process started here: `pid` leads its own session; `address` is what clients use."""
    name: str
    pid: int
    start_ticks: int                    # its start time, so that a reused pid is never signalled
    port: int
    address: str                        # URL or host:port
    log: str
    stop_signal: int = signal.SIGTERM   # what asks it to shut down (PostgreSQL: SIGINT, fast)
    info: dict = dataclasses.field(default_factory=dict)
    proc: subprocess.Popen | None = dataclasses.field(default=None, repr=False, compare=False)

    def alive(self) -> bool:
        return _alive(self.pid, self.start_ticks)

    def pids(self) -> set[int]:
        """The leader, its descendants and its process group, as running now."""
        return set(_tree(self.pid)) if self.alive() else set()

    def stop(self, timeout: float = 20.0) -> None:
        """Send `stop_signal` to the leader and wait up to `timeout` s for it to exit; then
        SIGKILL whatever is left of its process tree and group, and wait until all of it is
        gone. A leader already gone is not signalled (its pid may belong to another process)."""
        tree = _tree(self.pid, descendants=self.alive())
        if self.alive():
            os.kill(self.pid, self.stop_signal)
            deadline = time.monotonic() + timeout
            while self.alive() and time.monotonic() < deadline:
                self._reap(block=False)
                time.sleep(0.1)
            tree.update(_tree(self.pid, descendants=self.alive()))
        self._reap(block=False)
        for pid, ticks in tree.items():
            if _alive(pid, ticks):
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        deadline = time.monotonic() + 10
        while any(_alive(p, t) for p, t in tree.items()) and time.monotonic() < deadline:
            self._reap(block=False)
            time.sleep(0.1)
        self._reap()
        if left := sorted(p for p, t in tree.items() if _alive(p, t)):
            raise ServerError(f"{self.name}: processes {left} survived SIGKILL")

    def _reap(self, block: bool = True) -> None:
        if self.proc is not None:
            if block:
                self.proc.wait()
            else:
                self.proc.poll()

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "proc"}

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _spawn(name: str, cmd: list[str], log: Path, port: int, address: str, *, cwd=None, env=None,
           user: str | None = None, stop_signal: int = signal.SIGTERM, info=None) -> Server:
    log.parent.mkdir(parents=True, exist_ok=True)
    kw = {}
    if user is not None:
        pw = pwd.getpwnam(user)
        kw = dict(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                cwd=cwd, env=env, start_new_session=True, **kw)
    fields = _proc_stat(proc.pid)
    return Server(name, proc.pid, int(fields[19]) if fields else 0, port, address, str(log),
                  stop_signal, info or {}, proc)


def _wait_for(server: Server, ready, what: str, timeout: float) -> Server:
    """Poll `ready()` until true; stop the server and raise if it exits or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while not ready():
        if not server.alive() or time.monotonic() > deadline:
            why = "exited" if not server.alive() else f"not ready after {timeout:.0f} s"
            server.stop(timeout=5)
            raise ServerError(f"{server.name} {why} (waiting for {what}); {_log_tail(server.log)}")
        time.sleep(0.2)
    return server


def _log_tail(log: str) -> str:
    try:
        lines = [ln.strip() for ln in Path(log).read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        lines = []
    return f"last log line: {lines[-1][:300]}" if lines else f"log: {log}"


def _check_port(port: int) -> None:
    if port_in_use(port):
        raise ServerError(f"port {port} on {LOOPBACK} is already in use")


# -- PostgreSQL --------------------------------------------------------------------------------

def pg_bindir() -> Path:
    """PostgreSQL's server programs: `pg_config --bindir` if on PATH, else the newest
    /usr/lib/postgresql/*/bin (where Debian keeps initdb and postgres, outside PATH)."""
    if pg_config := shutil.which("pg_config"):
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        if out.returncode == 0 and (Path(out.stdout.strip()) / "initdb").exists():
            return Path(out.stdout.strip())
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    if not found:
        raise ServerError("PostgreSQL not found: no pg_config on PATH and no "
                          "/usr/lib/postgresql/*/bin/initdb (install the postgresql package)")
    return Path(found[-1]).parent


def _pg_user() -> str | None:
    """Who runs initdb and postgres: the `postgres` user when we are root (both refuse root)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise ServerError("running as root, and PostgreSQL refuses root: create a `postgres` user")
    return "postgres"


def start_postgres(folder: str | Path, port: int, timeout: float = 60.0) -> Server:
    """A PostgreSQL cluster in `folder` (data in folder/data, created by initdb on first use,
    trust authentication) listening on 127.0.0.1:`port` only, its unix socket in `folder`, log
    in folder/postgres.log, with a database `mlflow`. Run as the `postgres` user when root, so
    every parent of `folder` must be searchable by others. `address` is a SQLAlchemy URL."""
    folder = Path(folder).resolve()
    user = _pg_user()
    if len(str(folder / f".s.PGSQL.{port}")) > 107:
        raise ServerError(f"folder path too long for PostgreSQL's unix socket: {folder}")
    _check_port(port)
    bindir = pg_bindir()
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "data"
    if user is not None:
        for parent in folder.parents:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                raise ServerError(f"the postgres user cannot reach {folder}: {parent} is not "
                                  "searchable by others (choose another folder, or chmod o+x)")
        pw = pwd.getpwnam(user)
        os.chown(folder, pw.pw_uid, pw.pw_gid)
    run_as = dict(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[]) if user else {}
    if not (data / "PG_VERSION").exists():
        out = subprocess.run([str(bindir / "initdb"), "-D", str(data), "-U", "postgres",
                              "--auth=trust", "-E", "UTF8", "--locale=C"],
                             capture_output=True, text=True, cwd=folder, **run_as)
        if out.returncode != 0:
            raise ServerError(f"initdb failed: {(out.stderr or out.stdout).strip().splitlines()[-1]}")
    server = _spawn("postgres", [str(bindir / "postgres"), "-D", str(data), "-p", str(port),
                                 "-c", f"listen_addresses={LOOPBACK}",
                                 "-c", f"unix_socket_directories={folder}"],
                    folder / "postgres.log", port,
                    f"postgresql+psycopg2://postgres@{LOOPBACK}:{port}/mlflow",
                    cwd=folder, user=user, stop_signal=signal.SIGINT, info={"folder": str(folder)})
    client = ["-h", LOOPBACK, "-p", str(port), "-U", "postgres"]
    _wait_for(server, lambda: subprocess.run([str(bindir / "pg_isready"), "-q", *client]).returncode == 0,
              "connections", timeout)
    has_db = subprocess.run([str(bindir / "psql"), *client, "-tAc",
                             "SELECT 1 FROM pg_database WHERE datname = 'mlflow'"],
                            capture_output=True, text=True)
    if has_db.stdout.strip() != "1":
        out = subprocess.run([str(bindir / "createdb"), *client, "mlflow"], capture_output=True, text=True)
        if out.returncode != 0:
            server.stop()
            raise ServerError(f"createdb mlflow failed: {out.stderr.strip()}")
    return server


# -- MLflow ------------------------------------------------------------------------------------

def _health(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def start_mlflow_server(db_url: str, artifacts_dir: str | Path, port: int,
                        timeout: float = 120.0) -> Server:
    """`mlflow server` on the database `db_url`, serving artifacts from `artifacts_dir` (clients
    upload and download through it), on 127.0.0.1:`port` with one worker, answering only Host
    headers 127.0.0.1:port and localhost:port. Returns once /health answers; `address` is the
    URL, the log is artifacts_dir/../mlflow-server.log."""
    artifacts_dir = Path(artifacts_dir).resolve()
    artifacts_dir.mkdir(parents=True, exist_ok=True)
    _check_port(port)
    url = f"http://{LOOPBACK}:{port}"
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", db_url,
           "--artifacts-destination", str(artifacts_dir), "--host", LOOPBACK, "--port", str(port),
           "--workers", "1", "--allowed-hosts", f"{LOOPBACK}:{port},localhost:{port}"]
    # No job runner (GenAI evaluation jobs): six fewer processes, and a prompt shutdown.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    server = _spawn("mlflow", cmd, artifacts_dir.parent / "mlflow-server.log", port, url, env=env,
                    info={"artifacts": str(artifacts_dir)})
    return _wait_for(server, lambda: _health(url), f"{url}/health", timeout)


# -- Ray ---------------------------------------------------------------------------------------

def _ray_started(log: Path, offset: int) -> bool:
    """Whether `ray start` said so in `log` past `offset` (the log is appended to, run after run)."""
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            return b"Ray runtime started" in f.read()
    except OSError:
        return False


def _start_ray_node(name: str, args: list[str], num_cpus: int, temp_dir: Path, port: int,
                    address: str, cwd, env, python: str, extra_env: dict, timeout: float) -> Server:
    temp_dir.mkdir(parents=True, exist_ok=True)
    node_env = {**os.environ, **(env or {}), **_RAY_NODE_ENV, **extra_env}
    node_env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)   # the wrapper sets it
    log = temp_dir / "node.log"
    offset = log.stat().st_size if log.exists() else 0
    cmd = [python, "-c", _RAY_START, "--block", f"--temp-dir={temp_dir}", "--disable-usage-stats",
           f"--num-cpus={num_cpus}", f"--dashboard-agent-listen-port={free_port()}", *args]
    server = _spawn(name, cmd, log, port, address, cwd=cwd, env=node_env,
                    info={"temp_dir": str(temp_dir), "num_cpus": num_cpus,
                          **({"cwd": str(cwd)} if cwd else {})})
    return _wait_for(server, lambda: _ray_started(log, offset), "Ray runtime started", timeout)


def start_ray_head(temp_dir: str | Path, port: int, num_cpus: int, cwd=None, env=None,
                   python: str = sys.executable, timeout: float = 60.0) -> Server:
    """A Ray head (GCS on 127.0.0.1:`port`, no dashboard, `num_cpus` CPUs, session files under
    `temp_dir`, log temp_dir/node.log) with every listener on 127.0.0.1; ports Ray would fix
    (client server, metrics, agent) are taken free. `address` is host:port to join or connect.
    `cwd` and `env` (added to ours) are those of the node and so of its workers."""
    _check_port(port)
    extra = {"AUTOSCALER_METRIC_PORT": str(free_port()), "DASHBOARD_METRIC_PORT": str(free_port())}
    return _start_ray_node("ray-head", ["--head", f"--node-ip-address={LOOPBACK}", f"--port={port}",
                                        "--include-dashboard=false",
                                        f"--ray-client-server-port={free_port()}"], num_cpus,
                           Path(temp_dir).resolve(), port, f"{LOOPBACK}:{port}", cwd, env, python,
                           extra, timeout)


def start_ray_worker(address: str, temp_dir: str | Path, num_cpus: int, cwd=None, env=None,
                     python: str = sys.executable, timeout: float = 60.0) -> Server:
    """A Ray worker node joining the head at `address`, on 127.0.0.1, with its own `temp_dir`.
    Give `cwd` and `env` (e.g. PYTHONPATH) to run it from another checkout; note that Ray puts a
    driver's working directory first on its workers' sys.path (see the module docstring)."""
    return _start_ray_node("ray-worker", [f"--address={address}"], num_cpus,
                           Path(temp_dir).resolve(), 0, address, cwd, env, python, {}, timeout)


def node_code_env() -> dict[str, str]:
    """PYTHONPATH for a Ray node started from this checkout: its workers import the project from it."""
    paths = [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(REPO)]
    return {"PYTHONPATH": os.pathsep.join(paths)}


# -- state and CLI -----------------------------------------------------------------------------

def _load(state_file: Path) -> dict[str, list[Server]]:
    try:
        raw = json.loads(state_file.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ServerError(f"cannot read {state_file}: {e}")
    return {group: [Server(**s) for s in servers] for group, servers in raw.items()}


def _save(state_file: Path, state: dict[str, list[Server]]) -> None:
    state_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({g: [s.to_dict() for s in ss] for g, ss in state.items() if ss},
                              indent=2))
    tmp.replace(state_file)


def _show(path: str) -> str:
    p = Path(path)
    return str(p.relative_to(Path.cwd())) if p.is_relative_to(Path.cwd()) else str(p)


def _tracking_line(servers: list[Server]) -> str:
    pg, ml = servers
    return (f"tracking server: {ml.address} (PostgreSQL on {LOOPBACK}:{pg.port}, "
            f"data in {_show(pg.info['folder'])})")


def _ray_line(servers: list[Server]) -> str:
    head, workers = servers[0], servers[1:]
    return (f"ray cluster: {head.address} (head + {len(workers)} worker node"
            f"{'' if len(workers) == 1 else 's'}, {head.info['num_cpus']} CPU"
            f"{'' if head.info['num_cpus'] == 1 else 's'} each, logs in "
            f"{_show(str(Path(head.info['temp_dir']).parent))}; drivers need "
            + " ".join(f"{k}={v}" for k, v in RAY_DRIVER_ENV.items()) + ")")


def _running(state: dict, group: str) -> list[Server] | None:
    servers = state.get(group)
    return servers if servers and all(s.alive() for s in servers) else None


def _down(state: dict, group: str) -> list[Server]:
    """Stop a group, last started first; return what was stopped."""
    servers = state.pop(group, [])
    for s in reversed(servers):
        s.stop()
    return servers


def _up(state_file: Path, state: dict, group: list[Server], start) -> None:
    """Start one more server of `group` and record it at once; if it fails, stop the group."""
    try:
        group.append(start())
    except BaseException:
        while group:
            group.pop().stop()
        _save(state_file, state)
        raise
    _save(state_file, state)


def port_number(text: str) -> int:
    """An argparse `type`: a TCP port, 1 to 65535."""
    value = at_least(1)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a port from 1 to 65535, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    ap = ArgParser(prog="python -m src.cluster.servers", description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["tracking-up", "tracking-down", "ray-up", "ray-down", "status"])
    ap.add_argument("--dir", type=Path, default=CLUSTER_DIR, help="state, data and logs (default .cluster/)")
    ap.add_argument("--port", type=port_number, help="tracking-up: MLflow port (5001); ray-up: GCS port (6379)")
    ap.add_argument("--pg-port", type=port_number, default=5433, help="tracking-up: PostgreSQL port")
    ap.add_argument("--num-cpus", type=at_least(1), default=os.cpu_count() or 1, help="ray-up: CPUs per node")
    ap.add_argument("--workers", type=at_least(0), default=0, help="ray-up: worker nodes besides the head")
    args = ap.parse_args(argv)
    folder = args.dir.resolve()
    state_file = folder / "state.json"
    try:
        state = _load(state_file)
        if args.command == "tracking-up":
            if (running := _running(state, "tracking")) is None:
                _down(state, "tracking")                 # whatever half of it is left
                running = state["tracking"] = []
                _up(state_file, state, running, lambda: start_postgres(folder / "postgres", args.pg_port))
                pg_url = running[0].address
                _up(state_file, state, running,
                    lambda: start_mlflow_server(pg_url, folder / "artifacts", args.port or 5001))
            print(_tracking_line(running))
        elif args.command == "ray-up":
            if (running := _running(state, "ray")) is None:
                _down(state, "ray")
                running = state["ray"] = []
                # every node's workers import this checkout, wherever the driver starts (a driver
                # started in a folder without code would otherwise lose every job: "No module named 'src'")
                code = node_code_env()
                _up(state_file, state, running,
                    lambda: start_ray_head(folder / "ray" / "head", args.port or 6379, args.num_cpus, env=code))
                for i in range(args.workers):
                    _up(state_file, state, running, lambda: start_ray_worker(
                        running[0].address, folder / "ray" / f"worker{i + 1}", args.num_cpus, env=code))
            print(_ray_line(running))
        elif args.command in ("tracking-down", "ray-down"):
            group = args.command.split("-")[0]
            what = "tracking server" if group == "tracking" else "ray cluster"
            stopped = _down(state, group)
            _save(state_file, state)
            print(f"{what} stopped (pids {', '.join(str(s.pid) for s in stopped)})" if stopped
                  else f"{what}: not running")
        else:
            for group, line in (("tracking", _tracking_line), ("ray", _ray_line)):
                what = "tracking server" if group == "tracking" else "ray cluster"
                if running := _running(state, group):
                    print(line(running))
                elif state.get(group):
                    print(f"{what}: not running (some of its processes exited; "
                          f"`python -m src.cluster.servers {group}-down` clears it)")
                else:
                    print(f"{what}: not running")
    except (ServerError, OSError) as e:
        error_line(str(e))
        return 2
    except Exception as e:                              # a bug: still one line, and its kind
        error_line(f"{type(e).__name__}: {e}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(command(main))
