"""Helpers for the kb serve tests (no tests here): a fresh database, a seeded corpus, a real uvicorn server
on a free port in a thread of the test process."""
from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid

import psycopg

MALICIOUS_TITLE = '<script>alert("x")</script><img src=x onerror=alert(1)> Retry policy'


def fresh_database(pg_server_url: str) -> str:
    from kb_assets.store.db import connect, migrate
    from kb_assets_tests.conftest import _with_db

    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(pg_server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = _with_db(pg_server_url, name)
    with connect(url, register=False) as conn:
        migrate(conn)
    return url


def drop_database(pg_server_url: str, url: str) -> None:
    import psycopg.conninfo as ci

    name = ci.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(pg_server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def seed(conn, embedder=None):
    """A small corpus: ADRs with decisions and tags, notes, code, one document with a hostile title."""
    from kb_assets_tests.test_query_support import Corpus

    c = Corpus(conn, embedder)
    c.doc("adr/0001-celery-restart.md", [
        ("Context", "Celery workers leak memory and hang after long uptimes, so tasks pile up in the queue."),
        ("Decision", "We restart celery workers nightly with a graceful warm shutdown and SIGHUP restart."),
    ], source="decisions", kind="adr", title="Restart celery workers nightly",
        meta={"status": "Accepted", "date": "2023-05-01", "tags": ["celery", "ops"]},
        signpost={"summary": "Nightly graceful restart of celery workers to contain memory leaks.",
                  "key_decisions": [{"decision": "Restart celery workers nightly", "rationale": "memory leaks"}],
                  "artifacts": ["deploy/celery.service"], "components": ["celery"], "tags": ["celery", "ops"]})
    c.doc("adr/0002-retry-backoff.md", [
        ("Decision", "Retry embedding calls on 429 with exponential backoff and jitter, honouring Retry-After."),
    ], source="decisions", kind="adr", title=MALICIOUS_TITLE,
        meta={"status": "Accepted", "date": "2024-03-02", "tags": ["retry"]},
        signpost={"summary": "Back off on rate limits <b>bold</b> & honour Retry-After.",
                  "key_decisions": [{"decision": "Honour Retry-After", "rationale": "the provider asks for it"}],
                  "tags": ["retry"]})
    c.doc("notes/celery-runbook.md", [
        "Runbook: to restart celery workers, drain the queue, send SIGHUP, watch the worker restart logs.",
    ], source="notes", kind="doc", title="Celery restart runbook", meta={"date": "2024-06-01"})
    c.doc("app/tasks.py", [
        ("send_invoice", "@celery.task(bind=True)\ndef send_invoice(self, invoice_id):\n    retry celery task on failure"),
    ], source="code", kind="code", title="app/tasks.py",
        signpost={"purpose": "Celery tasks for invoices: sending and retrying.",
                  "key_functions": [{"name": "send_invoice", "does": "sends one invoice"}]})
    for i, topic in enumerate(["tomato seedlings need warm soil", "sourdough bread rises slowly overnight",
                               "the choir rehearses winter harmonies", "bicycle chains need oil"]):
        c.doc(f"misc/{i:02d}.md", [topic], source="notes", kind="doc", title=f"Note {i}")
    c.refresh()
    return c


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerThread:
    """uvicorn serving `app` on 127.0.0.1:<free port> in a daemon thread; stop() shuts it down gracefully."""

    def __init__(self, app):
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, access_log=False,
                                                    log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> "ServerThread":
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)


@contextlib.contextmanager
def running_server(cfg, db_url: str, embedder, **state_kw):
    from kb_assets.serving.app import build_app, open_state

    state = open_state(cfg, embedder=embedder, database_url=db_url, **state_kw)
    srv = ServerThread(build_app(state)).start()
    try:
        yield srv, state
    finally:
        srv.stop()
        state.pool.close()


def wait_until_healthy(proc, base: str, log, timeout: float = 180.0) -> None:
    """Poll `kb serve`'s /healthz until it answers 200; a server that exits or never answers fails the test with
    its stderr (`log`, a path), after killing it."""
    import httpx

    deadline = time.time() + timeout
    while True:
        try:
            if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise AssertionError("kb serve did not start:\n" + log.read_text())
        time.sleep(0.3)
