"""Vector spaces: one table per (model, dimension), so two models' vectors never mix (invariant 7).

A model change builds its space beside the old one; `activate_space` swaps which space queries use once
the new space covers every active chunk.
"""
from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql

from kb_assets.store.locks import ddl_lock

log = logging.getLogger(__name__)

_SLUG = re.compile(r"[^a-z0-9]+")
# The chunk vectors' HNSW graph: pgvector's default m (16) and a smaller candidate list while building
# (ef_construction, default 64). Measured on copies of the four quality sets' full indexes (real MiniLM vectors,
# bench/hnsw_quality.py): at 40 the same nDCG@10 and Recall@100 on every set (at 32 the PEP set's nDCG@10
# slips: vector 0.8489 -> 0.8473), the build ~30-45% faster (real vectors) and 20-40% less server CPU (random
# unit vectors, the stand-in's kind): docs/BENCHMARKS.md, "Full pass: chunks, documents and the vector index".
# Queries search with hnsw.ef_search = their window (>= 40). An index built before keeps its settings.
HNSW_M = 16
HNSW_EF_CONSTRUCTION = 40


@contextmanager
def merge_anti_joins(conn: psycopg.Connection) -> Iterator[None]:
    """Hash joins off for the statements inside: the anti-joins of chunks and vectors by hash then run as merge
    anti-joins of the two hash indexes, index-only.

    PostgreSQL chose between that plan (~6 ms on the PEPs' 26K chunks) and a hash anti-join that reads the chunk
    table's heap, text and keyword vectors included (15-33 ms), by its estimate of how much of each table is
    all-visible, and the choice flipped between two runs of the same small pass (docs/BENCHMARKS.md, "Small
    passes: one anti-join plan"). Merging two indexes in key order never needs the heaps but to check a tuple
    on a page not yet vacuumed. The setting is local to a transaction (a savepoint inside a caller's) and set back
    as it was once the statements have run; a statement that fails rolls it back with its transaction."""
    with conn.transaction():
        before = conn.execute("SELECT current_setting('enable_hashjoin'), set_config('enable_hashjoin', 'off', true)"
                              ).fetchone()[0]
        yield
        conn.execute("SELECT set_config('enable_hashjoin', %s, true)", (before,))


# A stage that wrote at least this many rows into a table settles it before it returns (settle_after_bulk_write).
BULK_WRITE_ROWS = 2000


def settle_after_bulk_write(conn: psycopg.Connection, table: str) -> bool:
    """ANALYZE, then VACUUM, a table a stage has just filled with many rows: its statistics current, its pages
    all-visible. False if another session holds a conflicting lock (it is skipped, never waited for).

    Why: the anti-joins above are index-only only on pages the visibility map marks all-visible, and a bulk load
    leaves most of its pages unmarked until autovacuum gets there (a minute or more). The small pass that follows a
    first load then read every heap page of the vector table (0.3-0.6 s, parallel workers, against ~10 ms), with
    row estimates from the middle of the load (docs/BENCHMARKS.md, "Small passes: connections handed on").
    SKIP_LOCKED: a background HNSW build holds the table's lock for as long as it runs; a table autovacuum is
    working on is being vacuumed anyway. Needs an autocommit connection (VACUUM cannot run in a transaction block);
    the stages' connections are. Measured on the 3,000-document first load: ANALYZE chunks 0.24 s at the chunk
    stage's end, beside the model; the vector table's ANALYZE and VACUUM under 0.05 s each."""
    skipped: list[str] = []

    def note(diag) -> None:         # the server's "skipping analyze/vacuum of ... lock not available" warning
        if (diag.message_primary or "").startswith("skipping"):
            skipped.append(diag.message_primary)

    started = time.perf_counter()
    conn.add_notice_handler(note)
    try:
        # ANALYZE first, in a transaction that commits synchronously: its commit flushes the WAL of the stage's
        # own commits (the embedding stage's are asynchronous), and VACUUM marks a page all-visible only once
        # its rows' commits are on disk
        with conn.transaction():
            conn.execute("SET LOCAL synchronous_commit = on")
            conn.execute(sql.SQL("ANALYZE (SKIP_LOCKED) {t}").format(t=sql.Identifier(table)))
        conn.execute(sql.SQL("VACUUM (SKIP_LOCKED) {t}").format(t=sql.Identifier(table)))
    finally:
        conn.remove_notice_handler(note)
    log.info("%s: %s after a bulk write (%.2f s)", table, "skipped: locked" if skipped else "vacuumed",
             time.perf_counter() - started)
    return not skipped


def hashes_without_vector(table: str) -> sql.Composed:
    """The distinct chunk hashes that have no vector in space `table`: a query for a MATERIALIZED CTE, run inside
    merge_anti_joins. Apart (a CTE of its own, reading only the hash of each side) it is a merge anti-join of the
    two hash indexes; inline in a query that also joins documents (a per-source count) the planner took a hash
    anti-join over both tables' heaps, and chunks hold their text: on the PEPs (26K chunks) 15-24 ms against 6 ms,
    paid several times by every small pass (docs/BENCHMARKS.md, "Small passes: one anti-join plan")."""
    return sql.SQL("SELECT DISTINCT c.chunk_hash FROM chunks c"
                   " WHERE NOT EXISTS (SELECT 1 FROM {t} e WHERE e.chunk_hash = c.chunk_hash)"
                   ).format(t=sql.Identifier(table))


def vectors_without_chunk(table: str) -> sql.Composed:
    """The hashes of space `table`'s vectors that no chunk uses any more (the same index-only anti-join the other
    way round): a query for a MATERIALIZED CTE, run inside merge_anti_joins."""
    return sql.SQL("SELECT e.chunk_hash FROM {t} e"
                   " WHERE NOT EXISTS (SELECT 1 FROM chunks c WHERE c.chunk_hash = e.chunk_hash)"
                   ).format(t=sql.Identifier(table))


def chunks_without_vector(conn: psycopg.Connection, table: str, source_key: str) -> tuple[int, int]:
    """(chunks of the source, those whose text has no vector in `table`), in one statement (one snapshot)."""
    with merge_anti_joins(conn):
        return conn.execute(sql.SQL(
            "WITH m AS MATERIALIZED ({m})"
            " SELECT (SELECT count(*) FROM chunks c JOIN documents d ON d.id = c.document_id WHERE d.source_key = %s),"
            " (SELECT count(*) FROM m JOIN chunks c ON c.chunk_hash = m.chunk_hash"
            " JOIN documents d ON d.id = c.document_id WHERE d.source_key = %s)"
        ).format(m=hashes_without_vector(table)), (source_key, source_key)).fetchone()


def doc_vector_table(space_table: str) -> str:
    """The document-vector table beside a space (written by pipeline.query_stats, read by the query)."""
    return f"{space_table}_docs"[:63]


def _table_name(space_id: int, model: str, dim: int) -> str:
    slug = _SLUG.sub("_", model.lower()).strip("_")[:30]
    return f"embeddings_{space_id}_{slug}_{dim}"


def ensure_space(conn: psycopg.Connection, model: str, dim: int) -> str:
    """Return the table of vectors for (model, dim), creating it (and its HNSW index) if needed."""
    row = conn.execute(
        "SELECT table_name FROM embedding_spaces WHERE model = %s AND dimension = %s", (model, dim)
    ).fetchone()
    if row:
        return row[0]
    with conn.transaction():
        ddl_lock(conn)
        conn.execute("LOCK TABLE embedding_spaces IN SHARE ROW EXCLUSIVE MODE")
        row = conn.execute(
            "SELECT table_name FROM embedding_spaces WHERE model = %s AND dimension = %s", (model, dim)
        ).fetchone()
        if row:
            return row[0]
        space_id = conn.execute("SELECT nextval(pg_get_serial_sequence('embedding_spaces', 'id'))").fetchone()[0]
        table = _table_name(space_id, model, dim)
        conn.execute(
            sql.SQL(
                "CREATE TABLE {t} (chunk_hash text PRIMARY KEY, embedding vector({d}) NOT NULL,"
                " created_at timestamptz NOT NULL DEFAULT now())"
            ).format(t=sql.Identifier(table), d=sql.Literal(dim))
        )
        conn.execute(
            "INSERT INTO embedding_spaces (id, model, dimension, table_name) VALUES (%s, %s, %s, %s)",
            (space_id, model, dim, table),
        )
    return table


def own(conn: psycopg.Connection, name: str) -> sql.Identifier:
    """`name` qualified with the connection's own schema (the first of its search_path that exists): a DROP or
    an existence check must never reach a same-named object of a schema further down the search_path."""
    return sql.Identifier(conn.execute("SELECT current_schema()").fetchone()[0], name)


def vector_index_name(table: str) -> str:
    return f"{table}_hnsw"[:63]


def _index_validity(conn: psycopg.Connection, table: str) -> bool | None:
    """None: the space has no index of that name; else whether it is valid (one a background build is still
    writing, or one a killed build left INVALID, is not used by the planner). Our schema only — a connection
    whose search_path goes on to another schema never sees that schema's index — and read from pg_class
    itself: the catalog cache of a transaction that waited on a lock has not seen another session's index yet."""
    row = conn.execute("SELECT i.indisvalid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                       " JOIN pg_index i ON i.indexrelid = c.oid WHERE c.relname = %s AND n.nspname = current_schema()",
                       (vector_index_name(table),)).fetchone()
    return row[0] if row else None


def has_vector_index(conn: psycopg.Connection, table: str) -> bool:
    """The space has its HNSW index, built and valid."""
    return _index_validity(conn, table) is True


# A background build (pipeline/vector_index_build.py) holds this session-level advisory lock, keyed by the
# table, for as long as it runs: "building" is a lock someone holds, so a killed build never looks alive.
BUILD_LOCK_CLASS = 0x6B62_0010   # (two-key advisory locks: a space of their own beside kb's bigint keys)
_BUILD_KEY = "hashtext(current_schema() || '.' || %s)"


def vector_index_state(conn: psycopg.Connection, table: str) -> str:
    """'ready', 'building' (a background build holds the table's build lock) or 'missing'."""
    if has_vector_index(conn, table):
        return "ready"
    return "building" if build_holder(conn, table) is not None else "missing"


def build_holder(conn: psycopg.Connection, table: str) -> int | None:
    """The backend pid of the session building the table's index in the background, if one is."""
    row = conn.execute(
        "SELECT l.pid FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.database ="
        " (SELECT oid FROM pg_database WHERE datname = current_database()) AND l.classid = %s::oid"
        " AND l.objid = (" + _BUILD_KEY + ")::oid AND l.objsubid = 2 LIMIT 1",
        (BUILD_LOCK_CLASS, table)).fetchone()
    return row[0] if row else None


def try_build_lock(conn: psycopg.Connection, table: str) -> bool:
    """Take the table's build lock for this session (the background builder), without waiting."""
    return conn.execute("SELECT pg_try_advisory_lock(%s, " + _BUILD_KEY + ")",
                        (BUILD_LOCK_CLASS, table)).fetchone()[0]


def cancel_build(conn: psycopg.Connection, table: str) -> bool:
    """Cancel a background build of the table's index (its CREATE INDEX CONCURRENTLY rolls back, leaving an
    INVALID index that drop_vector_index or the next build removes); True if one was running."""
    pid = build_holder(conn, table)
    if pid is None:
        return False
    conn.execute("SELECT pg_cancel_backend(%s)", (pid,))
    return True


def vector_index_exists(conn: psycopg.Connection, table: str) -> bool:
    """Any index of that name in our schema, valid or not."""
    return _index_validity(conn, table) is not None


def _wait_build_lock(conn: psycopg.Connection, table: str) -> None:
    """Inside a transaction: wait until no background build of the table runs, and keep one from starting."""
    conn.execute("SELECT pg_advisory_xact_lock(%s, " + _BUILD_KEY + ")", (BUILD_LOCK_CLASS, table))


def create_index_sql(table: str, *, concurrently: bool) -> sql.Composed:
    return sql.SQL("CREATE INDEX {c} IF NOT EXISTS {i} ON {t} USING hnsw (embedding vector_cosine_ops)"
                   " WITH (m = {m}, ef_construction = {e})").format(
        c=sql.SQL("CONCURRENTLY" if concurrently else ""), i=sql.Identifier(vector_index_name(table)),
        t=sql.Identifier(table), m=sql.Literal(HNSW_M), e=sql.Literal(HNSW_EF_CONSTRUCTION))


def ensure_vector_index(conn: psycopg.Connection, table: str) -> bool:
    """The space's HNSW (cosine) index; True when it was built now. Built once over a loaded space (the
    search-index stage), not maintained row by row during a bulk load: ~10x cheaper for 40K vectors.
    A background build of it running now is waited for, not duplicated."""
    if has_vector_index(conn, table):
        return False
    with conn.transaction():
        # Two runs building it at once failed with UniqueViolation on the index name: one at a time, and the
        # second finds it built. A background build holds the build lock until it is done: wait for it.
        _wait_build_lock(conn, table)
        ddl_lock(conn)
        valid = _index_validity(conn, table)
        if valid:
            return False
        if valid is False:     # left INVALID by a background build that was killed or cancelled
            conn.execute(sql.SQL("DROP INDEX {i}").format(i=own(conn, vector_index_name(table))))
        # pgvector builds the graph in memory when it fits in maintenance_work_mem (default 64 MB: 40K
        # 384-d vectors spill, and the build takes ~2x longer). Local to this transaction.
        conn.execute("SET LOCAL maintenance_work_mem = '1GB'")
        conn.execute(create_index_sql(table, concurrently=False))
    return True


def drop_vector_index(conn: psycopg.Connection, table: str) -> bool:
    """Drop the HNSW index before a large load (rebuilt by the search-index stage); True if it existed. A
    background build of it is cancelled first: the load would otherwise go through it row by row."""
    cancelled = cancel_build(conn, table)
    if not vector_index_exists(conn, table):
        return cancelled
    with conn.transaction():
        _wait_build_lock(conn, table)     # the cancelled build lets go once its rollback is done
        ddl_lock(conn)
        conn.execute(sql.SQL("DROP INDEX IF EXISTS {i}").format(i=own(conn, vector_index_name(table))))
    return True


def space_table(conn: psycopg.Connection, model: str, dim: int) -> str | None:
    row = conn.execute(
        "SELECT table_name FROM embedding_spaces WHERE model = %s AND dimension = %s", (model, dim)
    ).fetchone()
    return row[0] if row else None


def active_space(conn: psycopg.Connection) -> tuple[str, int, str] | None:
    """The space queries use: the most recently activated one."""
    row = conn.execute(
        "SELECT model, dimension, table_name FROM embedding_spaces WHERE activated_at IS NOT NULL"
        " ORDER BY activated_at DESC LIMIT 1"
    ).fetchone()
    return (row[0], row[1], row[2]) if row else None


def activate_space(conn: psycopg.Connection, model: str, dim: int) -> None:
    with conn.transaction():
        conn.execute(
            "UPDATE embedding_spaces SET activated_at = clock_timestamp() WHERE model = %s AND dimension = %s",
            (model, dim),
        )
