"""A stage that writes many rows leaves its table vacuumed and analysed (spaces.settle_after_bulk_write): the
small pass that follows a first load then finds the chunk and vector pages all-visible, so its anti-joins stay
index-only, with row estimates of the whole table. Small writes leave that to autovacuum; a table another
session holds is skipped, never waited for. Real embedded PostgreSQL; the fixed-cost stand-in embedder."""
from __future__ import annotations

from pathlib import Path

from kb_assets.embedding import FixedCostEmbedder
from kb_assets.pipeline import index_sources
from kb_assets.store import spaces
from kb_assets.store.db import connect

from corpus_support import notes_source


def _vacuums(conn, table: str) -> tuple[int, int]:
    """(manual VACUUMs, manual ANALYZEs) of `table` so far."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return conn.execute("SELECT vacuum_count, analyze_count FROM pg_stat_user_tables WHERE relname = %s",
                        (table,)).fetchone()


def _all_visible(conn, table: str) -> bool:
    pages, visible = conn.execute("SELECT relpages, relallvisible FROM pg_class WHERE relname = %s",
                                  (table,)).fetchone()
    return pages > 0 and visible == pages


def test_a_bulk_write_leaves_chunks_and_vectors_vacuumed_a_small_one_does_not(tmp_path: Path, db_url, conn,
                                                                              monkeypatch):
    monkeypatch.setattr(spaces, "BULK_WRITE_ROWS", 12)       # the corpus below writes 20 chunks
    cfg, root = notes_source(tmp_path, db_url, notes=5, parts=4)
    embedder = FixedCostEmbedder(cost_per_text=0.0)
    run = index_sources(cfg, conn, embedder=embedder)["docs"]
    table = spaces.space_table(conn, embedder.model, embedder.dimension)
    assert run.chunks.chunks_written >= 12 and run.embeddings.chunks_embedded >= 12
    for t in ("chunks", table):
        assert _vacuums(conn, t) == (1, 1), t
        assert _all_visible(conn, t), t

    # a small change: a few rows, left to autovacuum
    (root / "note-0.md").write_text((root / "note-0.md").read_text(encoding="utf-8") + "\n\nOne more line.\n",
                                    encoding="utf-8")
    run = index_sources(cfg, conn, embedder=embedder)["docs"]
    assert 0 < run.chunks.chunks_written < 12 and 0 < run.embeddings.chunks_embedded < 12
    for t in ("chunks", table):
        assert _vacuums(conn, t) == (1, 1), t


def test_a_table_another_session_holds_is_skipped_not_waited_for(db_url, conn):
    conn.execute("SET statement_timeout = '20s'")        # waiting would fail the test here, not hang it
    with connect(db_url, autocommit=False) as holder:    # a background HNSW build holds this lock as long
        holder.execute("LOCK TABLE chunks IN SHARE UPDATE EXCLUSIVE MODE")
        assert spaces.settle_after_bulk_write(conn, "chunks") is False
        assert _vacuums(conn, "chunks") == (0, 0)
    assert spaces.settle_after_bulk_write(conn, "chunks") is True
    assert _vacuums(conn, "chunks") == (1, 1)
