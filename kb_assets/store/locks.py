"""Advisory locks: one writing run per source at a time, and schema changes (DDL) one at a time.

A source's lock is a session-level advisory lock on a connection of its own, keyed by a stable hash of the
source key. Its holder is named by that connection's `application_name` ("kb pid=… host=… since=…"), read
back through pg_locks + pg_stat_activity: nothing to clean up after a crash (the server drops the lock with
the session). Within one process the lock is re-entrant: the `kb index` command holds it for the whole run
of a source, and each stage (a Dagster asset, in-process) takes it again for nothing; a Dagster run launched
elsewhere (UI, schedule) takes it per stage.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import logging
import os
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import psycopg

log = logging.getLogger(__name__)

DDL_LOCK_ID = 0x6B62_0004   # CREATE/DROP INDEX on a vector space, schema creation: one session at a time

_held: dict[tuple[str, str], "_Held"] = {}
_held_lock = threading.Lock()
_taking: dict[tuple[str, str], threading.Lock] = {}    # per source: one thread of this process takes it at a time


def source_lock_key(source_key: str) -> int:
    """A stable signed 64-bit key for the source (the same in every process and release)."""
    digest = hashlib.sha256(f"kb-source:{source_key}".encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def ddl_lock(conn: psycopg.Connection) -> None:
    """Serialise DDL with every other kb process: call inside the transaction that runs it."""
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (DDL_LOCK_ID,))


@dataclass
class Holder:
    backend_pid: int
    pid: int | None = None         # the kb process's pid (from its application_name)
    host: str | None = None
    since: str | None = None       # when it took the lock (UTC)
    application: str = ""

    def __str__(self) -> str:
        if self.pid is None:
            return f"another session (server pid {self.backend_pid}, {self.application or 'no application name'})"
        host = f" on {self.host}" if self.host and self.host != socket.gethostname()[:16] else ""
        return f"pid {self.pid}{host} since {self.since}"


class SourceBusy(Exception):
    """The source is being indexed by another run (raised with wait=False)."""

    def __init__(self, source_key: str, holder: Holder | None):
        self.source_key, self.holder = source_key, holder
        super().__init__(f"source {source_key!r} is being indexed by {holder or 'another run'} — "
                         "run again when it is done, or without --no-wait to queue behind it")


def _application_name() -> str:
    since = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    host = socket.gethostname()[:16]
    return f"kb pid={os.getpid()} host={host} since={since}"[:63]   # NAMEDATALEN - 1


def _parse_application(name: str) -> dict:
    fields = dict(part.split("=", 1) for part in (name or "").split() if "=" in part)
    pid = fields.get("pid")
    return {"pid": int(pid) if pid and pid.isdigit() else None, "host": fields.get("host"),
            "since": fields.get("since")}


def lock_holder(conn: psycopg.Connection, key: int) -> Holder | None:
    """Who holds the advisory lock `key` in this database (None: nobody now)."""
    row = conn.execute(
        "SELECT a.pid, coalesce(a.application_name, '') FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
        " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
        " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " AND l.classid = ((%s::bigint >> 32) & 4294967295)::oid AND l.objid = (%s::bigint & 4294967295)::oid"
        " LIMIT 1", (key, key)).fetchone()
    if row is None:
        return None
    return Holder(backend_pid=row[0], application=row[1], **_parse_application(row[1]))


class _Held:
    def __init__(self, conn: psycopg.Connection, key: int):
        self.conn, self.key, self.depth = conn, key, 0


@contextmanager
def source_lock(url: str, source_key: str, *, wait: bool = True, on_wait: Callable[[str], None] | None = None,
                check: Callable[[], None] | None = None, poll: float = 0.5,
                connect_kwargs: dict | None = None, retry_seconds: float = 0.0) -> Iterator[None]:
    """Hold the source's lock while inside. Busy: wait (telling `on_wait` once per holder), or raise
    SourceBusy when `wait` is False. `check` is called while waiting (it raises to give up, e.g. on a stop
    request). Re-entrant within the process."""
    ident = (url, source_key)
    with _held_lock:
        taking = _taking.setdefault(ident, threading.Lock())
    # one thread of this process takes the lock at a time; the others then re-enter it (two stages side by side
    # would otherwise each open a session, and the second would wait for the first's for ever)
    with taking:
        held = _enter(ident) or _take(url, source_key, wait=wait, on_wait=on_wait, check=check, poll=poll,
                                      connect_kwargs=connect_kwargs, retry_seconds=retry_seconds)
        with _held_lock:
            _held[ident] = held
    try:
        yield
    finally:
        _leave(ident, held)


def _enter(ident: tuple[str, str]) -> "_Held | None":
    with _held_lock:
        held = _held.get(ident)
        if held is not None and not held.conn.closed and not held.conn.broken:
            held.depth += 1
            return held
    return None


def _take(url: str, source_key: str, *, wait: bool, on_wait, check, poll: float, connect_kwargs: dict | None,
          retry_seconds: float) -> "_Held":
    key = source_lock_key(source_key)
    from kb_assets.store.retry import retry_call

    # a database restarting between two sources is waited for like the stages wait for it
    def open_session() -> psycopg.Connection:
        return psycopg.connect(url, autocommit=True, application_name=f"kb pid={os.getpid()} waiting",
                               **(connect_kwargs or {}))

    # 0: the caller retries (a stage's attempt); the raw error propagates
    conn = retry_call(open_session, url=url, budget=retry_seconds) if retry_seconds else open_session()
    try:
        told = None
        while not conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0]:
            holder = lock_holder(conn, key)
            if not wait:
                raise SourceBusy(source_key, holder)
            if on_wait is not None and str(holder) != told:
                told = str(holder)
                on_wait(f"waiting for source {source_key!r}: held by {holder or 'another run'}")
            if check is not None:
                check()
            time.sleep(poll)
        # named from now: `since` is when the lock was taken, not when the wait began
        conn.execute("SELECT set_config('application_name', %s, false)", (_application_name(),))
    except BaseException:
        conn.close()
        raise
    held = _Held(conn, key)
    held.depth = 1
    return held


def _leave(ident: tuple[str, str], held: "_Held") -> None:
    """One holder less; the last one out (in any thread: two stages side by side may end in either order)
    releases the lock and closes its session."""
    with _held_lock:
        held.depth -= 1
        if held.depth > 0:
            return
        if _held.get(ident) is held:
            del _held[ident]
    conn = held.conn
    try:
        if not conn.closed and not conn.broken:
            try:
                conn.execute("SELECT pg_advisory_unlock(%s)", (held.key,))
            except psycopg.Error:
                pass    # the session ends below: the server drops its locks with it
    finally:
        conn.close()


def held_sources() -> list[str]:
    with _held_lock:
        return [k for _, k in _held]
