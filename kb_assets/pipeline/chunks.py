"""Stage 2: cut documents whose text changed into chunks, and swap them in one short transaction each.

A document's old chunks stay visible until its new chunks replace them (invariant 3).
"""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import asdict, dataclass
from itertools import islice
from typing import Callable

import psycopg

from kb_assets.models import SourceDocument
from kb_assets.pipeline import cancel
from kb_assets.pipeline.progress import Progress, null_progress
from kb_assets.pipeline.side_by_side import prompt_gil_handoffs
from kb_assets.store import spaces

log = logging.getLogger(__name__)

READ_BATCH = 100   # documents fetched per query (bounded memory)
CUT_AHEAD = 3      # batches read and being cut while one is swapped in (more: faster, ~1.5 MB each)
_COPY_WRITE = 128 * 1024


@dataclass
class ChunkStats:
    source: str
    documents_chunked: int = 0
    chunks_written: int = 0
    chunks_removed: int = 0
    chunks_kept: int = 0          # chunks of a re-cut document identical to one it had: left in place
    chunks_total: int = 0
    errors: int = 0
    seconds: float = 0.0

    def as_metadata(self) -> dict:
        return asdict(self)


WARM_UP_MIN_DOCUMENTS = 100


def first_load_ahead(conn: psycopg.Connection, source_key: str) -> bool:
    """Whether most of a source (≥ WARM_UP_MIN_DOCUMENTS documents) has never been chunked: a first run, whose
    embedding stage will load the model. A re-run that changed, renamed or deleted a few files says False
    (its few new chunks, if any, take the torch-free encoder)."""
    never, active = conn.execute(
        "SELECT count(*) FILTER (WHERE chunked_hash IS NULL), count(*) FROM documents"
        " WHERE source_key = %s AND status = 'active'", (source_key,)).fetchone()
    return never >= WARM_UP_MIN_DOCUMENTS and 2 * never >= active


def chunk_source(conn: psycopg.Connection, source_key: str, *, max_tokens: int | Callable[[], int],
                 count_tokens: Callable[[list[str]], list[int]] | None,
                 overlap_tokens: int = 32, progress: Progress = null_progress,
                 on_cut: OnCut | None = None) -> ChunkStats:
    """Cut every active document of a source whose text changed since its chunks were cut, and swap them in.

    `max_tokens` may be a function, called only when there is something to cut (a local model's window needs
    its tokenizer loaded: a pass that cuts nothing, a delete, should not pay for that).

    Batches N+1, N+2 are cut (pure Python) in a worker thread while this thread swaps batch N in: the server's
    share of a swap (the generated tsvector and its GIN index) runs on the other core meanwhile.
    Only this thread touches the connection; each batch's swap is one short transaction of its own.

    `on_cut(conn, chunks)`: called with each batch's chunks once cut, before they are stored (a small pass
    starts embedding the new ones there: embeddings.encode_ahead).
    """
    from concurrent.futures import ThreadPoolExecutor

    started = time.perf_counter()
    stats = ChunkStats(source=source_key)
    todo = [r[0] for r in conn.execute(
        "SELECT id FROM documents WHERE source_key = %s AND status = 'active'"
        " AND chunked_hash IS DISTINCT FROM content_hash ORDER BY id", (source_key,))]
    progress.start(f"{source_key}: chunking", total=len(todo))
    # a small first batch: nothing runs beside its cut, the server starts on its swap sooner
    first = max(1, READ_BATCH // 10)
    batches = [todo[:first]] + [todo[i:i + READ_BATCH] for i in range(first, len(todo), READ_BATCH)] if todo else []
    if todo and callable(max_tokens):
        max_tokens = max_tokens()

    def read(ids: list[int]) -> list:
        # in document order: chunk ids (keyword search breaks ties on them) follow it, not the query plan
        return conn.execute(
            "SELECT id, path, kind, title, text, meta, content_hash, blocks FROM documents"
            " WHERE id = ANY(%s) AND status = 'active' ORDER BY id", (ids,)).fetchall()

    encoding = conn.info.encoding

    def cut(rows: list) -> _Batch:
        return _cut_batch(rows, max_tokens=max_tokens, overlap_tokens=overlap_tokens, count_tokens=count_tokens,
                          encoding=encoding, keep_texts=on_cut is not None)

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kb-chunk")
    try:
        with prompt_gil_handoffs():
            # up to CUT_AHEAD batches read and handed to the worker: batches vary in cost (a file of big
            # classes, a file of prose), and with one the faster side waits on every slow batch of the other
            pending: deque = deque()            # (future of a batch's cut, its number of documents)
            queue = iter(batches)
            for ids in islice(queue, CUT_AHEAD):
                pending.append((pool.submit(cut, read(ids)), len(ids)))
            while pending:
                cancel.check()     # between batches: each swap is its own transaction
                job, n = pending.popleft()
                batch = job.result()
                ids = next(queue, None)
                if ids is not None:
                    pending.append((pool.submit(cut, read(ids)), len(ids)))
                if on_cut is not None and batch.texts:
                    on_cut(conn, batch.texts)
                _store(conn, batch, stats)                   # overlaps the cutting of the next batches
                progress.advance(n)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)   # on an error, batches not started are dropped
    progress.done()
    if stats.chunks_written >= spaces.BULK_WRITE_ROWS:      # a first load: what the next passes read, settled
        spaces.settle_after_bulk_write(conn, "chunks")
    stats.chunks_total = conn.execute(
        "SELECT count(*) FROM chunks c JOIN documents d ON d.id = c.document_id WHERE d.source_key = %s",
        (source_key,)).fetchone()[0]
    stats.seconds = round(time.perf_counter() - started, 3)
    return stats


# What identifies a stored chunk row: equal keys, equal rows (the hash covers the heading and the text)
ChunkKey = tuple[int, str, int, int, int]       # (ordinal, chunk hash, start line, end line, token count)


@dataclass
class _Batch:
    # (document id, content hash it was cut from, COPY rows (one line per chunk), each chunk's key in order)
    cut: list[tuple[int, str, bytes, list[ChunkKey]]]
    errors: list[tuple[int, str, str]]          # (document id, path, "Error: message")
    # (chunk hash, heading, text, token count) of every chunk cut, for `on_cut` (None when nobody asked)
    texts: list[tuple[str, str, str, int]] | None = None


# What chunk_source hands `on_cut`, batch by batch, before it stores them: the chunk stage's connection and
# the batch's chunks as (chunk hash, heading, text, token count)
OnCut = Callable[[psycopg.Connection, list[tuple[str, str, str, int]]], None]


# COPY's text format, escaped as psycopg's write_row escapes it (backslash first)
_COPY_ESCAPES = (("\\", "\\\\"), ("\b", "\\b"), ("\t", "\\t"), ("\n", "\\n"), ("\v", "\\v"), ("\f", "\\f"),
                 ("\r", "\\r"))


def _copy_field(value: str) -> str:
    value = value.replace("\x00", "")      # PostgreSQL text cannot hold NUL
    for char, escaped in _COPY_ESCAPES:
        value = value.replace(char, escaped)
    return value


def _cut_batch(rows: list, *, max_tokens: int, overlap_tokens: int,
               count_tokens: Callable[[list[str]], list[int]] | None, encoding: str,
               keep_texts: bool = False) -> _Batch:
    """Chunk a batch of document rows (no database access: runs in the worker thread). Each document's chunks
    become its COPY rows, already encoded: the thread that holds the connection only sends them, in a few large
    writes instead of a write per row (each write may wait for that thread's turn at the GIL)."""
    from kb_assets.chunking import chunk_document

    out = _Batch([], [], [] if keep_texts else None)
    for i, (doc_id, path, kind, title, text, meta, content_hash, blocks) in enumerate(rows):
        rows[i] = None                      # the text is not kept once cut (batches wait in a queue)
        doc = SourceDocument(path=path, kind=kind, title=title, text=text or "", meta=meta or {})
        try:
            chunks = chunk_document(doc, max_tokens=max_tokens, overlap_tokens=overlap_tokens,
                                    count_tokens=count_tokens,
                                    blocks=blocks if isinstance(blocks, dict) else None)
            data = "".join(f"{doc_id}\t{c.ordinal}\t{_copy_field(c.heading)}\t{c.start_line}\t{c.end_line}\t"
                           f"{c.token_count}\t{c.chunk_hash}\t{_copy_field(c.text)}\n" for c in chunks)
            encoded = data.encode(encoding)
        except Exception as exc:
            log.exception("chunking %s failed", path)
            out.errors.append((doc_id, path, f"{type(exc).__name__}: {exc}"[:500]))
            continue
        out.cut.append((doc_id, content_hash, encoded,
                        [(c.ordinal, c.chunk_hash, c.start_line, c.end_line, c.token_count) for c in chunks]))
        if out.texts is not None:
            out.texts.extend((c.chunk_hash, c.heading, c.text, c.token_count) for c in chunks)
    return out


# What one document's chunks can raise when stored (a value the server refuses, e.g. a tsvector over its
# size limit); anything else (the connection lost) stops the run.
_ROW_ERRORS = (psycopg.DataError, psycopg.errors.ProgramLimitExceeded, UnicodeError, ValueError)


def _store(conn: psycopg.Connection, batch: _Batch, stats: ChunkStats) -> None:
    for doc_id, _path, message in batch.errors:
        _skip_document(conn, doc_id, message, stats)
    if not batch.cut:
        return
    try:
        _swap(conn, batch.cut, stats)
        return
    except _ROW_ERRORS as exc:
        log.warning("storing a batch of chunks failed (%s): storing its documents one by one", exc)
    for one in batch.cut:     # the batch rolled back as a whole: the others go in without the bad one
        try:
            _swap(conn, [one], stats)
        except _ROW_ERRORS as exc:
            _skip_document(conn, one[0], f"cannot store its chunks: {type(exc).__name__}: {exc}"[:500], stats)


def _skip_document(conn: psycopg.Connection, doc_id: int, message: str, stats: ChunkStats) -> None:
    """A document that cannot be cut or stored is skipped with the reason (kb status shows it), like a file
    that cannot be read; the run goes on. Its chunks go (a skipped document has none). The error also stays
    in meta.chunk_error. A changed file is read again and gets a new try."""
    stats.errors += 1
    with conn.transaction():
        conn.execute("DELETE FROM chunks WHERE document_id = %s", (doc_id,))
        conn.execute(
            "UPDATE documents SET status = 'skipped', skip_reason = 'chunk-error', skip_detail = %s,"
            " content_hash = NULL, chunked_hash = NULL, text = NULL, updated_at = now(),"
            " meta = meta || jsonb_build_object('chunk_error', %s::text) WHERE id = %s",
            (message[:1000], message, doc_id))


def _swap(conn: psycopg.Connection, cut: list[tuple[int, str, bytes, list[ChunkKey]]], stats: ChunkStats) -> None:
    """Replace the chunks of a batch of documents in one short transaction: each document's old chunks stay
    visible until its new ones are committed. Only documents still at the version that was cut are swapped
    (a concurrent run may have moved on).

    A chunk the document already had, unchanged (same ordinal, text, heading, lines and count), stays as it is:
    a paragraph appended to a long document rewrites its last chunk, not every chunk. Writing a chunk is most of
    a small pass's database work (its tsvector, the GIN index, the keyword statistics' deltas; ~0.2 s for the
    ~900 chunks of 30 synthetic documents against ~10 ms for the 30 that changed)."""
    with conn.transaction():
        ok = {r[0] for r in conn.execute(
            "UPDATE documents d SET chunked_hash = d.content_hash FROM unnest(%s::bigint[], %s::text[]) AS v(id, h)"
            " WHERE d.id = v.id AND d.content_hash = v.h RETURNING d.id",
            ([c[0] for c in cut], [c[1] for c in cut]))}
        if not ok:
            return
        stored: dict[int, dict[ChunkKey, int]] = {}
        for chunk_id, doc_id, *key in conn.execute(
                "SELECT id, document_id, ordinal, chunk_hash, start_line, end_line, token_count FROM chunks"
                " WHERE document_id = ANY(%s)", (list(ok),)):
            stored.setdefault(doc_id, {})[tuple(key)] = chunk_id
        swapped = [c for c in cut if c[0] in ok]
        gone: list[int] = []
        rows: list[bytes] = []
        for doc_id, _hash, encoded, keys in swapped:
            old = stored.get(doc_id)
            lines = encoded.split(b"\n") if old else []   # one line per chunk: COPY's text escapes newlines
            if not old or len(lines) != len(keys) + 1:
                # first cut of this document (a first load), or rows that are not one line per chunk: every
                # old row goes, every new one goes in
                gone.extend((old or {}).values())
                rows.append(encoded)
                stats.chunks_written += len(keys)
                continue
            new = set(keys)
            gone.extend(chunk_id for key, chunk_id in old.items() if key not in new)
            for key, line in zip(keys, lines):
                if key in old:
                    stats.chunks_kept += 1
                else:
                    rows.append(line + b"\n")
                    stats.chunks_written += 1
        if gone:     # first: a new chunk may take the ordinal of one that goes
            stats.chunks_removed += conn.execute("DELETE FROM chunks WHERE id = ANY(%s)", (gone,)).rowcount
        if rows:
            with conn.cursor().copy(
                "COPY chunks (document_id, ordinal, heading, start_line, end_line, token_count, chunk_hash, text)"
                " FROM STDIN"
            ) as copy:
                group: list[bytes] = []
                size = 0
                for row in rows:            # writes of ~128 KB (psycopg's largest), not one copy of the batch
                    group.append(row)
                    size += len(row)
                    if size >= _COPY_WRITE:
                        copy.write(b"".join(group))
                        group, size = [], 0
                if group:
                    copy.write(b"".join(group))
        stats.documents_chunked += len(swapped)
