"""Connections, the embedded PostgreSQL, and versioned migrations."""
from __future__ import annotations

import atexit
import json
import logging
import os
import re
import threading
from importlib import resources
from pathlib import Path

import psycopg
from psycopg import sql

from kb_assets.store.schema import (default_schema, intended_schema, move_from_public, schema_problem, search_path,
                                    set_search_path, vector_schema)

log = logging.getLogger(__name__)

MIGRATION_LOCK_ID = 0x6B62_0001  # pg_advisory_xact_lock key: two processes never migrate at once

HANDLE_FILE = ".handle_pids.json"   # pgserver's per-data-folder list of live handle pids

_servers: dict[str, object] = {}   # pgserver handles kept alive for the life of the process
_servers_lock = threading.Lock()
_released = False   # release_embedded() ran: the process is exiting


class DatabaseError(Exception):
    """The database could not be reached or prepared: str() says what to do."""


def embedded_url(data_dir: Path) -> str:
    """Start (or join) the embedded PostgreSQL under data_dir/pg and return its URL.

    pgserver refcounts handles per data folder across processes and stops the server when the last one
    exits, so this process keeps its handle until it ends. A holder killed with -9 never removes its pid from
    the handle file, which kept the server running forever: dead pids are dropped here, before joining, and
    again before this process lets go (so the last live holder stops the server). A postmaster that died
    under a live handle is started again.
    """
    pgdata = (data_dir / "pg").resolve()
    key = str(pgdata)
    with _servers_lock:
        if _released:   # a hard exit let go of the handles: joining again now would leave our pid behind
            raise DatabaseError("this process is exiting: the embedded PostgreSQL handle was released")
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

            prune_stale_handles(pgdata)
            try:
                server = pgserver.get_server(pgdata, cleanup_mode=None if linger_s else "stop")
            except Exception as exc:  # pgserver raises plain exceptions with the postgres log
                raise DatabaseError(f"could not start the embedded PostgreSQL in {pgdata}: {exc}") from exc
            _servers[key] = server
            # atexit runs last-registered first: this runs before pgserver's own handle release
            atexit.register(prune_stale_handles, pgdata)
            if linger_s:
                linger.ensure_linger(pgdata, linger_s)
        else:
            _revive(server, pgdata)
        return server.get_uri()  # type: ignore[attr-defined]


def prune_stale_handles(pgdata: Path) -> list[int]:
    """Remove the pids of dead processes from pgserver's handle file; returns the pids removed."""
    handle_file = Path(pgdata) / HANDLE_FILE
    if not handle_file.exists():
        return []
    import psutil
    from pgserver.postgres_server import PostgresServer

    with PostgresServer._lock:   # pgserver's own inter-process lock around the file
        try:
            pids = json.loads(handle_file.read_text() or "[]")
        except (OSError, ValueError):
            return []
        live = [p for p in pids if isinstance(p, int) and _alive(psutil, p)]
        dead = [p for p in pids if p not in live]
        if dead:
            handle_file.write_text(json.dumps(live))
            log.info("embedded PostgreSQL %s: dropped handles of dead processes %s", pgdata, dead)
    return dead


def _alive(psutil, pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE   # a zombie holds nothing
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


def _revive(server, pgdata: Path) -> None:
    """The postmaster under our handle was killed: start it again (the retry loop calls us again on failure)."""
    info = getattr(server, "_postmaster_info", None)
    if info is None or info.is_running():
        return
    from pgserver.postgres_server import PostgresServer

    log.warning("the embedded PostgreSQL in %s is not running: starting it again", pgdata)
    try:
        with PostgresServer._lock:
            server.ensure_postgres_running()
    except Exception as exc:  # a transient outage to the retry loop (orphan backends may still be exiting)
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        raise psycopg.OperationalError(f"the embedded PostgreSQL in {pgdata} is not running and could not "
                                       f"be started yet: {why}") from exc


def release_embedded(data_dir: Path | None = None, *, exiting: bool = False) -> None:
    """Let go of this process's embedded-server handles now (a hard exit skips atexit): the server stops
    if no other live process holds it. `data_dir`: only the server under that kb data folder."""
    global _released
    from kb_assets.store.idle_connections import close_kept

    close_kept()            # the stages' kept connections go first: the server may stop now
    only = str((data_dir / "pg").resolve()) if data_dir is not None else None
    with _servers_lock:
        _released = _released or exiting
        servers = [(k, v) for k, v in _servers.items() if only is None or k == only]
        for key, _ in servers:
            del _servers[key]
    for key, server in servers:
        try:
            prune_stale_handles(Path(key))
            server.cleanup()  # type: ignore[attr-defined]
        except Exception:
            log.exception("releasing the embedded PostgreSQL %s failed", key)


def open_database(cfg, *, schema: str | None = None, retry_seconds: float | None = None) -> str:
    """The database URL for a config: KB_DATABASE_URL / database_url, else the embedded server.

    Checks that it answers and migrates kb's schema (once per process). The URL returned carries the
    search_path of kb's schema: every connection opened on it resolves names there (then in the vector
    extension's schema) and nowhere else. A server that is down, starting or restarting is retried for
    `database_retry_seconds` (then DatabaseUnreachable: the CLI's exit 4); a URL that can never work (bad
    password, unknown database, malformed) raises ConfigError at once.
    """
    from kb_assets.store.retry import retry_call

    budget = cfg_retry_seconds(cfg) if retry_seconds is None else retry_seconds
    url, origin = database_origin(cfg)
    return retry_call(lambda: open_database_once(cfg, schema=schema), url=url, origin=origin, budget=budget)


def database_origin(cfg) -> tuple[str, str]:
    """(the URL or the embedded folder, where it was configured) for messages."""
    from kb_assets.config import DATABASE_URL_ENV

    if os.environ.get(DATABASE_URL_ENV):
        return os.environ[DATABASE_URL_ENV], f"${DATABASE_URL_ENV}"
    if cfg.database_url:
        return cfg.database_url, f"database_url in {cfg.config_path}"
    return str(cfg.data_path() / "pg"), "the embedded server"


def cfg_retry_seconds(cfg) -> float:
    from kb_assets.store.retry import DEFAULT_RETRY_SECONDS

    value = getattr(cfg, "database_retry_seconds", None)
    return DEFAULT_RETRY_SECONDS if value is None else float(value)


def open_database_once(cfg, *, schema: str | None = None) -> str:
    """One attempt of open_database: transient connection errors propagate (psycopg.OperationalError)."""
    from kb_assets.config import DATABASE_URL_ENV, ConfigError
    from kb_assets.store.retry import is_config_error

    main = schema is None     # kb's schema (not e.g. the regression check's): it adopts an install in public
    schema = schema or cfg.effective_schema()
    url = cfg.effective_database_url()
    if url:
        try:
            return open_schema(url, schema, adopt_public=main, connect_timeout=10)
        except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:
            if not is_config_error(exc):
                raise
            key = DATABASE_URL_ENV if os.environ.get(DATABASE_URL_ENV) else "database_url"
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(cfg.config_path, key, f"cannot connect ({first})",
                              "fix the URL, or remove it to use the embedded database") from None
    return open_schema(embedded_url(cfg.data_path()), schema, adopt_public=main, connect_timeout=10)



_ready: dict[tuple[str, str], str] = {}   # (url, schema) -> URL carrying its search_path, migrated already
_ready_lock = threading.Lock()
_extension_schemas: dict[str, str] = {}   # url -> the schema of its vector extension


def open_schema(url: str, schema: str, *, adopt_public: bool = True, **connect_kwargs) -> str:
    """Create and migrate kb's `schema` in the database at `url` (once per process, not on every connect) and
    return a URL whose connections use it. `adopt_public`: see migrate()."""
    key = (url, schema)
    with _ready_lock:
        done = _ready.get(key)
    if done is not None:
        return done
    with connect(url, schema=schema, register=False, **connect_kwargs) as conn:
        migrate(conn, schema=schema, adopt_public=adopt_public)
        ext = vector_schema(conn)
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(url)
    params["options"] = _with_search_path(params.get("options"), search_path(schema, ext))
    out = make_conninfo(**params)
    with _ready_lock:
        _ready[key] = out
    return out


_SEARCH_PATH_OPTION = re.compile(r"(?:-c\s*|--)search_path=\S*")


def _with_search_path(options: str | None, path: list[str]) -> str:
    """libpq `options` with `-c search_path=…` replaced (names that need quoting are set after connecting)."""
    rest = _SEARCH_PATH_OPTION.sub("", options or "").strip()
    plain = [s for s in path if schema_problem(s) is None]
    return " ".join(x for x in (rest, "-c search_path=" + ",".join(plain)) if x)


def connect(url: str, *, schema: str | None = None, register: bool = True, autocommit: bool = True,
            **kwargs) -> psycopg.Connection:
    """Autocommit by default: atomic work uses explicit `with conn.transaction():` blocks, so no
    transaction is ever left open by a stray SELECT (and none spans a network call).

    A URL from open_database / open_schema carries kb's search_path. Any other URL (or an explicit `schema`)
    gets `schema` (default: KB_SCHEMA, else `kb`), then the vector extension's schema."""
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(url)
    if schema is None and "search_path" in (params.get("options") or ""):
        conn = psycopg.connect(url, autocommit=autocommit, **kwargs)
    else:
        schema = schema or default_schema()
        ext = _extension_schemas.get(url)
        params["options"] = _with_search_path(params.get("options"), search_path(schema, ext))
        conn = psycopg.connect(url, autocommit=autocommit, **{**kwargs, "options": params["options"]})
        if ext is None or schema_problem(ext) is not None:
            ext = vector_schema(conn)
            if ext is not None:
                _extension_schemas[url] = ext
                set_search_path(conn, schema)
    if register:
        try:
            register_vector(conn)
        except psycopg.ProgrammingError:
            pass  # the vector type does not exist before the first migration
    return conn


def register_vector(conn: psycopg.Connection) -> None:
    """pgvector's `vector` adapters on `conn`, from one catalog query.

    pgvector's own register_vector looks up four types (vector, bit, halfvec, sparsevec), each in a transaction
    of its own: 12 round trips per connection, ~190 of the ~300 statements of a small `kb index`
    (docs/BENCHMARKS.md, "Small passes: one anti-join plan"). kb stores and reads only `vector`. Raises
    psycopg.ProgrammingError when the type does not exist (before the first migration)."""
    from pgvector.psycopg.vector import register_vector_info
    from psycopg.types import TypeInfo

    query = ("SELECT t.typname, t.oid, t.typarray, t.oid::regtype::text, t.typdelim FROM pg_type t"
             " WHERE t.oid = to_regtype('vector')")
    if conn.autocommit:
        row = conn.execute(query).fetchone()
    else:               # leave the connection as it was found, as TypeInfo.fetch does
        with conn.transaction():
            row = conn.execute(query).fetchone()
    if row is None:
        raise psycopg.ProgrammingError("vector type not found in the database")
    register_vector_info(conn, TypeInfo(row[0], row[1], row[2], regtype=row[3], delimiter=row[4]))


def _migrations() -> list[tuple[int, str, str]]:
    folder = resources.files("kb_assets.store") / "migrations"
    found = []
    for entry in folder.iterdir():
        name = entry.name
        if name.endswith(".sql") and name[:3].isdigit():
            found.append((int(name[:3]), name, entry.read_text(encoding="utf-8")))
    return sorted(found)


def migrate(conn: psycopg.Connection, schema: str | None = None, *, adopt_public: bool = True) -> list[str]:
    """Apply pending migrations to kb's schema (`schema`, default: the first of the session's search_path),
    each in its own transaction, under an advisory lock. Idempotent.

    Creates the schema, and the vector extension if missing (in `public` when it exists, so that no kb schema
    holds it). `adopt_public`: first move an install made before kb had its own schema out of `public` (kb's
    main schema does; a side schema such as the regression check's must not take the real index)."""
    schema = schema or intended_schema(conn)
    applied_now: list[str] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_ID,))
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        if vector_schema(conn) is None:
            public = conn.execute("SELECT to_regnamespace('public') IS NOT NULL").fetchone()[0]
            conn.execute(sql.SQL("CREATE EXTENSION IF NOT EXISTS vector SCHEMA {}").format(
                sql.Identifier("public" if public else schema)))
        set_search_path(conn, schema)
        moved = move_from_public(conn, schema, _migrations()) if adopt_public else []
        if moved:
            log.warning("moved kb's tables from schema public into %s: %s", schema, ", ".join(moved))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version int PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
        for version, name, text in _migrations():
            if version in done:
                continue
            conn.execute(text)
            conn.execute("INSERT INTO schema_migrations (version, name) VALUES (%s, %s)", (version, name))
            applied_now.append(name)
            log.info("applied migration %s", name)
    return applied_now
