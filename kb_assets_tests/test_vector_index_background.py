"""A large HNSW build runs in the background after activation: the answer does not wait for it, queries are
exact meanwhile, a killed build leaves nothing half-made that a later run does not finish, and the embedded
server outlives the `kb index` that started the build. Real embedded PostgreSQL, real builder processes."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from kb_assets.pipeline import build_search_index, vector_index_build
from kb_assets.store import spaces
from kb_assets.store.db import connect
from kb_assets_tests.test_noop_index import write_adrs
from kb_assets_tests.test_pipeline import CountingEmbedder, _cfg, _index, repo  # noqa: F401 (fixture)

QUESTION = "retry delay after each failure"


@pytest.fixture
def background_from_one_row(monkeypatch):
    monkeypatch.setenv("KB_VECTOR_INDEX_BACKGROUND_ROWS", "1")


def _builders() -> list[psutil.Process]:
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "kb_assets.pipeline.vector_index_build" in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:     # exited (a zombie is reaped by the starter's thread)
            pass
    return found


def _wait(pred, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _indexed_without_vector_index(repo, db_url, conn):
    cfg = _cfg(repo, db_url)
    emb = CountingEmbedder()
    _index(cfg, conn, emb)                       # the library path builds in the run
    table = spaces.active_space(conn)[2]
    assert spaces.has_vector_index(conn, table)
    assert spaces.drop_vector_index(conn, table)   # as a large load leaves the space in use
    return emb, table


@contextlib.contextmanager
def _build_caught_midway(db_url, conn, emb, table):
    """A background build started and held in the middle: a writer's open transaction on the table (row-exclusive
    lock) lets CREATE INDEX CONCURRENTLY create its INVALID index, then makes it wait. Yields the writer."""
    with connect(db_url, autocommit=False) as writer:
        writer.execute(f'DELETE FROM "{table}" WHERE false')
        assert build_search_index(conn, emb.model, emb.dimension, index_changed=False).vector_index_background
        _wait(lambda: spaces.vector_index_exists(conn, table), what="the concurrent build's index entry")
        yield writer


def _recall(conn, emb):
    from kb_assets.query import recall

    return recall(QUESTION, conn=conn, embedder=emb, mode="vector")


def test_the_answer_comes_before_the_build_and_is_exact_meanwhile(repo, db_url, conn, background_from_one_row):
    from kb_assets.query import recall

    emb, table = _indexed_without_vector_index(repo, db_url, conn)
    exact = recall(QUESTION, conn=conn, embedder=emb, mode="vector")
    # a writer's open transaction on the table: CREATE INDEX CONCURRENTLY creates its (INVALID) index, then
    # waits for it, so the build is caught in the middle
    with connect(db_url, autocommit=False) as writer:
        writer.execute(f'DELETE FROM "{table}" WHERE false')   # takes the table's row-exclusive lock
        t0 = time.perf_counter()
        stats = build_search_index(conn, emb.model, emb.dimension, index_changed=False)
        assert stats.vector_index_background and not stats.vector_index_built
        assert time.perf_counter() - t0 < 20
        assert spaces.vector_index_state(conn, table) == "building"
        _wait(lambda: spaces.vector_index_exists(conn, table), what="the concurrent build's index entry")
        assert not spaces.has_vector_index(conn, table)           # INVALID: the planner does not use it
        meanwhile = recall(QUESTION, conn=conn, embedder=emb, mode="vector")
        assert any("vector index" in w for w in meanwhile.warnings), meanwhile.warnings
        assert [d.id for d in meanwhile.documents] == [d.id for d in exact.documents]
        # a second run does not start a second build, nor wait for this one
        again = build_search_index(conn, emb.model, emb.dimension, index_changed=False)
        assert again.vector_index_background and len(_builders()) == 1
        writer.rollback()
    assert vector_index_build.wait_ready(conn, table, timeout=60) == "ready"
    assert spaces.has_vector_index(conn, table)
    after = recall(QUESTION, conn=conn, embedder=emb, mode="vector")
    assert not any("vector index" in w for w in after.warnings)
    assert [d.id for d in after.documents] == [d.id for d in exact.documents]
    _wait(lambda: not _builders(), what="the builder to exit")
    log = vector_index_build.log_path(vector_index_build._embedded_pgdata(conn)).read_text()
    assert f"{table}: vector index built" in log


def test_a_first_load_returns_without_waiting_for_the_build(repo, db_url, conn, background_from_one_row):
    """A first load activates the space, refreshes recall()'s statistics (whose first run adds triggers to the
    vector table) and only then starts the concurrent build: DDL behind a running build would wait for all of
    it. A transaction holding an old snapshot stalls the build at its end (it waits for older snapshots while
    holding the table's lock), so a stage that waited for it would not return here."""
    from kb_assets.pipeline import chunk_source, run_embeddings_stage, sync_documents

    cfg = _cfg(repo, db_url)
    emb = CountingEmbedder()
    sync_documents(conn, cfg, cfg.source("docs"))
    chunk_source(conn, "docs", max_tokens=emb.max_tokens, count_tokens=emb.count_tokens)
    run_embeddings_stage(conn, emb, "docs")
    with connect(db_url, autocommit=False) as old_snapshot:
        old_snapshot.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        old_snapshot.execute("SELECT count(*) FROM documents")
        conn.execute("SET lock_timeout = '20s'")     # a stage waiting behind the build fails, not hangs
        t0 = time.perf_counter()
        stats = build_search_index(conn, emb.model, emb.dimension)
        assert time.perf_counter() - t0 < 20
        conn.execute("RESET lock_timeout")
        assert stats.activated and stats.query_stats_refreshed and stats.vector_index_background
        table = spaces.active_space(conn)[2]
        assert spaces.vector_index_state(conn, table) == "building"
        assert _recall(conn, emb).documents
        old_snapshot.rollback()
    assert vector_index_build.wait_ready(conn, table, timeout=60) == "ready"


def test_a_killed_build_leaves_no_half_index_and_the_next_run_finishes_it(repo, db_url, conn,
                                                                          background_from_one_row):
    emb, table = _indexed_without_vector_index(repo, db_url, conn)
    with _build_caught_midway(db_url, conn, emb, table) as writer:
        (builder,) = _builders()
        os.kill(builder.pid, signal.SIGKILL)
        # its backend sees the client gone (client_connection_check_interval) and lets go of the build lock
        _wait(lambda: spaces.build_holder(conn, table) is None, what="the killed build's backend to stop")
        writer.rollback()
    assert spaces.vector_index_exists(conn, table) and not spaces.has_vector_index(conn, table)   # INVALID left
    assert spaces.vector_index_state(conn, table) == "missing"
    # what every `kb index` does at its end: start the build again; the builder drops the leftover first
    assert vector_index_build.resume(conn) in ("building", "ready")
    assert vector_index_build.wait_ready(conn, table, timeout=60) == "ready"
    assert spaces.has_vector_index(conn, table)


def _autogroup_nice(pid: int) -> int | None:
    """The nice of `pid`'s scheduling autogroup ("/autogroup-1234 nice 19"); None where the kernel does not group
    it by session: no such file, or an empty one (what CI's machine shows: the kernel reports no session group for
    the task, so there is no group nice to set or read)."""
    try:
        words = Path(f"/proc/{pid}/autogroup").read_text().split()
    except OSError:
        return None
    return int(words[-1]) if words else None


def test_the_build_yields_the_cpu_to_other_sessions(repo, db_url, conn, background_from_one_row):
    """Nice 19 ranks a process only inside its session's scheduling group when the kernel groups by session
    (sched_autogroup), and every PostgreSQL backend is a session of its own: the build's backend gets its group
    niced too, and nothing else does — neither the backends that answer queries nor this process. Where the kernel
    reports no session group for a task (CI's machine) only the plain nice is there to check."""
    emb, table = _indexed_without_vector_index(repo, db_url, conn)
    mine = _autogroup_nice(os.getpid())
    with _build_caught_midway(db_url, conn, emb, table) as writer:
        backend = spaces.build_holder(conn, table)
        assert backend is not None
        assert os.getpriority(os.PRIO_PROCESS, backend) == 19
        query_backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        assert os.getpriority(os.PRIO_PROCESS, query_backend) == 0
        if mine is not None:
            assert _autogroup_nice(backend) == 19
            assert _autogroup_nice(query_backend) == 0
            assert _autogroup_nice(os.getpid()) == mine
        # only a PostgreSQL process is touched: a containerised server's pids may name anyone's process here
        assert vector_index_build._postgres_process_here(backend)
        other = subprocess.Popen(["sleep", "30"])
        try:
            assert not vector_index_build._postgres_process_here(other.pid)
        finally:
            other.kill()
            other.wait()
        writer.rollback()
    assert vector_index_build.wait_ready(conn, table, timeout=60) == "ready"


def test_a_large_load_cancels_a_running_build_instead_of_inserting_through_it(repo, db_url, conn,
                                                                             background_from_one_row):
    emb, table = _indexed_without_vector_index(repo, db_url, conn)
    with _build_caught_midway(db_url, conn, emb, table) as writer:
        writer.rollback()   # (drop_vector_index waits for the cancelled build to let go, not for this one)
        assert spaces.drop_vector_index(conn, table)
    assert spaces.build_holder(conn, table) is None and not spaces.vector_index_exists(conn, table)
    # the stage in the run (ensure_vector_index) builds it when asked to, with nothing left over in its way
    assert build_search_index(conn, emb.model, emb.dimension, index_changed=False, background=False) \
        .vector_index_built
    assert spaces.has_vector_index(conn, table)


def test_kb_index_returns_before_the_build_and_the_embedded_server_outlives_it(tmp_path):
    """The whole process on the embedded database: `kb index` exits while the build runs (its builder holds its
    own server handle), the build finishes, and the next `kb index --wait-index` reports the index ready."""
    docs = write_adrs(tmp_path / "docs")
    cfg = tmp_path / "kb.yaml"
    data = Path("/tmp") / f"kbvi-{os.getpid()}"    # a short path: the server's unix socket lives there
    cfg.write_text(json.dumps({"data_dir": str(data), "sources": [{"key": "adrs", "kind": "adr",
                                                                  "root": str(docs), "include": ["*.md"]}]}))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "KB_VECTOR_INDEX_BACKGROUND_ROWS": "1"}
    env.pop("KB_CONFIG", None)
    env.pop("KB_DATABASE_URL", None)
    kb = [sys.executable, "-m", "kb_assets.cli"] if not Path(sys.executable).with_name("kb").exists() \
        else [str(Path(sys.executable).with_name("kb"))]
    try:
        first = subprocess.run(kb + ["index", "--config", str(cfg), "--json"], capture_output=True, text=True,
                               env=env, timeout=900)
        assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
        out = json.loads(first.stdout)
        assert out["vector_index"] in ("building", "ready")
        assert out["sources"][0]["this_run"]["search_index"]["vector_index_background"] is True
        log = data / "logs" / "vector_index.log"
        _wait(lambda: log.exists() and "vector index built" in log.read_text(), timeout=120,
              what="the background build to finish after kb index exited")
        status = subprocess.run(kb + ["status", "--config", str(cfg), "--json"], capture_output=True, text=True,
                                env=env, timeout=300)
        assert status.returncode == 0, status.stderr[-2000:]
        row = json.loads(status.stdout)["sources"][0]
        assert row["vector_index"] is True and row["vector_index_state"] == "ready"
        again = subprocess.run(kb + ["index", "--config", str(cfg), "--json", "--wait-index"], capture_output=True,
                               text=True, env=env, timeout=900)
        assert again.returncode == 0 and json.loads(again.stdout)["vector_index"] == "ready"
    finally:
        import shutil

        # the last handle (the builder's, or the status command's) stops the server; make sure of it
        pid_file = data / "pg" / "postmaster.pid"
        try:
            _wait(lambda: not pid_file.exists(), timeout=30, what="the embedded server to stop")
        except AssertionError:
            os.kill(int(pid_file.read_text().split()[0]), signal.SIGQUIT)
        shutil.rmtree(data, ignore_errors=True)
