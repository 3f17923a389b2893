"""The store rules, in one place: which tracking store, which experiment, how runs are tagged,
and what is tried of a store before it is used (its URI's form, its server, its driver, its file).

Used by the sweep (src/sweep), the analysis (analysis/) and `make ui` alike. It imports
nothing of MLflow and changes no environment, so anything may import it.

    python -m src.sweep.store          # prints the tracking URI the rules give here
    python -m src.sweep.store ui       # the MLflow UI on that store (`make ui`)
"""
from __future__ import annotations

import functools
import os
import socket
import sys
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from ..engine.errors import SpecsweepError
from ..paths import REPO

MLRUNS = REPO / "mlruns"                # the embedded default: SQLite database plus artifacts
DEFAULT_EXPERIMENT = "specsweep"
KIND_TAG = "specsweep.kind"             # what a run is: one of the three kinds below
SWEEP, TRIAL, TARGET = "sweep", "trial", "target"
REUSED_PREFIX = "reused."  # a sweep parent's param reused.<cell key> = another sweep's run of that cell (src/sweep/resume.py)


def default_uri() -> str:
    return f"sqlite:///{MLRUNS / 'mlflow.db'}"


def resolve_uri(configured: str | None = None) -> str:
    """`tracking.uri` if set, else MLFLOW_TRACKING_URI, else the SQLite store in mlruns/."""
    return configured or os.environ.get("MLFLOW_TRACKING_URI") or default_uri()


DATABASE_SCHEMES = ("postgresql", "mysql", "mssql")   # SQLAlchemy stores MLflow opens itself


def check_uri(uri: str) -> str:
    """The store URI if its form is one specsweep can use, else one sentence saying which forms
    are: sqlite:///ABSOLUTE/PATH (three slashes, then the absolute path: jobs start in other
    folders), http(s)://HOST[:PORT] (a tracking server), or a PostgreSQL, MySQL or SQL Server
    URL (scheme[+driver]://USER@HOST/DB, whose driver check_database then requires installed:
    the cluster extra has psycopg 3, for postgresql://, and psycopg2, for postgresql+psycopg2://).
    Nothing is opened here."""
    hint = "use sqlite:///ABSOLUTE/PATH/mlflow.db or a tracking server http://HOST:PORT"
    if not isinstance(uri, str) or not uri.strip():
        raise SpecsweepError(f"the tracking store URI is empty: {hint}")
    parts = urlsplit(uri)
    scheme = parts.scheme.split("+", 1)[0].lower()
    if scheme == "sqlite":
        path = uri[len("sqlite:///"):] if uri.startswith("sqlite:///") else ""
        if not path.startswith("/"):
            raise SpecsweepError(f"tracking store {uri!r}: a SQLite store needs an absolute path, "
                                 "sqlite:////like/this/mlflow.db (sqlite:// and sqlite:///relative/path are refused)")
        return uri
    if scheme in ("http", "https"):
        if not parts.hostname:
            raise SpecsweepError(f"tracking server {uri!r} names no host: {hint}")
        try:
            parts.port
        except ValueError:
            raise SpecsweepError(f"tracking server {uri!r} has a bad port: {hint}") from None
        return uri
    if scheme in DATABASE_SCHEMES:
        if not parts.hostname:
            raise SpecsweepError(f"tracking store {uri!r} names no database host")
        return uri
    if scheme in ("", "file"):
        raise SpecsweepError(f"tracking store {uri!r} is a file store, which MLflow no longer opens by default: {hint}")
    raise SpecsweepError(f"tracking store {uri!r}: unknown scheme {parts.scheme!r}: {hint}")


def sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def is_server(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def is_database(uri: str) -> bool:
    """A PostgreSQL, MySQL or SQL Server URL (with or without +driver)."""
    return uri.split(":", 1)[0].split("+", 1)[0].lower() in DATABASE_SCHEMES


def check_server(uri: str, timeout: float = 3.0) -> None:
    """A tracking server that is down gets a clear message within seconds, not minutes of retries."""
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as resp:
            if resp.status == 200:
                return
            problem = f"HTTP {resp.status}"
    except (OSError, ValueError) as e:
        problem = str(getattr(e, "reason", e))
    raise SpecsweepError(f"tracking server {uri} is not reachable ({problem})")


DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}


@functools.lru_cache(maxsize=8)   # a store that passed stays checked for this process (failures are not cached)
def check_database(uri: str, timeout: float = 3.0) -> None:
    """A PostgreSQL, MySQL or SQL Server store, tried before any work: its server answers on its port
    (within `timeout`), SQLAlchemy's driver for the URI's form is installed, and a connection opens.
    Each failure is one sentence: a bare postgresql:// means psycopg 3 to SQLAlchemy 2, which the
    cluster extra installs (`make setup-cluster`), as it does psycopg2 for postgresql+psycopg2://."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError
    try:
        url = make_url(uri)
        dialect = url.get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError) as e:
        raise SpecsweepError(f"tracking store {uri!r}: SQLAlchemy cannot read it ({e})") from None
    backend = url.get_backend_name()
    port = url.port or DEFAULT_PORTS.get(backend)
    try:
        socket.create_connection((url.host, port), timeout=timeout).close()
    except OSError as e:
        raise SpecsweepError(f"tracking store {uri}: its database server {url.host}:{port} is not reachable "
                             f"({e.strerror or e})") from None
    try:
        dialect.import_dbapi()
    except ImportError as e:
        hint = (" (the cluster extra installs psycopg 3 for postgresql:// and psycopg2 for postgresql+psycopg2://: "
                "make setup-cluster)" if backend == "postgresql" else "")
        raise SpecsweepError(f"tracking store {uri}: its driver {dialect.driver} is not installed ({e}){hint}") from None
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool
    # libpq (psycopg) and the MySQL drivers take a connect timeout in seconds: a port that accepts
    # but never answers is then an error, not a hang
    seconds = {"connect_timeout": max(1, int(timeout))} if backend in ("postgresql", "mysql") else {}
    try:
        create_engine(uri, poolclass=NullPool, connect_args=seconds).connect().close()
    except Exception as e:
        raise SpecsweepError(f"tracking store {uri}: cannot connect ({str(e).strip().splitlines()[0][:200]})") from None


def sqlite_head(path: Path, n: int = 16) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


MLFLOW_TABLES = {"experiments", "runs", "alembic_version"}   # a store MLflow made has all three


def sqlite_tables(db: Path) -> set[str]:
    """The tables of an SQLite file, read through a read-only connection (the file is not changed)."""
    import sqlite3
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            con.close()
    except sqlite3.DatabaseError as e:
        raise SpecsweepError(f"the tracking store {db} cannot be read as an SQLite database ({e})") from None


def foreign_tables(db: Path) -> list[str]:
    """The tables of an SQLite file that is not an MLflow store ([] for an empty file or database, or
    an MLflow store); the file is not changed."""
    if db.stat().st_size == 0:
        return []
    tables = sqlite_tables(db)
    return [] if not tables or MLFLOW_TABLES <= tables else sorted(tables)


def check_reachable(uri: str) -> None:
    """The URI's form (check_uri), and its server or database answering (check_server, check_database)."""
    check_uri(uri)
    if is_server(uri):
        check_server(uri)
    elif is_database(uri):
        check_database(uri)


def check_sqlite_file(db: Path, write: bool) -> None:
    """A SQLite store's file, tried without changing it. Either way it must be a regular file (not a
    folder, a FIFO or a device) holding an SQLite database. To read: it exists, is readable and
    holds MLflow's tables (MLflow would create an empty database at a missing path). To write: it
    is writable in a writable folder, may be empty or missing (its folder must then take a new
    file), and holds no other application's tables (MLflow would add its own to them)."""
    from ..engine.locks import check_creatable
    if db.is_dir():
        raise SpecsweepError(f"the tracking store {db} is a folder, not a database file")
    if not db.exists():
        if not write:
            raise SpecsweepError(f"no tracking store at {db} (run a sweep first, or pass --tracking-uri)")
        check_creatable(db.parent, "the tracking store")
        return
    if not db.is_file():   # a FIFO or a device (/dev/null): reading it could block, writing it loses all
        raise SpecsweepError(f"the tracking store {db} is not a regular file")
    if write and (not os.access(db, os.W_OK) or not os.access(db.parent, os.W_OK)):
        raise SpecsweepError(f"the tracking store {db} is not writable")
    if not write and not os.access(db, os.R_OK):
        raise SpecsweepError(f"the tracking store {db} is not readable")
    empty = db.stat().st_size == 0
    if (not write and empty) or (not empty and not sqlite_head(db).startswith(b"SQLite format 3")):
        raise SpecsweepError(f"the tracking store {db} is not an SQLite database" + (" (corrupt?)" if write else ""))
    if not write and not MLFLOW_TABLES <= sqlite_tables(db):
        raise SpecsweepError(f"the tracking store {db} is not an MLflow store (no MLflow tables): "
                             "pass the mlflow.db a sweep wrote")
    foreign = foreign_tables(db) if write else []
    if foreign:
        raise SpecsweepError(f"the tracking store {db} is another application's database (tables "
                             f"{', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}; no MLflow "
                             "schema): refusing to add MLflow's tables to it; use a new file")


def check_readable(uri: str) -> None:
    """A store the analysis reads, tried before it is opened, writing nothing: its URI's form, its
    server or database answering, or, for SQLite, a regular file holding an MLflow store (MLflow
    would create an empty database at a missing path, or add its tables to another one)."""
    check_reachable(uri)
    db = sqlite_path(uri)
    if db is not None:
        check_sqlite_file(db, write=False)


def is_host_local(uri: str) -> bool:
    """A store only this host can reach: a SQLite file, a file store, a bare path. Workers on
    other hosts would each open a store of their own, so a cluster launcher refuses it."""
    return not is_server(uri) and not uri.startswith(DATABASE_SCHEMES)


def ui_command(uri: str) -> list[str]:
    """What `make ui` runs: the MLflow UI on the store, or, for a server, nothing (it has its own)."""
    if is_server(uri):
        return []
    return [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1",
            "--port", os.environ.get("MLFLOW_UI_PORT", "5000")]


def main(argv: list[str]) -> None:
    uri = resolve_uri()
    if argv[1:] != ["ui"]:
        print(uri)
        return
    cmd = ui_command(uri)
    if not cmd:
        print(f"{uri} is a tracking server: its UI is served there; open {uri} in a browser")
        return
    print(f"MLflow UI for {uri} on http://127.0.0.1:{cmd[-1]}", flush=True)
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    main(sys.argv)
