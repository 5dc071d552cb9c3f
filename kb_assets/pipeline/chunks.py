"""Stage 2: cut documents whose text changed into chunks, and swap them in one short transaction each.

A document's old chunks stay visible until its new chunks replace them (invariant 3).
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from typing import Callable

import psycopg

from kb_assets.models import SourceDocument
from kb_assets.pipeline.progress import Progress, null_progress

log = logging.getLogger(__name__)

READ_BATCH = 100   # documents fetched per query (bounded memory)


@dataclass
class ChunkStats:
    source: str
    documents_chunked: int = 0
    chunks_written: int = 0
    chunks_removed: int = 0
    chunks_total: int = 0
    errors: int = 0
    seconds: float = 0.0

    def as_metadata(self) -> dict:
        return asdict(self)


def chunk_source(conn: psycopg.Connection, source_key: str, *, max_tokens: int,
                 count_tokens: Callable[[list[str]], list[int]] | None,
                 overlap_tokens: int = 32, progress: Progress = null_progress) -> ChunkStats:
    from kb_assets.chunking import chunk_document

    started = time.perf_counter()
    stats = ChunkStats(source=source_key)
    todo = [r[0] for r in conn.execute(
        "SELECT id FROM documents WHERE source_key = %s AND status = 'active'"
        " AND chunked_hash IS DISTINCT FROM content_hash ORDER BY id", (source_key,))]
    progress.start(f"{source_key}: chunking", total=len(todo))
    for i in range(0, len(todo), READ_BATCH):
        ids = todo[i:i + READ_BATCH]
        rows = conn.execute(
            "SELECT id, path, kind, title, text, meta, content_hash FROM documents"
            " WHERE id = ANY(%s) AND status = 'active'", (ids,)).fetchall()
        cut: list[tuple[int, str, list]] = []
        for doc_id, path, kind, title, text, meta, content_hash in rows:
            doc = SourceDocument(path=path, kind=kind, title=title, text=text or "", meta=meta or {})
            try:
                chunks = chunk_document(doc, max_tokens=max_tokens, overlap_tokens=overlap_tokens,
                                        count_tokens=count_tokens)
            except Exception as exc:
                log.exception("chunking %s failed", path)
                stats.errors += 1
                conn.execute(
                    "UPDATE documents SET meta = meta || jsonb_build_object('chunk_error', %s::text) WHERE id = %s",
                    (f"{type(exc).__name__}: {exc}"[:500], doc_id))
                continue
            cut.append((doc_id, content_hash, chunks))
        if cut:
            _swap(conn, cut, stats)
        progress.advance(len(ids))
    progress.done()
    stats.chunks_total = conn.execute(
        "SELECT count(*) FROM chunks c JOIN documents d ON d.id = c.document_id WHERE d.source_key = %s",
        (source_key,)).fetchone()[0]
    stats.seconds = round(time.perf_counter() - started, 3)
    return stats


def _swap(conn: psycopg.Connection, cut: list[tuple[int, str, list]], stats: ChunkStats) -> None:
    """Replace the chunks of a batch of documents in one short transaction: each document's old chunks stay
    visible until its new ones are committed. Only documents still at the version that was cut are swapped
    (a concurrent run may have moved on)."""
    with conn.transaction():
        ok = {r[0] for r in conn.execute(
            "UPDATE documents d SET chunked_hash = d.content_hash FROM unnest(%s::bigint[], %s::text[]) AS v(id, h)"
            " WHERE d.id = v.id AND d.content_hash = v.h RETURNING d.id",
            ([c[0] for c in cut], [c[1] for c in cut]))}
        if not ok:
            return
        stats.chunks_removed += conn.execute("DELETE FROM chunks WHERE document_id = ANY(%s)", (list(ok),)).rowcount
        with conn.cursor().copy(
            "COPY chunks (document_id, ordinal, heading, start_line, end_line, token_count, chunk_hash, text)"
            " FROM STDIN"
        ) as copy:
            for doc_id, _, chunks in cut:
                if doc_id not in ok:
                    continue
                for c in chunks:
                    copy.write_row((doc_id, c.ordinal, c.heading.replace("\x00", ""), c.start_line, c.end_line,
                                    c.token_count, c.chunk_hash, c.text.replace("\x00", "")))
                stats.documents_chunked += 1
                stats.chunks_written += len(chunks)
