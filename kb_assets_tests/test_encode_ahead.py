"""A small pass's chunk stage hands the texts of the chunks it cuts to the embedder at once
(embeddings.encode_ahead), and the embedding stage that follows takes those vectors instead of calling the model:
the same vectors, every new text encoded once, nothing encoded ahead for a rename (its texts have vectors), and a
failure ahead only means the stage embeds the texts itself. Real embedded PostgreSQL; the fixed-cost stand-in
embedder (deterministic vectors per text) with a spy on its calls."""
from __future__ import annotations

import logging
import threading
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from psycopg import sql

from kb_assets.embedding import FixedCostEmbedder
from kb_assets.pipeline import embeddings, guard, index_sources, stages
from kb_assets.store import idle_connections, spaces

from corpus_support import notes_source

class Spy(FixedCostEmbedder):
    """Records each call's thread and texts; `fail_ahead`: the calls made ahead raise."""

    def __init__(self, fail_ahead: bool = False):
        super().__init__(cost_per_text=0.0)
        self.calls: list[tuple[str, list[str]]] = []
        self.fail_ahead = fail_ahead

    def embed_documents(self, texts, token_counts=None):
        name = threading.current_thread().name
        self.calls.append((name, list(texts)))
        if self.fail_ahead and name == "kb-encode-ahead":
            raise RuntimeError("the model is away")
        return super().embed_documents(texts, token_counts)

    def ahead(self) -> list[str]:
        return [t for name, texts in self.calls if name == "kb-encode-ahead" for t in texts]

    def in_stage(self) -> list[str]:
        return [t for name, texts in self.calls if name != "kb-encode-ahead" for t in texts]


@pytest.fixture
def corpus(tmp_path: Path, db_url, conn):
    cfg, root = notes_source(tmp_path, db_url, notes=6, parts=3)
    index_sources(cfg, conn, embedder=FixedCostEmbedder(cost_per_text=0.0))
    idle_connections.close_kept()
    yield cfg, root
    idle_connections.close_kept()


def _small_pass(cfg, embedder) -> embeddings.EmbedStats:
    run_stage = partial(guard.run_stage, cfg)
    stages.documents(cfg, "docs", run_stage)
    stages.chunks("docs", embedder, run_stage, encode_ahead=True)
    return stages.embeddings(cfg, "docs", embedder, run_stage)


def _texts_without_vector(conn, table: str) -> set[str]:
    return {r[0] for r in conn.execute(sql.SQL(
        "SELECT CASE WHEN c.heading <> '' THEN c.heading || E'\\n' || c.text ELSE c.text END FROM chunks c"
        " WHERE NOT EXISTS (SELECT 1 FROM {t} e WHERE e.chunk_hash = c.chunk_hash)").format(t=sql.Identifier(table)))}


def _assert_every_vector_is_its_texts(conn, table: str, embedder) -> None:
    rows = conn.execute(sql.SQL(
        "SELECT CASE WHEN c.heading <> '' THEN c.heading || E'\\n' || c.text ELSE c.text END, e.embedding"
        " FROM chunks c JOIN {t} e ON e.chunk_hash = c.chunk_hash").format(t=sql.Identifier(table))).fetchall()
    assert rows and len(rows) == conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
    for text, vec in rows:
        assert np.allclose(vec.to_numpy(), embedder.vector(text), atol=1e-6)


def test_a_small_change_is_encoded_ahead_once_and_the_stage_takes_its_vectors(corpus, conn):
    cfg, root = corpus
    for i in (1, 4):
        path = root / f"note-{i}.md"
        path.write_text(path.read_text(encoding="utf-8") + f"\n\n## Later {i}\n\nA paragraph added {i}.\n",
                        encoding="utf-8")
    spy = Spy()
    table = spaces.space_table(conn, spy.model, spy.dimension)
    stats = _small_pass(cfg, spy)
    assert spy.ahead() and not spy.in_stage()                 # the model ran ahead only
    assert len(spy.ahead()) == len(set(spy.ahead())) == stats.chunks_embedded
    assert sum("A paragraph added" in t for t in spy.ahead()) == 2           # the two new sections
    assert _texts_without_vector(conn, table) == set()
    _assert_every_vector_is_its_texts(conn, table, spy)
    assert not embeddings._ahead                               # taken by the stage


def test_a_rename_encodes_nothing_ahead(corpus, conn):
    cfg, root = corpus
    (root / "note-2.md").rename(root / "note-2-renamed.md")
    spy = Spy()
    stats = _small_pass(cfg, spy)
    assert spy.calls == [] and stats.chunks_embedded == 0


def test_a_failure_ahead_leaves_the_texts_to_the_stage(corpus, conn, caplog):
    cfg, root = corpus
    path = root / "note-3.md"
    path.write_text(path.read_text(encoding="utf-8") + "\n\n## Later\n\nOne more paragraph.\n", encoding="utf-8")
    spy = Spy(fail_ahead=True)
    table = spaces.space_table(conn, spy.model, spy.dimension)
    with caplog.at_level(logging.WARNING, logger="kb_assets"):
        stats = _small_pass(cfg, spy)
    assert spy.ahead() and sorted(spy.in_stage()) == sorted(spy.ahead())
    assert stats.chunks_embedded == len(spy.ahead())
    assert any("encoding ahead failed" in r.getMessage() for r in caplog.records)
    _assert_every_vector_is_its_texts(conn, table, spy)


def test_past_the_limit_the_stage_embeds_the_texts_itself(corpus, conn, monkeypatch):
    cfg, root = corpus
    monkeypatch.setattr(embeddings, "AHEAD_MAX_TEXTS", 1)
    for i in range(6):
        path = root / f"note-{i}.md"
        path.write_text(path.read_text(encoding="utf-8") + f"\n\n## Later\n\nParagraph {i}.\n", encoding="utf-8")
    spy = Spy()
    table = spaces.space_table(conn, spy.model, spy.dimension)
    stats = _small_pass(cfg, spy)
    assert spy.ahead() == [] and len(spy.in_stage()) == stats.chunks_embedded > 1
    _assert_every_vector_is_its_texts(conn, table, spy)
