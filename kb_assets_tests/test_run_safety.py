"""Runs serialised per source, DDL serialised, stop requests honoured between batches, the database going
away retried within a bound, stale embedded-server handles cleaned (issue 12 §3-§5). Real PostgreSQL."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psycopg
import pytest

from kb_assets.embedding import FixedCostEmbedder
from kb_assets.pipeline import cancel
from kb_assets.store import locks, retry, spaces
from kb_assets.store.db import connect


# ---------------------------------------------------------------- source locks
def test_second_holder_is_refused_with_the_holders_pid_and_start(db_url):
    with locks.source_lock(db_url, "docs"):
        # in-process: re-entrant (the CLI holds it for the run, each stage takes it again)
        with locks.source_lock(db_url, "docs"):
            pass
        other = subprocess.run(
            [sys.executable, "-c", "import sys; from kb_assets.store import locks\n"
             "try:\n  locks.source_lock(sys.argv[1], 'docs', wait=False).__enter__()\n"
             "except locks.SourceBusy as e:\n  print(e); sys.exit(3)", db_url],
            capture_output=True, text=True, timeout=120)
        assert other.returncode == 3, other.stderr
        assert f"pid {os.getpid()}" in other.stdout and "since 20" in other.stdout
        # another source is not blocked
        free = subprocess.run(
            [sys.executable, "-c", "import sys; from kb_assets.store import locks\n"
             "with locks.source_lock(sys.argv[1], 'code', wait=False): print('ok')", db_url],
            capture_output=True, text=True, timeout=120)
        assert free.stdout.strip() == "ok", free.stderr


def test_a_waiting_run_says_whom_it_waits_for_and_gets_the_lock_when_released(db_url):
    said: list[str] = []
    got = threading.Event()
    holder = psycopg.connect(db_url, autocommit=True, application_name="kb pid=4242 host=elsewhere "
                                                                      "since=2026-12-01T10:00:00Z")
    holder.execute("SELECT pg_advisory_lock(%s)", (locks.source_lock_key("docs"),))

    def waiter():
        with locks.source_lock(db_url, "docs", on_wait=said.append, poll=0.05):
            got.set()

    t = threading.Thread(target=waiter)
    t.start()
    for _ in range(200):
        if said:
            break
        time.sleep(0.05)
    assert not got.is_set()
    assert said == ["waiting for source 'docs': held by pid 4242 on elsewhere since 2026-12-01T10:00:00Z"]
    holder.close()      # the holder's session ends (as on a crash): the lock goes with it
    t.join(timeout=30)
    assert got.is_set()


def test_a_stop_request_ends_the_wait(db_url):
    holder = psycopg.connect(db_url, autocommit=True)
    holder.execute("SELECT pg_advisory_lock(%s)", (locks.source_lock_key("docs"),))
    cancel.reset()
    try:
        threading.Timer(0.3, cancel.request_stop, args=("SIGTERM received",)).start()
        with pytest.raises(cancel.Cancelled):
            with locks.source_lock(db_url, "docs", check=cancel.check, poll=0.05):
                pass
    finally:
        cancel.reset()
        holder.close()


def test_vector_index_built_by_two_sessions_at_once_is_built_once(db_url):
    with connect(db_url) as conn:     # kb's schema, where db_url's migrations put the tables
        table = spaces.ensure_space(conn, "m", 3)
        conn.execute(f'INSERT INTO "{table}" SELECT g::text, \'[1,2,3]\' FROM generate_series(1, 2000) g')
    errors, built = [], []
    barrier = threading.Barrier(3)

    def build():
        try:
            with connect(db_url) as c:
                barrier.wait()
                built.append(spaces.ensure_vector_index(c, table))
        except Exception as exc:  # the UniqueViolation seen with a server database
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and sorted(built) == [False, False, True], built


# ---------------------------------------------------------------- stop requests
class _StopAfter(FixedCostEmbedder):
    """The stand-in; requests a stop while its Nth call runs (as a signal would)."""

    def __init__(self, stop_at_call: int):
        super().__init__(0.0)
        self.calls, self.stop_at_call = 0, stop_at_call

    def embed_documents(self, texts, token_counts=None):
        self.calls += 1
        if self.calls == self.stop_at_call:
            cancel.request_stop("SIGTERM received")
            time.sleep(0.3)
        return super().embed_documents(texts, token_counts)


def _chunks(conn, n: int) -> None:
    conn.execute("INSERT INTO sources (key, kind, root) VALUES ('s', 'doc', '/x')")
    doc = conn.execute("INSERT INTO documents (source_key, path, kind, status, content_hash, chunked_hash, text)"
                       " VALUES ('s', 'a.md', 'doc', 'active', 'h', 'h', 't') RETURNING id").fetchone()[0]
    for i in range(n):
        conn.execute("INSERT INTO chunks (document_id, ordinal, start_line, end_line, token_count, chunk_hash, text)"
                     " VALUES (%s, %s, 1, 1, 5, %s, %s)", (doc, i, f"hash{i:04d}", f"text number {i}"))


def test_a_stop_abandons_the_call_in_flight_and_a_rerun_embeds_only_the_rest(conn):
    from kb_assets.pipeline.embeddings import count_missing, embed_source

    _chunks(conn, 100)
    cancel.reset()
    stopping = _StopAfter(stop_at_call=3)
    try:
        with pytest.raises(cancel.Cancelled):
            embed_source(conn, stopping, source_key="s", batch_rows=10)
    finally:
        cancel.reset()
    table = spaces.space_table(conn, stopping.model, stopping.dimension)
    written = 100 - count_missing(conn, table)
    # calls 1-2 (half a batch each) written; call 3 was in flight when the stop came: abandoned
    assert written == 10
    again = FixedCostEmbedder(0.0)
    stats = embed_source(conn, again, source_key="s", batch_rows=10)
    assert stats.missing_after == 0 and again.texts_embedded == 90
    # work paid twice: the abandoned call only (half a batch)
    assert stopping.texts_embedded + again.texts_embedded - 100 <= 5


class _DropsConnection(FixedCostEmbedder):
    """Its first call terminates the stage's database session (what a server restart does to it) and returns
    only once the session is gone, so that the write of that batch meets a dead connection."""

    def __init__(self, admin_url: str):
        super().__init__(0.0)
        self.admin_url, self.victim_pid, self.calls = admin_url, None, 0

    def embed_documents(self, texts, token_counts=None):
        self.calls += 1
        if self.calls == 1:
            with connect(self.admin_url) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (self.victim_pid,))
                while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s",
                                    (self.victim_pid,)).fetchone():
                    time.sleep(0.05)
        return super().embed_documents(texts, token_counts)


def test_vectors_computed_before_a_lost_connection_are_not_computed_again(db_url):
    """Issue 12: a database restart during embedding redid two batches (the one being written and the call in
    flight). The stage is re-run on a fresh connection (guard.run_stage); the vectors computed for the batches
    that were not committed are reused, so no text is sent to the model twice."""
    from kb_assets.pipeline.embeddings import count_missing, embed_source

    with connect(db_url) as setup:
        _chunks(setup, 60)
    victim = connect(db_url)
    dropping = _DropsConnection(db_url)
    dropping.victim_pid = victim.info.backend_pid
    try:
        with pytest.raises((psycopg.OperationalError, psycopg.InterfaceError)) as err:
            embed_source(victim, dropping, source_key="s", batch_rows=10)
        assert retry.is_transient(err.value)      # what guard.run_stage re-runs the stage on
    finally:
        victim.close()
    # batch 1's call killed the session; batch 2's call was in flight when batch 1's write failed (or, if the
    # read of batch 2 came after the kill, batch 1's call was the one in flight)
    assert dropping.texts_embedded in (10, 20)
    with connect(db_url) as fresh:
        again = FixedCostEmbedder(0.0)
        stats = embed_source(fresh, again, source_key="s", batch_rows=10)
        table = spaces.space_table(fresh, again.model, again.dimension)
        assert stats.missing_after == 0 == count_missing(fresh, table)
        assert again.texts_embedded == 60 - dropping.texts_embedded   # only what was never computed
        assert stats.chunks_embedded == 60                # the carried vectors were written by this attempt
        # the carried vectors are the model's, not placeholders
        got = fresh.execute(f'SELECT embedding FROM "{table}" WHERE chunk_hash = %s', ("hash0003",)).fetchone()[0]
        assert abs(float(np.dot(got.to_numpy(), again.vector("text number 3"))) - 1.0) < 1e-5


class _SeesCommitted(FixedCostEmbedder):
    """Records, at the start of each model call, how many vectors another session sees committed."""

    def __init__(self, other: psycopg.Connection):
        super().__init__(0.0)
        self.other, self.table, self.committed_at_call = other, None, []

    def embed_documents(self, texts, token_counts=None):
        self.committed_at_call.append(
            self.other.execute(f'SELECT count(*) FROM "{self.table}"').fetchone()[0])
        return super().embed_documents(texts, token_counts)


def test_model_work_not_yet_committed_never_exceeds_one_batch(db_url, monkeypatch):
    """Issue 12: kill -9 at any instant redoes at most one batch (`batch_rows` texts). The model is called on half a
    batch at a time and the write of one half overlaps the call on the next (the model never waits for the
    database), so when a call starts, every part but the one before it is committed: what a kill can lose is
    that part and the call in flight, one batch. (Whole batches overlapped that way lost two.)"""
    from kb_assets.pipeline import embeddings as emb_mod

    real_write = emb_mod._write_batch

    def slow_write(*args, **kwargs):
        time.sleep(0.2)         # the next call starts while this write runs: it sees this part uncommitted
        return real_write(*args, **kwargs)

    monkeypatch.setattr(emb_mod, "_write_batch", slow_write)
    with connect(db_url) as setup:
        _chunks(setup, 50)
    with connect(db_url, autocommit=True) as other, connect(db_url) as conn:
        embedder = _SeesCommitted(other)
        embedder.table = spaces.ensure_space(conn, embedder.model, embedder.dimension)
        conn.commit()
        stats = emb_mod.embed_source(conn, embedder, source_key="s", batch_rows=10)
    assert stats.chunks_embedded == 50 and stats.batches == 10
    # at the start of call k: 5 * k texts sent before, 5 now; at most 10 of them uncommitted
    uncommitted = [5 * k + 5 - committed for k, committed in enumerate(embedder.committed_at_call)]
    assert max(uncommitted) == 10, uncommitted      # the write overlapped the next call ...
    assert embedder.committed_at_call[2:] == [5 * (k - 1) for k in range(2, 10)]   # ... and never more


# ---------------------------------------------------------------- database loss
def test_transient_and_configuration_errors_are_told_apart():
    assert retry.is_transient(psycopg.OperationalError("connection refused"))
    assert retry.is_transient(psycopg.errors.AdminShutdown("terminating connection due to administrator command"))
    assert retry.is_transient(psycopg.errors.CannotConnectNow("the database system is starting up"))
    assert not retry.is_transient(psycopg.OperationalError('password authentication failed for user "kb"'))
    assert not retry.is_transient(psycopg.OperationalError('database "x" does not exist'))
    assert not retry.is_transient(psycopg.errors.QueryCanceled("canceling statement due to user request"))
    assert not retry.is_transient(ValueError("x"))


def test_a_database_that_comes_back_within_the_budget_is_waited_for():
    attempts = []

    def flaky():
        attempts.append(1)
        if len(attempts) < 3:
            raise psycopg.errors.CannotConnectNow("the database system is starting up")
        return "answer"

    assert retry.retry_call(flaky, url="postgresql://kb:pw@db/kb", budget=30) == "answer"
    assert len(attempts) == 3


def test_a_database_that_stays_away_is_one_line_without_the_password():
    def down():
        raise psycopg.OperationalError("connection to server at \"db\" failed: Connection refused\n\tIs it running?")

    with pytest.raises(retry.DatabaseUnreachable) as err:
        retry.retry_call(down, url="postgresql://kb:pw@db:5432/kb", budget=0.6, origin="database_url in kb.yaml")
    text = str(err.value)
    assert "\n" not in text and ":pw@" not in text
    assert text.startswith("the database at postgresql://kb@db:5432/kb (database_url in kb.yaml) is unreachable: "
                           "connection to server at \"db\" failed: Connection refused")


def test_a_stage_interrupted_by_a_lost_connection_is_run_again_on_a_fresh_one(db_url, tmp_path):
    from kb_assets.config import parse_config
    from kb_assets.pipeline import guard

    cfg = parse_config({"database_url": db_url, "database_retry_seconds": 20, "sources": []},
                       path=str(tmp_path / "kb.yaml"), base_dir=str(tmp_path))
    seen = []

    def stage(conn):
        seen.append(conn.info.backend_pid)
        if len(seen) == 1:   # the server drops this session mid-stage (a restart, a failover)
            with psycopg.connect(db_url, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
            conn.execute("SELECT 1")
        return conn.execute("SELECT 42").fetchone()[0]

    assert guard.run_stage(cfg, "docs", stage) == 42
    assert len(seen) == 2 and seen[0] != seen[1]


# ---------------------------------------------------------------- embedded server handles
def test_dead_pids_are_pruned_from_the_handle_file(tmp_path):
    from kb_assets.store.db import HANDLE_FILE, prune_stale_handles

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    pgdata = tmp_path / "pg"
    pgdata.mkdir()
    (pgdata / HANDLE_FILE).write_text(json.dumps([dead.pid, os.getpid()]))
    assert prune_stale_handles(pgdata) == [dead.pid]
    assert json.loads((pgdata / HANDLE_FILE).read_text()) == [os.getpid()]


def test_a_killed_holder_does_not_keep_the_embedded_server_running(tmp_path):
    """kill -9 of the only holder used to leave its pid in the handle file, and the server ran forever: the
    next process drops the dead pid and, when it lets go, stops the server."""
    import psutil

    data = Path(tempfile_dir := str(tmp_path))
    start = ("import sys, time; from pathlib import Path; from kb_assets.store.db import embedded_url\n"
             "embedded_url(Path(sys.argv[1])); print('up', flush=True); time.sleep(600)")
    holder = subprocess.Popen([sys.executable, "-c", start, tempfile_dir], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "up"
    holder.kill()
    holder.wait()
    pid_file = data / "pg" / "postmaster.pid"
    postmaster = int(pid_file.read_text().splitlines()[0])
    assert psutil.pid_exists(postmaster)
    assert json.loads((data / "pg" / ".handle_pids.json").read_text()) == [holder.pid]
    again = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path;"
                            " from kb_assets.store.db import embedded_url; embedded_url(Path(sys.argv[1]))",
                            tempfile_dir], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    for _ in range(100):
        if not psutil.pid_exists(postmaster):
            break
        time.sleep(0.1)
    assert not psutil.pid_exists(postmaster)
    assert json.loads((data / "pg" / ".handle_pids.json").read_text()) == []
