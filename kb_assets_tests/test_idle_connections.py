"""Stages hand their connection on to the next stage of the process (store/idle_connections.py, through
guard.run_stage) only when it is sound: a stage that failed or left a transaction open closes its own, a backend
terminated in between is replaced without a retry, a forked child never touches its parent's sockets. Real
embedded PostgreSQL."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import psycopg
import pytest

from kb_assets.config import parse_config
from kb_assets.pipeline import guard
from kb_assets.store import idle_connections


@pytest.fixture
def cfg(tmp_path: Path, db_url):
    idle_connections.close_kept()
    yield parse_config({"database_url": db_url, "sources": [
        {"key": "docs", "kind": "doc", "root": str(tmp_path), "include": ["*.md"]}]},
        path=str(tmp_path / "kb.yaml"), base_dir=str(tmp_path))
    idle_connections.close_kept()


def _backend(cfg, **kw) -> int:
    return guard.run_stage(cfg, None, lambda conn: conn.execute("SELECT pg_backend_pid()").fetchone()[0],
                           lock=False, **kw)


def test_one_connection_serves_the_stages_one_after_another(cfg):
    first = _backend(cfg)
    assert [_backend(cfg) for _ in range(5)] == [first] * 5
    assert idle_connections.kept_count() == 1
    # with the source's lock too (its own connection: the lock is not the stage's)
    assert guard.run_stage(cfg, "docs", lambda conn: conn.execute("SELECT pg_backend_pid()").fetchone()[0]) == first


def test_a_failed_stage_closes_its_connection_the_next_opens_a_fresh_one(cfg):
    first = _backend(cfg)

    def fails(conn):
        conn.execute("SELECT 1")
        raise ValueError("a stage's own error")

    with pytest.raises(ValueError):
        guard.run_stage(cfg, None, fails, lock=False)
    assert idle_connections.kept_count() == 0
    assert _backend(cfg) != first


def test_a_transaction_left_open_is_not_handed_on(cfg):
    first = _backend(cfg)

    def leaves_open(conn):
        conn.autocommit = False
        conn.execute("CREATE TEMP TABLE left_behind (x int)")      # uncommitted: the next stage must not see it
        return conn.info.transaction_status

    assert guard.run_stage(cfg, None, leaves_open, lock=False) != psycopg.pq.TransactionStatus.IDLE
    assert idle_connections.kept_count() == 0
    assert guard.run_stage(cfg, None, lambda conn: conn.execute(
        "SELECT to_regclass('pg_temp.left_behind') IS NULL, pg_backend_pid()").fetchone()) == (True, _backend(cfg))
    assert _backend(cfg) != first


def test_a_backend_terminated_between_stages_is_replaced_without_a_retry(cfg, db_url, caplog):
    first = _backend(cfg)
    with psycopg.connect(db_url, autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (first,)).fetchone()[0]
        admin.execute("SELECT pg_sleep(0.2)")       # the backend has gone
    with caplog.at_level(logging.DEBUG, logger="kb_assets"):
        second = _backend(cfg)
    assert second != first
    assert not [r for r in caplog.records if "retrying" in r.getMessage()]     # no database error reached a stage
    assert _backend(cfg) == second


def test_a_forked_child_neither_uses_nor_closes_its_parents_connections(cfg):
    first = _backend(cfg)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:                                     # the child: a stage of its own, on a connection of its own
        try:
            kept = idle_connections.kept_count()
            mine = _backend(cfg)
            os.write(write, f"{kept} {int(mine != first)}".encode())
        finally:
            os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    answer = os.read(read, 100).decode()
    os.close(read)
    assert os.waitstatus_to_exitcode(status) == 0
    assert answer == "0 1"
    assert _backend(cfg) == first                    # the parent's connection still answers


def test_release_embedded_closes_the_kept_connections(cfg):
    from kb_assets.store.db import release_embedded

    _backend(cfg)
    assert idle_connections.kept_count() == 1
    release_embedded(Path("/nonexistent-kb-data"))   # no server of ours there: only the kept connections go
    assert idle_connections.kept_count() == 0
