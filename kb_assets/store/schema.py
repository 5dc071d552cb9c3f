"""kb's own PostgreSQL schema: its name, the search_path of kb's connections, and the in-place move of an
install made before there was one (kb's tables in `public`, beside whatever else the database holds —
Dagster's own storage has a table `runs` too).

Every connection kb opens resolves names in `<schema>, <the vector extension's schema>` and nowhere else, so
kb never reads or writes another schema's tables by accident (the regression check's schema is one more kb
schema, opened the same way).
"""
from __future__ import annotations

import os
import re

import psycopg
from psycopg import sql

SCHEMA_ENV = "KB_SCHEMA"
DEFAULT_SCHEMA = "kb"
# unquoted PostgreSQL identifiers only: no quoting anywhere, and `pg_` names are the system's
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}")

_CREATE_TABLE = re.compile(r"CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?([a-z_][a-z0-9_]*)", re.I)
_CREATE_FUNCTION = re.compile(r"CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+([a-z_][a-z0-9_]*)\s*\(", re.I)


def schema_problem(name: str) -> str | None:
    """Why `name` cannot be kb's schema, or None."""
    if not _IDENTIFIER.fullmatch(name or ""):
        return f"{name!r} is not a lower-case SQL identifier (letters, digits, _; at most 63)"
    if name.startswith("pg_") or name == "information_schema":
        return f"{name!r} is reserved by PostgreSQL"
    return None


def env_schema() -> str | None:
    return os.environ.get(SCHEMA_ENV) or None


def default_schema() -> str:
    """KB_SCHEMA, else `kb`: the schema of a connection opened on a bare URL."""
    name = env_schema() or DEFAULT_SCHEMA
    problem = schema_problem(name)
    if problem:
        raise ValueError(f"{SCHEMA_ENV}: {problem}")
    return name


def regression_schema(schema: str) -> str:
    """Where the regression check indexes its corpus: beside kb's schema, never in it."""
    return f"{schema}_regression"[:63]


def vector_schema(conn: psycopg.Connection) -> str | None:
    """The schema the `vector` extension lives in (its type and operators), None before it is installed."""
    row = conn.execute("SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'vector'").fetchone()
    return row[0] if row else None


def search_path(schema: str, extension_schema: str | None) -> list[str]:
    return [schema] + ([extension_schema] if extension_schema and extension_schema != schema else [])


def set_search_path(conn: psycopg.Connection, schema: str) -> None:
    """This session: `schema`, then the vector extension's schema."""
    path = search_path(schema, vector_schema(conn))
    conn.execute("SELECT set_config('search_path', %s, false)",
                 (", ".join(sql.Identifier(s).as_string(conn) for s in path),))


def intended_schema(conn: psycopg.Connection) -> str:
    """The first entry of the session's search_path (it may not exist yet: current_schema() would skip it)."""
    first = conn.execute("SELECT current_setting('search_path')").fetchone()[0].split(",")[0].strip()
    first = first[1:-1].replace('""', '"') if first.startswith('"') else first
    # a connection kb did not open (PostgreSQL's default path starts with "$user"): kb's default schema
    return default_schema() if first in ("$user", "") else first


def _migration_objects(migrations: list[tuple[int, str, str]]) -> tuple[list[str], list[str]]:
    tables, functions = ["schema_migrations"], []
    for _, _, text in migrations:
        tables += [t.lower() for t in _CREATE_TABLE.findall(text) if t.lower() not in tables]
        functions += [f.lower() for f in _CREATE_FUNCTION.findall(text) if f.lower() not in functions]
    return tables, functions


def move_from_public(conn: psycopg.Connection, schema: str, migrations: list[tuple[int, str, str]]) -> list[str]:
    """An install made before kb had its own schema: move kb's tables (with their indexes, constraints, owned
    sequences and triggers), its vector-space tables and its trigger functions from `public` into `schema`.

    Runs inside migrate()'s transaction, under its lock: all or nothing, and two processes never both move.
    Only objects kb's migrations name (and the spaces kb recorded) move; anything else in public stays. Returns
    what moved ([] when there is nothing to do)."""
    if schema == "public":
        return []
    own, legacy = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL, to_regclass('public.schema_migrations') IS NOT NULL",
        (sql.Identifier(schema, "schema_migrations").as_string(conn),)).fetchone()
    if own or not legacy:
        return []
    names = {r[0] for r in conn.execute("SELECT name FROM public.schema_migrations")}
    if not names & {name for _, name, _ in migrations}:
        return []   # someone else's schema_migrations table
    tables, functions = _migration_objects(migrations)
    if conn.execute("SELECT to_regclass('public.embedding_spaces') IS NOT NULL").fetchone()[0]:
        from kb_assets.store.spaces import doc_vector_table

        for (table,) in conn.execute("SELECT table_name FROM public.embedding_spaces").fetchall():
            tables += [table, doc_vector_table(table)]
    moved = []
    for table in tables:
        exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                              (sql.Identifier("public", table).as_string(conn),)).fetchone()[0]
        if not exists or (table == "runs" and not _is_kb_runs(conn)):
            continue
        conn.execute(sql.SQL("ALTER TABLE {} SET SCHEMA {}").format(sql.Identifier("public", table),
                                                                    sql.Identifier(schema)))
        moved.append(table)
    for function in functions:
        if conn.execute("SELECT EXISTS (SELECT 1 FROM pg_proc WHERE proname = %s"
                        " AND pronamespace = 'public'::regnamespace)", (function,)).fetchone()[0]:
            conn.execute(sql.SQL("ALTER FUNCTION {} SET SCHEMA {}").format(sql.Identifier("public", function),
                                                                          sql.Identifier(schema)))
            moved.append(function + "()")
    return moved


def _is_kb_runs(conn: psycopg.Connection) -> bool:
    """public.runs is kb's (source_key, stage), not Dagster's run storage of the same name."""
    cols = {r[0] for r in conn.execute("SELECT column_name FROM information_schema.columns"
                                       " WHERE table_schema = 'public' AND table_name = 'runs'")}
    return {"source_key", "stage", "stats"} <= cols
