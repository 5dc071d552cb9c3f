"""Connections, the embedded PostgreSQL, and versioned migrations."""
from __future__ import annotations

import logging
import os
import threading
from importlib import resources
from pathlib import Path

import psycopg
from pgvector.psycopg import register_vector

log = logging.getLogger(__name__)

MIGRATION_LOCK_ID = 0x6B62_0001  # pg_advisory_xact_lock key: two processes never migrate at once

_servers: dict[str, object] = {}   # pgserver handles kept alive for the life of the process
_servers_lock = threading.Lock()


class DatabaseError(Exception):
    """The database could not be reached or prepared: str() says what to do."""


def embedded_url(data_dir: Path) -> str:
    """Start (or join) the embedded PostgreSQL under data_dir/pg and return its URL.

    pgserver refcounts handles per data folder across processes and stops the server when the last one
    exits, so this process keeps its handle until it ends.
    """
    pgdata = (data_dir / "pg").resolve()
    key = str(pgdata)
    with _servers_lock:
        server = _servers.get(key)
        if server is None:
            pgdata.parent.mkdir(parents=True, exist_ok=True)
            from kb_assets.store import linger

            # a short query command leaves the server to a linger process (store/linger.py) instead of
            # stopping it at exit: the next call joins it rather than paying start + stop again
            linger_s = linger.active_seconds()
            if linger_s and linger.touch(pgdata) is not None:
                url = linger.running_url(pgdata)
                if url:
                    return url
            import pgserver  # heavy import: only when the embedded server is used

            _prune_dead_handles(pgserver, pgdata)
            try:
                server = pgserver.get_server(pgdata, cleanup_mode=None if linger_s else "stop")
            except Exception as exc:  # pgserver raises plain exceptions with the postgres log
                raise DatabaseError(f"could not start the embedded PostgreSQL in {pgdata}: {exc}") from exc
            _servers[key] = server
            if linger_s:
                linger.ensure_linger(pgdata, linger_s)
        return server.get_uri()  # type: ignore[attr-defined]


def _prune_dead_handles(pgserver, pgdata: Path) -> None:
    """Drop the pids of dead processes from pgserver's handle list. A process killed without running its
    atexit handlers (SIGKILL, OOM, a client's kill escalation) stays listed forever otherwise, and the
    server is then never stopped by anyone."""
    import json

    handles = pgdata / ".handle_pids.json"
    if not handles.exists():
        return
    with pgserver.PostgresServer._lock:     # the lock pgserver itself takes around the list
        try:
            pids = json.loads(handles.read_text())
        except (OSError, ValueError):
            return
        import psutil   # a pgserver dependency

        alive = []
        for pid in pids if isinstance(pids, list) else []:
            try:
                if psutil.Process(int(pid)).status() != psutil.STATUS_ZOMBIE:   # a zombie holds nothing
                    alive.append(pid)
            except psutil.NoSuchProcess:
                continue
            except (psutil.Error, ValueError, TypeError):
                alive.append(pid)
        if alive != pids:
            log.info("pgserver handles of dead processes dropped: %s", sorted(set(pids) - set(alive)))
            handles.write_text(json.dumps(alive))


def open_database(cfg) -> str:
    """The database URL for a config: KB_DATABASE_URL / database_url, else the embedded server.

    Checks that it answers and migrates it; raises ConfigError for an unreachable configured URL.
    """
    from kb_assets.config import DATABASE_URL_ENV, ConfigError

    url = cfg.effective_database_url()
    if url:
        try:
            with connect(url, register=False, connect_timeout=10) as conn:
                migrate(conn)
        except psycopg.OperationalError as exc:
            key = DATABASE_URL_ENV if os.environ.get(DATABASE_URL_ENV) else "database_url"
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(cfg.config_path, key, f"cannot connect ({first})",
                              "start the server, fix the URL, or remove it to use the embedded database") from None
        return url
    url = embedded_url(cfg.data_path())
    with connect(url, register=False) as conn:
        migrate(conn)
    return url


def connect(url: str, *, register: bool = True, autocommit: bool = True, **kwargs) -> psycopg.Connection:
    """Autocommit by default: atomic work uses explicit `with conn.transaction():` blocks, so no
    transaction is ever left open by a stray SELECT (and none spans a network call)."""
    conn = psycopg.connect(url, autocommit=autocommit, **kwargs)
    if register:
        try:
            register_vector(conn)
        except psycopg.ProgrammingError:
            pass  # the vector type does not exist before the first migration
    return conn


def _migrations() -> list[tuple[int, str, str]]:
    folder = resources.files("kb_assets.store") / "migrations"
    found = []
    for entry in folder.iterdir():
        name = entry.name
        if name.endswith(".sql") and name[:3].isdigit():
            found.append((int(name[:3]), name, entry.read_text(encoding="utf-8")))
    return sorted(found)


def migrate(conn: psycopg.Connection) -> list[str]:
    """Apply pending migrations, each in its own transaction, under an advisory lock. Idempotent."""
    applied_now: list[str] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_ID,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version int PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
        for version, name, sql in _migrations():
            if version in done:
                continue
            conn.execute(sql)
            conn.execute("INSERT INTO schema_migrations (version, name) VALUES (%s, %s)", (version, name))
            applied_now.append(name)
            log.info("applied migration %s", name)
    return applied_now
