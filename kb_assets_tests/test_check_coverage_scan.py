"""The coverage checks from one shared scan (health.chunk_coverage, what a small `kb index` without Dagster
uses) report exactly what each check finds on its own, on a sound index and on one damaged in every way they
look for: a lost vector, a chunk with words but no keywords, a chunk left behind by a deleted document, a
vector of no chunk. Real embedded PostgreSQL; the fixed-cost stand-in embedder (no model needed here)."""
from __future__ import annotations

from pathlib import Path

from psycopg import sql

from kb_assets.config import parse_config
from kb_assets.embedding import FixedCostEmbedder
from kb_assets.pipeline import index_sources
from kb_assets.pipeline.embeddings import _missing_query, count_missing, remove_orphan_vectors
from kb_assets.store import checks, health, spaces
from kb_assets.store.status import source_status

PARA = "The queue keeps its work in PostgreSQL and takes batches with skip locked; retries back off. "


def _outcomes(conn, embedder, sources, coverage):
    return [(c.name, c.passed, c.metadata, c.tables) for c in (
        checks.every_chunk_embedded(conn, embedder.model, embedder.dimension, coverage=coverage),
        checks.vector_keyword_parity(conn, sources, coverage=coverage),
        checks.no_orphans(conn, coverage=coverage))]


def test_one_shared_scan_reports_what_each_check_finds_alone(tmp_path: Path, db_url, conn):
    root = tmp_path / "docs"
    root.mkdir()
    for i in range(4):
        (root / f"note-{i}.md").write_text(f"# Note {i}\n\n" + "\n\n".join(
            f"## Part {j}\n\n{PARA * 3} Topic {i}-{j}." for j in range(3)), encoding="utf-8")
    # the same text in two documents: distinct chunk texts are fewer than chunks
    (root / "copy.md").write_text((root / "note-0.md").read_text(encoding="utf-8"), encoding="utf-8")
    cfg = parse_config({"database_url": db_url, "sources": [
        {"key": "docs", "kind": "doc", "root": str(root), "include": ["*.md"]},
        {"key": "empty", "kind": "doc", "root": str(root), "include": ["none/*.md"]}]},
        path=str(tmp_path / "kb.yaml"), base_dir=str(tmp_path))
    embedder = FixedCostEmbedder(cost_per_text=0.0)
    index_sources(cfg, conn, embedder=embedder, source_keys=["docs"])
    table = spaces.space_table(conn, embedder.model, embedder.dimension)

    def compare() -> list:
        shared = _outcomes(conn, embedder, cfg.sources, health.chunk_coverage(conn, table))
        assert shared == _outcomes(conn, embedder, cfg.sources, None)      # each check's own scan
        # the figures are those of the checks' former queries, one scan each
        total, missing = conn.execute(
            f'SELECT count(DISTINCT c.chunk_hash), count(DISTINCT c.chunk_hash) FILTER (WHERE NOT EXISTS'
            f' (SELECT 1 FROM "{table}" e WHERE e.chunk_hash = c.chunk_hash)) FROM chunks c').fetchone()
        assert (shared[0][2]["chunk_hashes"], shared[0][2]["missing"]) == (total, missing)
        per_source = [dict(zip(("source", "chunks", "missing"), r)) for r in conn.execute(
            "SELECT d.source_key, count(*), count(*) FILTER (WHERE NOT EXISTS"
            f' (SELECT 1 FROM "{table}" e WHERE e.chunk_hash = c.chunk_hash))'
            " FROM chunks c JOIN documents d ON d.id = c.document_id WHERE d.status = 'active'"
            " GROUP BY 1 ORDER BY 1")]
        assert shared[0][3]["sources"][0] == per_source
        assert shared[2][2]["orphan_chunks"] == conn.execute(
            "SELECT count(*) FROM chunks c LEFT JOIN documents d ON d.id = c.document_id"
            " WHERE d.id IS NULL OR d.status <> 'active'").fetchone()[0]
        per_source = []
        for s in cfg.sources:       # vector_keyword_parity's former queries, per source
            n, no_kw = conn.execute(
                "SELECT count(*), count(*) FILTER (WHERE c.tsv IS NULL OR (c.tsv = ''::tsvector"
                " AND c.text ~ '[[:alpha:]]{2}')) FROM chunks c JOIN documents d ON d.id = c.document_id"
                " WHERE d.source_key = %s AND d.status = 'active'", (s.key,)).fetchone()
            no_vec = conn.execute(
                "SELECT count(*) FROM chunks c JOIN documents d ON d.id = c.document_id"
                " WHERE d.source_key = %s AND d.status = 'active'"
                f' AND NOT EXISTS (SELECT 1 FROM "{table}" e WHERE e.chunk_hash = c.chunk_hash)',
                (s.key,)).fetchone()[0]
            per_source.append({"source": s.key, "active_space": f"{embedder.model}/{embedder.dimension}",
                               "chunks": n, "without_vector": no_vec, "without_keywords": no_kw})
        assert shared[1][3]["sources"][0] == per_source == [health.parity(conn, s.key) for s in cfg.sources]
        return shared

    sound = compare()
    assert [passed for _n, passed, _m, _t in sound] == [True, True, True]
    assert sound[0][2]["chunk_hashes"] < sound[1][2]["chunks"]      # copy.md shares note-0's texts

    with conn.transaction():
        one, two, three = [r[0] for r in conn.execute(
            "SELECT c.chunk_hash FROM chunks c JOIN documents d ON d.id = c.document_id"
            " WHERE d.path LIKE 'note-%%' ORDER BY c.id LIMIT 3")]
        conn.execute(f'DELETE FROM "{table}" WHERE chunk_hash = %s', (one,))                   # a lost vector
        # words, but only stop words: the generated keyword vector is empty
        conn.execute("UPDATE chunks SET heading = '', text = 'and the of it is' WHERE chunk_hash = %s", (two,))
        conn.execute("UPDATE documents SET status = 'skipped' WHERE path = 'note-3.md'")     # chunks left behind
        conn.execute(f'INSERT INTO "{table}" (chunk_hash, embedding) SELECT %s, embedding FROM "{table}"'
                     f" WHERE chunk_hash = %s", ("f" * 64, three))                              # a vector of nothing
    damaged = compare()
    assert [passed for _n, passed, _m, _t in damaged] == [False, False, False]
    assert damaged[0][2]["missing"] == 1
    assert damaged[1][2]["without_vector"] >= 1 and damaged[1][2]["without_keywords"] >= 1
    assert damaged[2][2]["orphan_chunks"] > 0 and damaged[2][2]["orphan_vectors"] == 1

    # the small pass's other counts of the same anti-join (spaces.hashes_without_vector, index-only) against the
    # queries they replaced, on the damaged index: the embedding stage's, pending_work's and `kb status`'s
    for key in ("docs", "empty", None):
        scope = "" if key is None else " AND c.document_id IN (SELECT id FROM documents WHERE source_key = %s)"
        assert count_missing(conn, table, key) == conn.execute(
            "SELECT count(DISTINCT c.chunk_hash) FROM chunks c"
            f' WHERE NOT EXISTS (SELECT 1 FROM "{table}" e WHERE e.chunk_hash = c.chunk_hash){scope}',
            () if key is None else (key,)).fetchone()[0]
    for key, after in (("docs", ""), ("empty", ""), (None, ""), ("docs", one)):   # the embedding stage's rows
        with spaces.merge_anti_joins(conn):
            few = conn.execute(_missing_query(table, key, 100, few=True), (after, after)).fetchall()
        assert few == conn.execute(_missing_query(table, key, 100), (after, after)).fetchall()
        assert len(few) == (1 if key != "empty" and after < one else 0)
    for key in ("docs", "empty"):
        assert spaces.chunks_without_vector(conn, table, key) == conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE NOT EXISTS"
            f' (SELECT 1 FROM "{table}" e WHERE e.chunk_hash = c.chunk_hash))'
            " FROM chunks c JOIN documents d ON d.id = c.document_id WHERE d.source_key = %s", (key,)).fetchone()
    assert spaces.chunks_without_vector(conn, table, "docs")[1] >= 1
    status = {s["source"]: s for s in source_status(conn)}
    assert status["docs"]["embedded"] == conn.execute(
        "SELECT count(*) FROM chunks c JOIN documents d ON d.id = c.document_id WHERE d.source_key = 'docs'"
        f' AND EXISTS (SELECT 1 FROM "{table}" e WHERE e.chunk_hash = c.chunk_hash)').fetchone()[0]
    # the vector of nothing moves to the recycled vectors, and nothing else does
    kept = conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
    assert remove_orphan_vectors(conn) == 1
    assert conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0] == kept - 1
    assert conn.execute("SELECT chunk_hash FROM recycled_vectors").fetchall() == [("f" * 64,)]


def test_the_keyword_count_is_answered_by_the_partial_index(conn):
    """Migration 016's partial index has the keyword check's condition word for word: the count of chunks keyword
    search cannot find reads the index, not every chunk (health.chunk_coverage)."""
    conn.execute("SET enable_seqscan = off")
    plan = "\n".join(r[0] for r in conn.execute(
        f"EXPLAIN SELECT c.document_id FROM chunks c WHERE {health._NO_KEYWORDS}"))
    assert "chunks_without_keywords" in plan, plan


def test_merge_anti_joins_sets_the_planner_back_as_it_was(conn):
    """Hash joins are off only for the statements inside merge_anti_joins: after it, in or out of a caller's
    transaction, the setting is what it was, and a failing statement inside leaves nothing behind either."""
    import psycopg
    import pytest

    table = spaces.ensure_space(conn, "m", 3)
    setting = "SELECT current_setting('enable_hashjoin')"
    with spaces.merge_anti_joins(conn):
        assert conn.execute(setting).fetchone()[0] == "off"
        plan = "\n".join(r[0] for r in conn.execute(
            sql.SQL("EXPLAIN SELECT count(*) FROM ({m}) m").format(m=spaces.hashes_without_vector(table))))
        assert "Hash Anti Join" not in plan and "Hash Right Anti Join" not in plan, plan
    assert conn.execute(setting).fetchone()[0] == "on"
    with conn.transaction():
        conn.execute("SET LOCAL enable_hashjoin = on")
        with spaces.merge_anti_joins(conn):
            assert conn.execute(setting).fetchone()[0] == "off"
        assert conn.execute(setting).fetchone()[0] == "on"     # the caller's transaction goes on as it was
    with pytest.raises(psycopg.errors.UndefinedTable):
        with spaces.merge_anti_joins(conn):
            conn.execute("SELECT count(*) FROM no_such_table")
    assert conn.execute(setting).fetchone()[0] == "on"
