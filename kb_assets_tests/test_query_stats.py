"""refresh_query_stats: keyword statistics and document vectors, incremental and idempotent."""
from __future__ import annotations

from kb_assets.query import refresh_query_stats
from kb_assets.query.stats import doc_vector_table
from kb_assets_tests.test_query_support import Corpus


def test_refresh_builds_statistics_and_document_vectors(conn):
    c = Corpus(conn)
    a = c.doc("a.md", ["celery workers restart", "celery beat schedule"])
    c.doc("b.md", ["kafka bid pipeline"])
    c.doc("c.md", ["licence footer shared"], source="other")
    out = refresh_query_stats(conn)
    assert out["chunks"] == 4 and out["document_vectors"] == {"added": 3, "removed": 0}
    df = dict(conn.execute("SELECT lexeme, ndoc FROM lexeme_stats").fetchall())
    assert df["celeri"] == 2 and df["kafka"] == 1
    assert conn.execute("SELECT n_chunks FROM query_stats").fetchone()[0] == 4
    table = doc_vector_table(c.table)
    assert conn.execute(f"SELECT n_chunks FROM {table} WHERE document_id = %s", (a,)).fetchone()[0] == 2
    # nothing changed: nothing recomputed
    assert refresh_query_stats(conn)["document_vectors"] == {"added": 0, "removed": 0}
    # a changed document is recomputed; a deleted one disappears (cascade)
    conn.execute("UPDATE documents SET content_hash = 'new' WHERE id = %s", (a,))
    conn.execute("DELETE FROM documents WHERE path = 'b.md'")
    assert refresh_query_stats(conn)["document_vectors"] == {"added": 1, "removed": 1}
    assert conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 2
    df = dict(conn.execute("SELECT lexeme, ndoc FROM lexeme_stats").fetchall())
    assert "kafka" not in df
    # vectors that arrive after a refresh (a document embedded later) are picked up by the next one
    conn.execute("DELETE FROM " + c.table + " WHERE chunk_hash IN (SELECT chunk_hash FROM chunks WHERE document_id = %s"
                 " AND ordinal = 1)", (a,))
    assert refresh_query_stats(conn)["document_vectors"] == {"added": 1, "removed": 1}
    assert conn.execute(f"SELECT n_chunks FROM {table} WHERE document_id = %s", (a,)).fetchone()[0] == 1
