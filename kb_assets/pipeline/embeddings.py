"""Stage 3: give every chunk hash a vector in the active (model, dimension) space.

SQL-first: only hashes without a vector are selected, so identical chunks anywhere, renamed files and
re-runs cost nothing (invariant 2). Each batch is embedded with no transaction open, then written and
committed on its own: a crash loses at most one batch (invariants 3, 4). Vectors computed but not yet
committed when the database connection dropped are kept in memory and reused when the stage is re-run on a
fresh connection (pipeline/guard.py), so a database restart costs no model call.
"""
from __future__ import annotations

import logging
import threading
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from kb_assets.pipeline import cancel
from kb_assets.pipeline.progress import Progress, null_progress
from kb_assets.store import spaces

if TYPE_CHECKING:
    from concurrent.futures import Future

    import numpy as np   # numpy is imported where vectors are handled: a pass with none (a delete, a rename) skips it

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
    restored: int = 0             # vectors brought back from recycled_vectors (a revert, a branch switched back)
    missing_after: int = 0
    orphans_removed: int = 0
    vector_index_dropped: bool = False
    seconds: float = 0.0

    def as_metadata(self) -> dict:
        return asdict(self)


def _missing_query(table: str, source_key: str | None, limit: int, *, few: bool = False) -> sql.Composed:
    """The next `limit` chunk hashes without a vector after a given hash, with their texts (keyset pagination:
    each batch starts where the last ended instead of rescanning from the start, which made a full run
    quadratic). Parameters: the bound, twice.

    `few`: a small change, all of whose missing texts one call takes; run inside spaces.merge_anti_joins. The
    space's missing hashes after the bound come first, index-only, then their chunks' texts: the keyset form's
    anti-join reads the chunks' heap (text and all) in hash order instead, 9-47 ms against a few on the synthetic
    corpus's 56K chunks, per call. Not for a large load: that form finds every missing hash before the limit."""
    # the repeated bound lets the anti-join range-scan the vector table's key too
    without = sql.SQL("c.chunk_hash > %s AND NOT EXISTS (SELECT 1 FROM {t} e WHERE e.chunk_hash = c.chunk_hash"
                      " AND e.chunk_hash > %s)").format(t=sql.Identifier(table))
    rows = sql.SQL("SELECT DISTINCT ON (c.chunk_hash) c.chunk_hash, c.heading, c.text, c.token_count FROM ")
    if few:
        rows = sql.SQL("WITH m AS MATERIALIZED (SELECT DISTINCT c.chunk_hash FROM chunks c WHERE {without}) {rows}"
                       "m JOIN chunks c ON c.chunk_hash = m.chunk_hash WHERE true").format(without=without,
                                                                                           rows=rows)
    else:
        rows = sql.SQL("{rows}chunks c WHERE {without}").format(rows=rows, without=without)
    scope = sql.SQL("")
    if source_key is not None:
        scope = sql.SQL(" AND c.document_id IN (SELECT id FROM documents WHERE source_key = {s})").format(
            s=sql.Literal(source_key))
    return sql.SQL("{rows}{scope} ORDER BY c.chunk_hash LIMIT {n}").format(rows=rows, scope=scope,
                                                                         n=sql.Literal(limit))


def count_missing(conn: psycopg.Connection, table: str, source_key: str | None = None) -> int:
    """Distinct chunk texts (of one source, or of every chunk) without a vector in `table`."""
    missing = spaces.hashes_without_vector(table)
    if source_key is None:
        q = sql.SQL("WITH m AS MATERIALIZED ({m}) SELECT count(*) FROM m").format(m=missing)
    else:   # the space's missing hashes first (index-only, usually none), then which of them the source uses
        q = sql.SQL("WITH m AS MATERIALIZED ({m}) SELECT count(DISTINCT c.chunk_hash) FROM m"
                    " JOIN chunks c ON c.chunk_hash = m.chunk_hash JOIN documents d ON d.id = c.document_id"
                    " WHERE d.source_key = {s}").format(m=missing, s=sql.Literal(source_key))
    with spaces.merge_anti_joins(conn):
        return conn.execute(q).fetchone()[0]


# A load this large into a space that already has its HNSW index drops the index first (the search-index
# stage rebuilds it): inserting into the index costs ~5-9 ms per 384-d vector here, rebuilding ~0.7 ms per
# vector of the whole table, so past ~1/6 of the table's size a rebuild is cheaper. Queries stay correct
# meanwhile (exact scan), only slower.
LARGE_LOAD_MIN = 2000
LARGE_LOAD_FRACTION = 0.25


def _texts(rows) -> list[str]:
    return [f"{heading}\n{text}" if heading else text for _, heading, text, _ in rows]


def _token_counts(rows) -> list[int]:
    """The chunker's count of each text above (heading included), kept in the chunk table."""
    return [token_count for _, _, _, token_count in rows]


# Vectors computed but not yet committed, per (model, dimension): chunk hash → vector. Filled as each model
# call returns, emptied as its batch commits. When the connection drops mid-stage (a database restart),
# guard.run_stage re-runs the stage on a fresh connection in this same process: the missing-hash query then
# returns the same hashes, and their vectors come from here instead of the model (issue 12: a restart used
# to redo the batch being written and the call in flight). Bounded: at most one batch is uncommitted (two halves).
_uncommitted: dict[tuple[str, int], dict[str, np.ndarray]] = {}

# A kill -9 at any instant loses at most one batch (`embed_batch_rows` texts) of model work (issue 12). The
# model is called on half a batch at a time and the write of one half overlaps the call on the next, so what a
# kill can lose is the half being written and the half in flight: one batch, and the model never waits for the
# database (a write took ~0.1 s per 500 rows, 11 s of a 3,000-document first load's critical path; docs/
# BENCHMARKS.md, "Embeddings beside chunking"). True: the call of batch N+1 starts only once batch N has
# committed, whole batches (the order from issue 12 until 2026-12-03; docs/RELIABILITY.md).
WRITE_BEFORE_NEXT_CALL = False


def _embed_with_carry(embedder, rows: list, carry: dict[str, np.ndarray]):
    """embedder.embed_documents for the rows whose vector is not carried; the result covers every row (runs
    in the worker thread; it reads `carry`, only the stage's own thread writes it)."""
    import numpy as np
    from kb_assets.embedding.base import EmbedResult

    todo = [i for i, (chunk_hash, *_) in enumerate(rows) if chunk_hash not in carry]
    if len(todo) == len(rows):
        return embedder.embed_documents(_texts(rows), _token_counts(rows))
    vectors = np.zeros((len(rows), embedder.dimension), dtype=np.float32)
    tokens = 0
    if todo:
        result = embedder.embed_documents(_texts([rows[i] for i in todo]), _token_counts([rows[i] for i in todo]))
        vectors[todo] = np.asarray(result.vectors, dtype=np.float32).reshape(len(todo), embedder.dimension)
        tokens = int(getattr(result, "tokens", 0) or 0)
    for i, (chunk_hash, *_) in enumerate(rows):
        if chunk_hash in carry:
            vectors[i] = carry[chunk_hash]
    return EmbedResult(vectors, tokens)


def _carry(carry: dict[str, np.ndarray], rows: list, result) -> None:
    import numpy as np
    for (chunk_hash, *_), vec in zip(rows, np.asarray(result.vectors, dtype=np.float32)):
        carry[chunk_hash] = vec


def _keep_call_in_flight(call, rows: list, carry: dict[str, np.ndarray]) -> None:
    """The stage failed (e.g. the connection dropped) while a model call ran: let it finish, so that its
    vectors are carried to the re-run (an error in it is the re-run's to meet again)."""
    if call is None:
        return
    try:
        _carry(carry, rows, call.result())
    except Exception:
        pass


# Vectors being computed ahead of the embedding stage, per (model, dimension): a small pass's chunk stage hands
# the texts of the chunks it cuts to the embedder at once (encode_ahead), and the embedding stage that follows
# in this process takes the vectors instead of calling the model on those texts. Each future gives
# ({chunk hash: vector}, tokens).
_ahead: dict[tuple[str, int], list[Future]] = {}
_ahead_texts: dict[tuple[str, int], int] = {}
_ahead_lock = threading.Lock()
# At most this many texts are encoded ahead per stage: a small change's. A larger one is the embedding stage's
# to batch, in calls it sizes and writes as they return (a kill loses at most one batch).
AHEAD_MAX_TEXTS = 64


def encode_ahead(conn: psycopg.Connection, embedder, chunks: list[tuple[str, str, str, int]]) -> int:
    """Start embedding, in a thread of its own, those of `chunks` (chunk hash, heading, text, token count) whose
    hash has no vector in the embedder's space, nor a recycled one to come back; returns how many.

    Why: in a small pass the model's work on the new chunks (~0.4 s for 30 changed files on two cores) waited
    for the chunk stage to store them, for the embedding stage to find them missing; started here it overlaps
    the chunks' storing and the stage's own start (docs/BENCHMARKS.md, "Small passes: connections handed on"). A
    text whose vector is not used (its document's swap failed) is dropped with the stage's carry. A failure here
    only means the stage embeds those texts itself."""
    table = spaces.space_table(conn, embedder.model, embedder.dimension)
    if table is None or not chunks:
        return 0
    hashes = list({h for h, *_ in chunks})
    have = {r[0] for r in conn.execute(sql.SQL(
        "SELECT chunk_hash FROM {t} WHERE chunk_hash = ANY(%s) UNION ALL SELECT chunk_hash FROM recycled_vectors"
        " WHERE space_table = {name} AND chunk_hash = ANY(%s)").format(t=sql.Identifier(table),
                                                                       name=sql.Literal(table)), (hashes, hashes))}
    todo, seen = [], set(have)
    for row in chunks:
        if row[0] not in seen:
            seen.add(row[0])
            todo.append(row)
    from concurrent.futures import Future
    from concurrent.futures import wait as wait_futures

    key = (embedder.model, embedder.dimension)
    future: Future = Future()
    with _ahead_lock:
        if not todo or _ahead_texts.get(key, 0) + len(todo) > AHEAD_MAX_TEXTS:
            return 0
        _ahead_texts[key] = _ahead_texts.get(key, 0) + len(todo)
        queued = _ahead.setdefault(key, [])
        before = queued[-1] if queued else None
        queued.append(future)

    def run() -> None:
        if before is not None:     # one call at a time, in order: two at once held both calls' activations
            wait_futures([before])  # (a modify pass's peak RSS 232-242 MB against 230-232, the same wall time)
        if not future.set_running_or_notify_cancel():
            return
        try:
            import numpy as np

            result = embedder.embed_documents(_texts(todo), _token_counts(todo))
            vectors = np.asarray(result.vectors, dtype=np.float32).reshape(len(todo), embedder.dimension)
            future.set_result(({h: v for (h, *_), v in zip(todo, vectors)}, int(getattr(result, "tokens", 0) or 0)))
        except BaseException as exc:      # noqa: BLE001 - the stage reads it and embeds the texts itself
            future.set_exception(exc)

    threading.Thread(target=run, name="kb-encode-ahead", daemon=True).start()
    return len(todo)


def _take_ahead(embedder, carry: dict[str, np.ndarray]) -> int:
    """Wait for the vectors encoded ahead for this embedder's space and add them to the stage's carry; returns
    the tokens they cost."""
    with _ahead_lock:
        futures = _ahead.pop((embedder.model, embedder.dimension), [])
        _ahead_texts.pop((embedder.model, embedder.dimension), None)
    tokens = 0
    for future in futures:
        try:
            vectors, used = cancel.wait(future)
        except cancel.Cancelled:
            raise
        except Exception as exc:   # noqa: BLE001 - the model is called on these texts below, as without it
            log.warning("encoding ahead failed (%s): the embedding stage embeds those texts itself", exc)
            continue
        carry.update(vectors)
        tokens += used
    return tokens


# While following the chunk stage: how long to wait before looking again for a full batch
FOLLOW_POLL = 0.25


def embed_source(conn: psycopg.Connection, embedder, *, source_key: str | None, batch_rows: int = 500,
                 progress: Progress = null_progress, max_batches: int | None = None,
                 chunking_done: threading.Event | None = None) -> EmbedStats:
    """Embed the chunk hashes of a source (or of every source) that have no vector yet.

    The model call of part N (half a batch) runs in a worker thread while this thread reads part N+1; part N is
    written and committed while the call of part N+1 runs (WRITE_BEFORE_NEXT_CALL), so a crash loses at most one
    batch of model work, never a committed part. `max_batches` stops early (the kill-and-resume test
    simulates an interrupted run with it).

    `chunking_done`: the chunk stage runs beside this one (a first load, pipeline/stages.py) and sets it when
    it has finished. Until then only full batches are embedded, and a pass that runs out of missing hashes
    starts again from the first one (new chunks land at every hash); once it is set, a last pass from the
    first hash takes what is left, as a stage run after the chunk stage would.
    """
    from concurrent.futures import ThreadPoolExecutor

    started = time.perf_counter()
    table = spaces.ensure_space(conn, embedder.model, embedder.dimension)
    stats = EmbedStats(source=source_key, model=embedder.model, dimension=embedder.dimension)
    stats.restored = restore_recycled(conn, table)      # before counting: what comes back is not missing
    missing = count_missing(conn, table, source_key)
    # any index of the space, also one a background build is writing (or left INVALID): each maintains per row
    if missing >= LARGE_LOAD_MIN and (spaces.vector_index_exists(conn, table)
                                      or spaces.build_holder(conn, table) is not None):
        rows_now = conn.execute(sql.SQL("SELECT count(*) FROM {t}").format(t=sql.Identifier(table))).fetchone()[0]
        if missing >= LARGE_LOAD_FRACTION * rows_now:
            stats.vector_index_dropped = spaces.drop_vector_index(conn, table)
            log.info("%s: %d vectors to load into %d: HNSW index dropped, rebuilt by the search-index stage",
                     table, missing, rows_now)
    follow = chunking_done is not None
    progress.start(f"{source_key or 'all'}: embedding" + (" (beside chunking)" if follow else ""),
                   total=None if follow else missing)
    # Consistent but not durable to the last millisecond: a server crash can lose the newest batches, which
    # the next run re-embeds; it never leaves a half-written batch. Saves a WAL flush per batch.
    conn.execute("SET synchronous_commit = off")
    call_rows = batch_rows if WRITE_BEFORE_NEXT_CALL else max(1, batch_rows // 2)
    few = not follow and missing <= call_rows      # a small change: one call takes every missing text
    missing_query = _missing_query(table, source_key, call_rows, few=few)

    fetched = 0
    last_pass = False        # following: this pass began after the chunk stage had finished

    def next_rows(after: str) -> list:
        nonlocal fetched
        if max_batches is not None and fetched >= max_batches:
            return []
        if not follow and not missing:
            return []
        finished = follow and chunking_done.is_set()
        # keyset pagination: batch N+1 can be read before batch N is written (its hashes are all greater)
        with spaces.merge_anti_joins(conn) if few else nullcontext():
            rows = conn.execute(missing_query, (after, after)).fetchall()
        if follow and not finished and len(rows) < call_rows:
            return []        # following: the pass ends here; its part batch waits for the next pass
        fetched += 1 if rows else 0
        return rows

    def next_pass() -> list:
        """Following, with no call in flight: a pass from the first missing hash, once a full batch is there
        or the chunk stage has finished ([] when it has and nothing is missing)."""
        nonlocal last_pass
        while True:
            last_pass = chunking_done.is_set()
            stats.restored += restore_recycled(conn, table)     # chunks written meanwhile may have one
            rows = next_rows("")
            if rows or last_pass or (max_batches is not None and fetched >= max_batches):
                return rows
            cancel.check()
            chunking_done.wait(FOLLOW_POLL)     # woken at once when the chunk stage ends

    carry = _uncommitted.setdefault((embedder.model, embedder.dimension), {})
    stats.tokens += _take_ahead(embedder, carry)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kb-embed")
    cancelled = False
    call, in_flight = None, []
    try:
        rows = next_pass() if follow else next_rows("")
        call, in_flight = (pool.submit(_embed_with_carry, embedder, rows, carry), rows) if rows else (None, [])
        while rows:
            cancel.check()
            following = next_rows(rows[-1][0])                  # overlaps the call in flight
            result = cancel.wait(call)                          # no transaction is open while we wait
            _carry(carry, rows, result)                         # kept until its batch commits
            call, in_flight = None, []
            if following and not WRITE_BEFORE_NEXT_CALL:
                call, in_flight = pool.submit(_embed_with_carry, embedder, following, carry), following
            _write_batch(conn, table, rows, result, embedder.dimension)
            for chunk_hash, *_ in rows:
                carry.pop(chunk_hash, None)                     # committed: no longer ours to keep
            if following and WRITE_BEFORE_NEXT_CALL:
                call, in_flight = pool.submit(_embed_with_carry, embedder, following, carry), following
            stats.batches += 1
            stats.chunks_embedded += len(rows)
            stats.tokens += int(getattr(result, "tokens", 0) or 0)
            progress.advance(len(rows))
            rows = following
            if not rows and follow and not last_pass:
                rows = next_pass()              # nothing in flight: chunks written meanwhile come next
                if rows:
                    call, in_flight = pool.submit(_embed_with_carry, embedder, rows, carry), rows
    except cancel.Cancelled:
        cancelled = True      # the call in flight is abandoned: its result is never written
        raise
    except Exception:
        _keep_call_in_flight(call, in_flight, carry)
        if stats.vector_index_dropped and (spaces.active_space(conn) or (None,) * 3)[2] == table:
            _restore_index_after_failure(conn, table)
        raise
    finally:
        pool.shutdown(wait=not cancelled, cancel_futures=True)
        progress.done()
        if not conn.closed and not conn.broken:
            conn.execute("SET synchronous_commit = on")
    carry.clear()             # every batch fetched was written: anything left belongs to no chunk now
    if stats.chunks_embedded >= spaces.BULK_WRITE_ROWS:     # a large load: what the next passes read, settled
        spaces.settle_after_bulk_write(conn, table)
    # nothing was missing and the chunk stage had finished (this source's lock excludes other writers): none is
    # now; else count (a scan of every chunk, ~0.1 s on 55K)
    stats.missing_after = 0 if not follow and not missing else count_missing(conn, table, source_key)
    stats.seconds = round(time.perf_counter() - started, 3)
    return stats


def _restore_index_after_failure(conn: psycopg.Connection, table: str) -> None:
    """The space in use lost its index for a large load that failed: rebuild it now rather than leave
    queries on exact scans until the next successful run."""
    try:
        spaces.ensure_vector_index(conn, table)
    except Exception:   # the original error matters more; the search-index stage rebuilds it next time
        log.exception("could not rebuild the HNSW index of %s after a failed load", table)


def _write_batch(conn: psycopg.Connection, table: str, rows: list, result, dimension: int) -> None:
    import numpy as np
    vectors = np.asarray(result.vectors, dtype=np.float32)
    if vectors.shape != (len(rows), dimension):
        raise ValueError(f"embedder returned {vectors.shape}, expected ({len(rows)}, {dimension})")
    with conn.transaction():
        # Stage through a temp table: COPY is fast, and ON CONFLICT lets two runs that embedded the
        # same hash at once both commit.
        conn.execute("CREATE TEMP TABLE IF NOT EXISTS _vector_load (chunk_hash text, embedding vector)"
                     " ON COMMIT DELETE ROWS")
        with conn.cursor().copy("COPY _vector_load (chunk_hash, embedding) FROM STDIN WITH (FORMAT BINARY)") as copy:
            copy.set_types(["text", "vector"])
            for (chunk_hash, *_), vec in zip(rows, vectors):
                copy.write_row((chunk_hash, vec))
        conn.execute(sql.SQL(
            "INSERT INTO {t} (chunk_hash, embedding) SELECT chunk_hash, embedding FROM _vector_load"
            " ON CONFLICT (chunk_hash) DO NOTHING").format(t=sql.Identifier(table)))


# A vector no chunk uses is kept this long in recycled_vectors (migration 015): a revert or a branch switched back
# within it costs no model call.
RECYCLE_DAYS = 30


def remove_orphan_vectors(conn: psycopg.Connection) -> int:
    """Move vectors (in every space) whose chunk hash no chunk uses any more to recycled_vectors, and drop
    recycled ones older than RECYCLE_DAYS (or of a space that is gone). Returns how many left the spaces."""
    removed = 0
    for (table,) in conn.execute("SELECT table_name FROM embedding_spaces").fetchall():
        # one statement: a kill leaves the vector in one table or the other. The orphans found index-only first
        # (a DELETE with the anti-join inline read both heaps: PEPs 25 ms against 6 ms); the NOT EXISTS again so
        # a row changed meanwhile is judged as it is then
        with spaces.merge_anti_joins(conn):
            removed += conn.execute(sql.SQL(
                "WITH orphan AS MATERIALIZED ({orphans}),"
                " gone AS (DELETE FROM {t} e WHERE e.chunk_hash IN (SELECT chunk_hash FROM orphan) AND NOT EXISTS"
                " (SELECT 1 FROM chunks c WHERE c.chunk_hash = e.chunk_hash)"
                " RETURNING chunk_hash, embedding, created_at)"
                " INSERT INTO recycled_vectors (space_table, chunk_hash, embedding, created_at)"
                " SELECT {name}, chunk_hash, embedding, created_at FROM gone"
                " ON CONFLICT (space_table, chunk_hash) DO UPDATE SET embedding = EXCLUDED.embedding,"
                " created_at = EXCLUDED.created_at, removed_at = now()"
            ).format(t=sql.Identifier(table), name=sql.Literal(table),
                     orphans=spaces.vectors_without_chunk(table))).rowcount
    with conn.transaction():
        conn.execute("DELETE FROM recycled_vectors r WHERE r.removed_at < now() - make_interval(days => %s)"
                     " OR NOT EXISTS (SELECT 1 FROM embedding_spaces s WHERE s.table_name = r.space_table)",
                     (RECYCLE_DAYS,))
    return removed


def restore_recycled(conn: psycopg.Connection, table: str) -> int:
    """Bring back the recycled vectors of `table` whose chunk hash a chunk uses again; returns how many."""
    if conn.execute("SELECT NOT EXISTS (SELECT 1 FROM recycled_vectors WHERE space_table = %s)",
                    (table,)).fetchone()[0]:
        return 0
    with conn.transaction():
        return conn.execute(sql.SQL(
            "WITH back AS (DELETE FROM recycled_vectors r WHERE r.space_table = {name}"
            " AND EXISTS (SELECT 1 FROM chunks c WHERE c.chunk_hash = r.chunk_hash)"
            " RETURNING chunk_hash, embedding, created_at)"
            " INSERT INTO {t} (chunk_hash, embedding, created_at) SELECT chunk_hash, embedding, created_at FROM back"
            " ON CONFLICT (chunk_hash) DO NOTHING"
        ).format(t=sql.Identifier(table), name=sql.Literal(table))).rowcount
