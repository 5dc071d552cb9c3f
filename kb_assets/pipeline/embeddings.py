"""Stage 3: give every chunk hash a vector in the active (model, dimension) space.

SQL-first: only hashes without a vector are selected, so identical chunks anywhere, renamed files and
re-runs cost nothing (invariant 2). Each batch is embedded with no transaction open, then written and
committed on its own: a crash loses at most one batch (invariants 3, 4).
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass

import numpy as np
import psycopg
from psycopg import sql

from kb_assets.pipeline.progress import Progress, null_progress
from kb_assets.store import spaces

log = logging.getLogger(__name__)


@dataclass
class EmbedStats:
    source: str | None
    model: str
    dimension: int
    chunks_embedded: int = 0      # distinct chunk hashes sent to the model in this run
    batches: int = 0
    tokens: int = 0
    reused: int = 0               # chunks of this source whose vector already existed
    missing_after: int = 0
    orphans_removed: int = 0
    activated: bool = False
    seconds: float = 0.0

    def as_metadata(self) -> dict:
        return asdict(self)


def _missing_query(table: str, source_key: str | None, limit: int) -> sql.Composed:
    """The next `limit` chunk hashes without a vector after a given hash (keyset pagination: each batch starts
    where the last ended instead of rescanning from the start, which made a full run quadratic)."""
    scope = sql.SQL("")
    if source_key is not None:
        scope = sql.SQL(" AND c.document_id IN (SELECT id FROM documents WHERE source_key = {s})").format(
            s=sql.Literal(source_key))
    return sql.SQL(
        "SELECT DISTINCT ON (c.chunk_hash) c.chunk_hash, c.heading, c.text FROM chunks c"
        " WHERE c.chunk_hash > %s"
        # the repeated bound lets the anti-join range-scan the vector table's key too
        " AND NOT EXISTS (SELECT 1 FROM {t} e WHERE e.chunk_hash = c.chunk_hash AND e.chunk_hash > %s){scope}"
        " ORDER BY c.chunk_hash LIMIT {n}"
    ).format(t=sql.Identifier(table), scope=scope, n=sql.Literal(limit))


def count_missing(conn: psycopg.Connection, table: str, source_key: str | None = None) -> int:
    scope = sql.SQL("")
    if source_key is not None:
        scope = sql.SQL(" AND c.document_id IN (SELECT id FROM documents WHERE source_key = {s})").format(
            s=sql.Literal(source_key))
    q = sql.SQL(
        "SELECT count(DISTINCT c.chunk_hash) FROM chunks c"
        " WHERE NOT EXISTS (SELECT 1 FROM {t} e WHERE e.chunk_hash = c.chunk_hash){scope}"
    ).format(t=sql.Identifier(table), scope=scope)
    return conn.execute(q).fetchone()[0]


def embed_source(conn: psycopg.Connection, embedder, *, source_key: str | None, batch_rows: int = 500,
                 progress: Progress = null_progress, max_batches: int | None = None) -> EmbedStats:
    """Embed the chunk hashes of a source (or of every source) that have no vector yet.

    `max_batches` stops early (used by the kill-and-resume test to simulate an interrupted run).
    """
    started = time.perf_counter()
    table = spaces.ensure_space(conn, embedder.model, embedder.dimension)
    stats = EmbedStats(source=source_key, model=embedder.model, dimension=embedder.dimension)
    missing = count_missing(conn, table, source_key)
    progress.start(f"{source_key or 'all'}: embedding", total=missing)
    # Consistent but not durable to the last millisecond: a server crash can lose the newest batches, which
    # the next run re-embeds; it never leaves a half-written batch. Saves a WAL flush per batch.
    conn.execute("SET synchronous_commit = off")
    after = ""
    while missing and (max_batches is None or stats.batches < max_batches):
        rows = conn.execute(_missing_query(table, source_key, batch_rows), (after, after)).fetchall()
        if not rows:
            break
        after = rows[-1][0]
        texts = [f"{heading}\n{text}" if heading else text for _, heading, text in rows]
        result = embedder.embed_documents(texts)            # network / model call: no transaction open
        vectors = np.asarray(result.vectors, dtype=np.float32)
        if vectors.shape != (len(rows), embedder.dimension):
            raise ValueError(f"embedder returned {vectors.shape}, expected ({len(rows)}, {embedder.dimension})")
        with conn.transaction():
            # Stage through a temp table: COPY is fast, and ON CONFLICT lets two runs that embedded the
            # same hash at once both commit.
            conn.execute("CREATE TEMP TABLE IF NOT EXISTS _vector_load (chunk_hash text, embedding vector)"
                         " ON COMMIT DELETE ROWS")
            with conn.cursor().copy("COPY _vector_load (chunk_hash, embedding) FROM STDIN WITH (FORMAT BINARY)") as copy:
                copy.set_types(["text", "vector"])
                for (chunk_hash, _, _), vec in zip(rows, vectors):
                    copy.write_row((chunk_hash, vec))
            conn.execute(sql.SQL(
                "INSERT INTO {t} (chunk_hash, embedding) SELECT chunk_hash, embedding FROM _vector_load"
                " ON CONFLICT (chunk_hash) DO NOTHING").format(t=sql.Identifier(table)))
        stats.batches += 1
        stats.chunks_embedded += len(rows)
        stats.tokens += int(getattr(result, "tokens", 0) or 0)
        progress.advance(len(rows))
    progress.done()
    conn.execute("SET synchronous_commit = on")
    spaces.ensure_vector_index(conn, table)
    stats.missing_after = count_missing(conn, table, source_key)
    stats.seconds = round(time.perf_counter() - started, 3)
    return stats


def remove_orphan_vectors(conn: psycopg.Connection) -> int:
    """Delete vectors (in every space) whose chunk hash no chunk uses any more."""
    removed = 0
    for (table,) in conn.execute("SELECT table_name FROM embedding_spaces").fetchall():
        with conn.transaction():
            removed += conn.execute(sql.SQL(
                "DELETE FROM {t} e WHERE NOT EXISTS (SELECT 1 FROM chunks c WHERE c.chunk_hash = e.chunk_hash)"
            ).format(t=sql.Identifier(table))).rowcount
    return removed


def activate_if_complete(conn: psycopg.Connection, model: str, dimension: int) -> bool:
    """Make (model, dimension) the space queries use once it covers every chunk of every source."""
    table = spaces.space_table(conn, model, dimension)
    if table is None:
        return False
    active = spaces.active_space(conn)
    if active and active[:2] == (model, dimension):
        return False
    if count_missing(conn, table) == 0:
        spaces.activate_space(conn, model, dimension)
        return True
    return False
