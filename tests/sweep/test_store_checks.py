"""A database store (PostgreSQL, MySQL, SQL Server) is tried before any work: a server that does
not answer, a driver SQLAlchemy maps the URI to that is not installed, and a URI SQLAlchemy cannot
read are each one sentence (SpecsweepError), never a traceback after the target has trained."""
from __future__ import annotations

import importlib.util
import socket

import pytest

from src.engine.errors import SpecsweepError
from src.sweep.store import check_database
from src.sweep.tracking import check_store


@pytest.fixture
def listening_port():
    """A loopback port something listens on (no database speaks there): reachable, not a server."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


def refusal(uri: str) -> str:
    check_database.cache_clear()
    with pytest.raises(SpecsweepError) as e:
        check_store(uri)
    return str(e.value)


def test_a_database_server_that_does_not_answer_is_refused():
    assert "database server 127.0.0.1:9 is not reachable" in refusal("postgresql+psycopg2://u@127.0.0.1:9/mlflow")
    assert "127.0.0.1:9 is not reachable" in refusal("mysql://u@127.0.0.1:9/mlflow")


@pytest.mark.skipif(importlib.util.find_spec("psycopg") is not None, reason="psycopg 3 is installed here")
def test_a_bare_postgresql_uri_names_the_missing_psycopg_3(listening_port):
    message = refusal(f"postgresql://u@127.0.0.1:{listening_port}/mlflow")
    assert "its driver psycopg is not installed" in message and "make setup-cluster" in message


def test_an_unknown_driver_is_refused(listening_port):
    assert "SQLAlchemy cannot read it" in refusal(f"postgresql+nosuch://u@127.0.0.1:{listening_port}/mlflow")


@pytest.mark.skipif(importlib.util.find_spec("psycopg2") is None, reason="psycopg2 (the cluster extra) is not installed")
def test_a_port_that_is_not_a_database_cannot_be_connected_to():
    """The driver is there and the port answers, but no PostgreSQL speaks on it."""
    import threading

    def hang_up():   # accept and close every connection (the reachability probe's, then the driver's)
        while True:
            try:
                conn, _ = server.accept()
            except OSError:   # the server socket closed: the test is over
                return
            conn.close()
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    thread = threading.Thread(target=hang_up, daemon=True)
    thread.start()
    try:
        assert "cannot connect" in refusal(f"postgresql+psycopg2://u@127.0.0.1:{server.getsockname()[1]}/mlflow")
    finally:
        server.close()


def test_a_failure_is_tried_again_on_the_next_call(monkeypatch):
    """check_database caches successes only: a server that was down is tried again."""
    calls = []
    real = socket.create_connection
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: calls.append(a) or real(*a, **k))
    uri = "postgresql+psycopg2://u@127.0.0.1:9/mlflow"
    check_database.cache_clear()
    for _ in range(2):
        with pytest.raises(SpecsweepError):
            check_database(uri)
    assert len(calls) == 2


# --- the analysis's side: a store it reads is tried first, and nothing is written to it ---------------

def test_report_and_predict_refuse_a_bad_store_in_one_line_and_write_nothing(tmp_path, capsys):
    """Not MLflow's model-registry message or a driver's traceback: the store rules' own sentence."""
    import sqlite3

    from analysis import report
    from src import predict
    foreign = tmp_path / "app.db"
    con = sqlite3.connect(foreign)
    con.execute("CREATE TABLE customers (id INTEGER)")
    con.commit()
    con.close()
    text = tmp_path / "notes.txt"
    text.write_text("not a database")
    before = {p: p.read_bytes() for p in (foreign, text)}
    cases = [("ftp://host/store", "unknown scheme 'ftp'"),
             ("http://127.0.0.1:9", "is not reachable"),
             ("postgresql+psycopg2://u@127.0.0.1:9/mlflow", "database server 127.0.0.1:9 is not reachable"),
             ("sqlite:////dev/null", "is not a regular file"),
             (f"sqlite:///{text}", "is not an SQLite database"),
             (f"sqlite:///{foreign}", "is not an MLflow store"),
             (f"sqlite:///{tmp_path / 'missing.db'}", "no tracking store at")]
    for uri, message in cases:
        for command in (lambda: report.main(["--tracking-uri", uri]),
                        lambda: predict.main(["--validate", "--tracking-uri", uri])):
            check_database.cache_clear()
            assert command() == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], (uri, err)
    assert {p: p.read_bytes() for p in (foreign, text)} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db", "notes.txt"]
