"""The store rules, in one place: which tracking store, which experiment, how runs are tagged.

Used by the sweep (src/sweep), the analysis (analysis/) and `make ui` alike. It imports
nothing of MLflow and changes no environment, so anything may import it.

    python -m src.sweep.store          # prints the tracking URI the rules give here
    python -m src.sweep.store ui       # the MLflow UI on that store (`make ui`)
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

from ..engine.errors import SpecsweepError
from ..paths import REPO

MLRUNS = REPO / "mlruns"                # the embedded default: SQLite database plus artifacts
DEFAULT_EXPERIMENT = "specsweep"
KIND_TAG = "specsweep.kind"             # what a run is: one of the three kinds below
SWEEP, TRIAL, TARGET = "sweep", "trial", "target"
REUSED_PREFIX = "reused."  # a sweep parent's param reused.<config_hash> = another sweep's run of that cell


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
    URL (scheme[+driver]://USER@HOST/DB). Nothing is opened here."""
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
