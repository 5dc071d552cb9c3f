"""Connections, the embedded PostgreSQL, and versioned migrations."""
from __future__ import annotations

import logging
import os
import re
import threading
from importlib import resources
from pathlib import Path

import psycopg
from pgvector.psycopg import register_vector
from psycopg import sql

from kb_assets.store.schema import (default_schema, intended_schema, move_from_public, schema_problem, search_path,
                                    set_search_path, vector_schema)

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
            import pgserver  # heavy import: only when the embedded server is used

            try:
                server = pgserver.get_server(pgdata, cleanup_mode="stop")
            except Exception as exc:  # pgserver raises plain exceptions with the postgres log
                raise DatabaseError(f"could not start the embedded PostgreSQL in {pgdata}: {exc}") from exc
            _servers[key] = server
        return server.get_uri()  # type: ignore[attr-defined]


def open_database(cfg, *, schema: str | None = None) -> str:
    """The database URL for a config: KB_DATABASE_URL / database_url, else the embedded server.

    Checks that it answers and migrates kb's schema (once per process); raises ConfigError for an unreachable
    configured URL. The URL returned carries the search_path of kb's schema: every connection opened on it
    resolves names there (then in the vector extension's schema) and nowhere else.
    """
    from kb_assets.config import DATABASE_URL_ENV, ConfigError

    main = schema is None     # kb's schema (not e.g. the regression check's): it adopts an install in public
    schema = schema or cfg.effective_schema()
    url = cfg.effective_database_url()
    if url:
        try:
            return open_schema(url, schema, adopt_public=main, connect_timeout=10)
        except psycopg.OperationalError as exc:
            key = DATABASE_URL_ENV if os.environ.get(DATABASE_URL_ENV) else "database_url"
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(cfg.config_path, key, f"cannot connect ({first})",
                              "start the server, fix the URL, or remove it to use the embedded database") from None
    return open_schema(embedded_url(cfg.data_path()), schema, adopt_public=main)


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
