"""Connections one stage of a process hands on to the next (guard.run_stage), instead of each opening its own.

Why: a small `kb index` runs some twenty stages and checks, each on a connection of its own, and opening one
(start-up of a backend, authentication, the search path, the vector type) took ~1.7 ms of a delete pass of
~0.45 s (docs/BENCHMARKS.md, "Small passes: connections handed on").

What makes a connection fit to be handed on: it is open, not broken, in autocommit, with no transaction left
open; the stages' own session settings (`SET synchronous_commit`) are set back by the stage that sets them.
Before a kept connection is used again one empty statement checks it: a restarted server or a terminated
backend shows there, not half-way into a stage, and then every kept connection to that server is dropped (they
went with it). A stage that fails closes its connection as before, so its re-run (guard.run_stage) opens a
fresh one. A forked child never uses (nor closes) its parent's connections; kept connections are closed when
the process exits, and before this process stops an embedded server.

Not psycopg_pool (which `kb serve` uses): a pool opens connections its own way (these are store.db.connect's:
search path, vector type), runs worker threads, and makes a stage wait at its size limit; here a stage that
finds none kept simply opens one, as before.
"""
from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg.pq import TransactionStatus

MAX_KEPT = 4                # per database URL: stages run at most three at a time (a small pass's two lines + checks)

_kept: dict[str, list[psycopg.Connection]] = {}
_lock = threading.Lock()
_inherited: list[psycopg.Connection] = []      # a forked child's copies of its parent's sockets: never touched


@contextmanager
def stage_connection(url: str) -> Iterator[psycopg.Connection]:
    """A connection to `url` (store.db.connect's kind) for one stage: a kept one if it still answers, else a new
    one. Kept again afterwards if the stage ended cleanly and left no transaction open; closed otherwise."""
    from kb_assets.store.db import connect

    conn = _take(url) or connect(url)
    reusable = False
    try:
        yield conn
        reusable = _fit(conn)
    finally:
        if reusable:
            _keep(url, conn)
        else:
            conn.close()


def _fit(conn: psycopg.Connection) -> bool:
    return (not conn.closed and not conn.broken and conn.autocommit
            and conn.info.transaction_status == TransactionStatus.IDLE)


def _take(url: str) -> psycopg.Connection | None:
    with _lock:
        kept = _kept.get(url)
        conn = kept.pop() if kept else None
    if conn is None:
        return None
    try:
        conn.execute("")        # one round trip (~0.05 ms here): the server and this backend are still there
    except psycopg.Error:
        conn.close()
        close_kept(url)         # the server went away: so did every other kept connection to it
        return None
    if _fit(conn):
        return conn
    conn.close()
    return None


def _keep(url: str, conn: psycopg.Connection) -> None:
    with _lock:
        kept = _kept.setdefault(url, [])
        if len(kept) < MAX_KEPT:
            kept.append(conn)
            return
    conn.close()


def close_kept(url: str | None = None) -> None:
    """Close the kept connections (to `url`, or all)."""
    with _lock:
        urls = [url] if url is not None else list(_kept)
        conns = [c for u in urls for c in _kept.pop(u, [])]
    for conn in conns:
        try:
            conn.close()
        except Exception:       # closing a dead socket: nothing left to do
            pass


def kept_count() -> int:
    with _lock:
        return sum(len(v) for v in _kept.values())


def _after_fork_in_child() -> None:
    global _lock
    # the parent's sockets: closing them here would end the parent's sessions (libpq sends Terminate)
    _inherited.extend(c for v in _kept.values() for c in v)
    _kept.clear()
    _lock = threading.Lock()        # another thread of the parent may have held it at the fork


atexit.register(close_kept)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
