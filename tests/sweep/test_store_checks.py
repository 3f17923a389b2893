"""A database store (PostgreSQL, MySQL, SQL Server) is tried before any work: a server that does
not answer, a driver SQLAlchemy maps the URI to that is not installed, and a URI SQLAlchemy cannot
read are each one sentence (SpecsweepError), never a traceback after the target has trained."""
from __future__ import annotations

import importlib.util
import socket

import pytest

from src.engine.errors import SpecsweepError
from src.sweep.tracking import check_database, check_store


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
    assert "its driver psycopg is not installed" in message and "postgresql+psycopg2://" in message


def test_an_unknown_driver_is_refused(listening_port):
    assert "SQLAlchemy cannot read it" in refusal(f"postgresql+nosuch://u@127.0.0.1:{listening_port}/mlflow")


@pytest.mark.skipif(importlib.util.find_spec("psycopg2") is None, reason="psycopg2 (the cluster extra) is not installed")
def test_a_port_that_is_not_a_database_cannot_be_connected_to():
    """The driver is there and the port answers, but no PostgreSQL speaks on it."""
    import threading

    def hang_up():   # accept and close, so the driver's handshake fails fast
        conn, _ = server.accept()
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
