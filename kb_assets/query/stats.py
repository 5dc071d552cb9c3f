"""What the query needs beyond the index proper, refreshed after indexing by `refresh_query_stats(conn)`:

- lexeme_stats / query_stats: per-lexeme chunk frequencies (IDF for long keyword queries);
- a document-vector table beside the active space (`<space table>_docs`): one vector per document, the mean
  of its chunks' vectors, with its own HNSW index. It is the query's third channel: nearest *documents*,
  so results come from many distinct documents even when one long document owns every chunk of the
  chunk-level window. Only documents whose content changed since the last refresh are recomputed.
"""
from __future__ import annotations

import time

from psycopg import sql


BOILERPLATE_DOCS = 8   # the query ignores vector hits on chunks shared by more documents than this


def doc_vector_table(space_table: str) -> str:
    return f"{space_table}_docs"[:63]


def refresh_query_stats(conn) -> dict:
    """Recompute the keyword statistics and the document vectors of the active space.

    Call after indexing (any source) and after activating a new vector space. Each part is one short
    transaction; queries keep working meanwhile (they see the previous state until it commits).
    Cost measured here: ~2-3 s for 50,000 chunks.
    """
    from kb_assets.store.spaces import active_space

    started = time.perf_counter()
    with conn.transaction():
        conn.execute("LOCK TABLE lexeme_stats IN EXCLUSIVE MODE")
        conn.execute("DELETE FROM lexeme_stats")
        conn.execute("INSERT INTO lexeme_stats (lexeme, ndoc) SELECT word, ndoc FROM ts_stat('SELECT tsv FROM chunks')")
        n_lex = conn.execute("SELECT count(*) FROM lexeme_stats").fetchone()[0]
        n_chunks = conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
        conn.execute(
            "INSERT INTO query_stats (id, n_chunks, n_lexemes, refreshed_at) VALUES (1, %s, %s, now())"
            " ON CONFLICT (id) DO UPDATE SET n_chunks = EXCLUDED.n_chunks, n_lexemes = EXCLUDED.n_lexemes,"
            " refreshed_at = EXCLUDED.refreshed_at", (n_chunks, n_lex))
    conn.execute("ANALYZE lexeme_stats")
    out = {"chunks": n_chunks, "lexemes": n_lex, "lexeme_seconds": round(time.perf_counter() - started, 3)}
    space = active_space(conn)
    if space is not None:
        t0 = time.perf_counter()
        out["document_vectors"] = refresh_document_vectors(conn, space[2], space[1])
        out["document_vector_seconds"] = round(time.perf_counter() - t0, 3)
    out["seconds"] = round(time.perf_counter() - started, 3)
    return out


def refresh_document_vectors(conn, space_table: str, dim: int) -> dict:
    t = sql.Identifier(doc_vector_table(space_table))
    e = sql.Identifier(space_table)
    conn.execute(sql.SQL(
        "CREATE TABLE IF NOT EXISTS {t} (document_id bigint PRIMARY KEY REFERENCES documents(id) ON DELETE CASCADE,"
        " content_hash text, n_chunks int NOT NULL, embedding vector({d}) NOT NULL)").format(t=t, d=sql.Literal(dim)))
    index = sql.Identifier(doc_vector_table(space_table)[:58] + "_hnsw")
    empty = conn.execute(sql.SQL("SELECT NOT EXISTS (SELECT 1 FROM {t})").format(t=t)).fetchone()[0]
    if empty:
        # first build: bulk insert, then build the HNSW index once (much faster than row by row)
        conn.execute(sql.SQL("DROP INDEX IF EXISTS {i}").format(i=index))
    with conn.transaction():
        # gone: documents no longer active or whose content changed (deleted documents cascade)
        removed = conn.execute(sql.SQL(
            "DELETE FROM {t} x USING documents d WHERE d.id = x.document_id"
            " AND (d.status <> 'active' OR d.content_hash IS DISTINCT FROM x.content_hash)").format(t=t)).rowcount
        # and those whose embedded chunks changed in number (vectors added after the last refresh)
        removed += conn.execute(sql.SQL(
            "DELETE FROM {t} x USING (SELECT c.document_id, count(*) AS n FROM chunks c JOIN {e} e"
            " ON e.chunk_hash = c.chunk_hash GROUP BY c.document_id) k"
            " WHERE k.document_id = x.document_id AND k.n <> x.n_chunks").format(t=t, e=e)).rowcount
        # the mean leaves out boilerplate (a chunk text found in more than BOILERPLATE_DOCS documents: licence
        # footers, templates — whatever heading they sit under), which would pull every document vector the
        # same way; n_chunks counts all
        added = conn.execute(sql.SQL(
            "WITH common AS (SELECT md5(text) AS t FROM chunks GROUP BY 1 HAVING count(DISTINCT document_id) > %s)"
            " INSERT INTO {t} (document_id, content_hash, n_chunks, embedding)"
            " SELECT d.id, d.content_hash, count(*),"
            " coalesce(avg(e.embedding) FILTER (WHERE md5(c.text) NOT IN (SELECT t FROM common)),"
            " avg(e.embedding))"
            " FROM documents d JOIN chunks c ON c.document_id = d.id JOIN {e} e ON e.chunk_hash = c.chunk_hash"
            " WHERE d.status = 'active' AND NOT EXISTS (SELECT 1 FROM {t} x WHERE x.document_id = d.id)"
            " GROUP BY d.id, d.content_hash").format(t=t, e=e), (BOILERPLATE_DOCS,)).rowcount
    conn.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {i} ON {t} USING hnsw (embedding vector_cosine_ops)").format(
        i=index, t=t))
    conn.execute(sql.SQL("ANALYZE {t}").format(t=t))
    return {"added": added, "removed": removed}
