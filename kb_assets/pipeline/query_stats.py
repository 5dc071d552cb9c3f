"""Stage (part of the search index): what the query needs beyond the index proper, refreshed after indexing by `refresh_query_stats(conn)`:

- lexeme_stats / query_stats: per-lexeme chunk frequencies (IDF for long keyword queries);
- document_terms: the keyword channel's postings per document (which of its chunks hold each lexeme: BM25's
  tf and the best chunk, without reading the chunk heap at query time; migration 014);
- a document-vector table beside the active space (`<space table>_docs`): one vector per document, the mean
  of its chunks' vectors, with its own HNSW index. It is the query's third channel: nearest *documents*,
  so results come from many distinct documents even when one long document owns every chunk of the
  chunk-level window.

Incremental, exact: a refresh costs what changed since the previous one and leaves exactly what a refresh
from scratch would (`refresh_query_stats(conn, full=True)` is that, for repair). How it knows what changed
(migration 004): every chunk whose id is at most `query_stats.chunk_watermark` is counted; chunks above it
are new and read here; chunks deleted or updated since are recorded by statement triggers on `chunks`
(their lexemes and documents, appended to `lexeme_deltas` / `chunk_changes`). Inserts only take the lock
below (one statement trigger, no transition table), so a full load pays next to nothing for this; ids come
from chunks_id_seq (an id inserted by hand at or below the watermark would be missed: a count below zero is
detected and recomputed, and full=True repairs anything). The boilerplate rule of the document vectors
(a chunk text in more than BOILERPLATE_DOCS documents is left out of their mean) is kept per document in
`chunk_texts` / `common_texts`: when a text crosses the threshold, the documents that have it are
recomputed too.

Concurrency: chunk writers hold the advisory lock STATS_LOCK_ID shared from their first chunk statement to
their commit (trigger); a refresh holds it exclusively, so it never sees a writer half-way and no chunk id
below its watermark can appear later. Writers append to the delta tables only (no upsert): two sources
swapping chunks at once never wait on each other there. The document-vector table has no foreign key (a
refresh holding the lock must never wait for a row lock of a document being deleted: that was a deadlock).
"""
from __future__ import annotations

import time

from psycopg import sql

from kb_assets.store.spaces import doc_vector_table  # noqa: F401  (its name lives with the spaces)


BOILERPLATE_DOCS = 8   # the query ignores vector hits on chunks shared by more documents than this
STATS_LOCK_ID = 0x6B62_0002     # chunk writers: shared (trigger kb_chunks_writer_lock); a refresh: exclusive
PREPARE_LOCK_ID = 0x6B62_0003   # creating a space's document-vector table, its triggers, its HNSW index
FULL_FRACTION = 0.5    # more changed chunks than this share of all (and FULL_MIN_CHUNKS): recompute from
FULL_MIN_CHUNKS = 5000  # scratch, which is then cheaper than applying the deltas
BULK_DOCUMENTS = 500    # more documents' vectors to recompute than this: one pass over all chunks


def refresh_query_stats(conn, *, full: bool = False) -> dict:
    """Bring the keyword statistics and the document vectors of the active space up to date.

    Call after indexing (any source) and after activating a new vector space; `full=True` recomputes
    everything from scratch (repair; the first refresh of a database is one). One short transaction: queries
    keep working meanwhile (they see the previous state until it commits); chunk writers wait for it.
    Measured on 40K chunks / 3,000 documents (bench/query_stats_bench.py): ~0.1-0.2 s after a 1% change
    (much of it re-inserting changed document vectors into their HNSW index, 1-2 ms each), ~2.1 s from
    scratch (half of it that index's build).

    Returns chunks, lexemes, mode ("full" | "incremental"), changed_documents (incremental: documents whose
    chunks changed), document_vectors {added, removed} (rows of the document-vector table replaced),
    document_terms (rows of the keyword postings written), lexeme_seconds, document_terms_seconds,
    document_vector_seconds, seconds.
    """
    from kb_assets.store.spaces import active_space

    started = time.perf_counter()
    space = active_space(conn)
    doc_created = _prepare_space(conn, space[2], space[1]) if space is not None else False
    out: dict = {}
    build_index = False
    with conn.transaction():
        # ACCESS SHARE: a TRUNCATE (which resets the state) cannot slip in between reading the state and
        # using it. Then wait for the chunk writers in flight; new ones wait for this transaction.
        tables = [sql.Identifier("chunks")] + ([sql.Identifier(space[2])] if space is not None else [])
        conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE").format(sql.SQL(", ").join(tables)))
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (STATS_LOCK_ID,))
        row = conn.execute("SELECT n_chunks, n_lexemes, chunk_watermark, vector_space, boilerplate_docs,"
                           " document_terms FROM query_stats WHERE id = 1").fetchone()
        n_chunks, n_lex, watermark, tracked, bp, terms_kept = row if row else (0, 0, None, None, None, False)
        if full or watermark is None or bp != BOILERPLATE_DOCS:
            chunks = _chunks_full(conn, watermark)
        else:
            chunks = _chunks_incremental(conn, watermark, n_chunks, n_lex)
        out.update(chunks=chunks["n_chunks"], lexemes=chunks["n_lexemes"], mode=chunks["mode"],
                   lexeme_seconds=round(time.perf_counter() - started, 3))
        t0 = time.perf_counter()
        if chunks["mode"] == "full" or not terms_kept:      # not kept: a new database, migrated or truncated
            out["document_terms"] = _document_terms_full(conn, unread=not terms_kept)
        else:
            out["document_terms"] = _document_terms_for(conn, chunks["changed_documents"], watermark,
                                                        rebuild=chunks.get("updated_documents", set()))
        out["document_terms_seconds"] = round(time.perf_counter() - t0, 3)
        if chunks["changed_documents"] is not None:
            out["changed_documents"] = len(chunks["changed_documents"])
        if space is not None:
            t0 = time.perf_counter()
            changed = None
            if not (full or doc_created or tracked != space[2] or chunks["changed_documents"] is None):
                changed = chunks["changed_documents"] | chunks["flipped_documents"]
            dv = refresh_document_vectors(conn, space[2], space[1], changed=changed)
            build_index = dv.pop("build_index")
            out["document_vectors"] = dv
            out["document_vector_seconds"] = round(time.perf_counter() - t0, 3)
            tracked = space[2]
        else:
            tracked = None
        conn.execute(
            "INSERT INTO query_stats (id, n_chunks, n_lexemes, refreshed_at, chunk_watermark, vector_space,"
            " boilerplate_docs, document_terms) VALUES (1, %(n)s, %(l)s, now(), %(w)s, %(v)s, %(b)s, true)"
            " ON CONFLICT (id) DO UPDATE SET n_chunks = EXCLUDED.n_chunks, n_lexemes = EXCLUDED.n_lexemes,"
            " refreshed_at = EXCLUDED.refreshed_at, chunk_watermark = EXCLUDED.chunk_watermark,"
            " vector_space = EXCLUDED.vector_space, boilerplate_docs = EXCLUDED.boilerplate_docs,"
            " document_terms = EXCLUDED.document_terms",
            {"n": chunks["n_chunks"], "l": chunks["n_lexemes"], "w": chunks["watermark"], "v": tracked,
             "b": BOILERPLATE_DOCS})
    # Outside the transaction (chunk writers no longer wait): planner statistics after a rebuild (smaller
    # changes: autovacuum's autoanalyze, off our clock) and a first HNSW build.
    if chunks["mode"] == "full":
        conn.execute("ANALYZE lexeme_stats")
    if chunks["mode"] == "full" or not terms_kept:
        conn.execute("ANALYZE document_terms")
    if space is not None:
        t0 = time.perf_counter()
        t = doc_vector_table(space[2])
        if build_index:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (PREPARE_LOCK_ID,))   # two refreshes: one build
                # one parallel worker (pgvector >= 0.6 builds HNSW in parallel): ~1.7x faster on 3,000
                # documents; the table is below the size that would get a worker by default
                conn.execute("SET LOCAL max_parallel_maintenance_workers = 1")
                conn.execute("SET LOCAL min_parallel_table_scan_size = 0")
                conn.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {i} ON {t} USING hnsw (embedding vector_cosine_ops)")
                             .format(i=sql.Identifier(_doc_index(t)), t=sql.Identifier(t)))
        rebuilt = out["document_vectors"].pop("rebuilt")
        if build_index or rebuilt:
            conn.execute(sql.SQL("ANALYZE {t}").format(t=sql.Identifier(t)))
        out["document_vector_seconds"] = round(out["document_vector_seconds"] + time.perf_counter() - t0, 3)
    out["seconds"] = round(time.perf_counter() - started, 3)
    return out


# ---- keyword statistics and chunk texts ------------------------------------------------------------------

def _chunks_full(conn, old_watermark: int | None, n_chunks: int | None = None) -> dict:
    """lexeme_stats, chunk_texts and common_texts from scratch; the deltas recorded so far are covered.
    `n_chunks`: the number of chunks when the caller knows it."""
    # Nobody else writes these now: chunk writers append only while they hold the lock we hold.
    conn.execute("TRUNCATE lexeme_deltas, chunk_changes, chunk_texts")
    conn.execute("DELETE FROM lexeme_stats")   # not TRUNCATE: queries read it meanwhile
    n_lex = conn.execute(
        "INSERT INTO lexeme_stats (lexeme, ndoc) SELECT word, ndoc FROM ts_stat('SELECT tsv FROM chunks')").rowcount
    # bulk insert, then build the indexes (sorted builds: faster than 40K index inserts)
    from kb_assets.store.spaces import own

    conn.execute(sql.SQL("DROP INDEX IF EXISTS {}, {}").format(own(conn, "chunk_texts_text_idx"),
                                                               own(conn, "chunk_texts_document_idx")))
    conn.execute("INSERT INTO chunk_texts (text_md5, document_id, n)"
                 " SELECT md5(text)::uuid, document_id, count(*) FROM chunks GROUP BY 1, 2")
    conn.execute("CREATE UNIQUE INDEX chunk_texts_text_idx ON chunk_texts (text_md5, document_id)")
    conn.execute("CREATE INDEX chunk_texts_document_idx ON chunk_texts (document_id)")
    old_common = {r[0] for r in conn.execute("DELETE FROM common_texts RETURNING text_md5")}
    new_common = {r[0] for r in conn.execute(
        "INSERT INTO common_texts (text_md5, ndocs) SELECT text_md5, count(*) FROM chunk_texts GROUP BY 1"
        " HAVING count(*) > %s RETURNING text_md5", (BOILERPLATE_DOCS,))}
    if n_chunks is None:
        n_chunks, top = conn.execute("SELECT count(*), max(id) FROM chunks").fetchone()
    else:
        top = conn.execute("SELECT max(id) FROM chunks").fetchone()[0]
    # never lower: ids above it must stay "new" (a sequence never hands out an id twice)
    watermark = max(x for x in (old_watermark, top, 0) if x is not None)
    return {"mode": "full", "n_chunks": n_chunks, "n_lexemes": n_lex, "watermark": watermark,
            "lexemes_changed": n_lex, "changed_documents": None,
            "flipped_documents": _documents_with(conn, old_common ^ new_common)}


def _chunks_incremental(conn, watermark: int, n_chunks: int, n_lex: int) -> dict:
    new_chunks, max_id = conn.execute("SELECT count(*), max(id) FROM chunks WHERE id > %s", (watermark,)).fetchone()
    removed = conn.execute("SELECT coalesce(sum(abs(n)), 0) FROM chunk_changes").fetchone()[0]
    if new_chunks + removed > max(FULL_MIN_CHUNKS, FULL_FRACTION * n_chunks):
        # e.g. every document re-chunked: recomputing is cheaper than the deltas. Which documents changed is
        # still known (for the document vectors).
        docs, delta, _updated = _changed_documents(conn, watermark)
        out = _chunks_full(conn, watermark, n_chunks + delta)
        out.update(mode="full", changed_documents=docs)
        return out
    docs, delta, updated = _changed_documents(conn, watermark)
    # lexemes: the deltas of deleted / updated chunks plus the lexemes of the new chunks
    inserted, changed, zero, negative = conn.execute(
        "WITH d AS (DELETE FROM lexeme_deltas RETURNING lexeme, n),"
        " s AS (SELECT lexeme, sum(n) AS n FROM (SELECT lexeme, n FROM d UNION ALL"
        "  SELECT l, 1 FROM chunks c, unnest(tsvector_to_array(c.tsv)) AS l WHERE c.id > %s) x"
        "  GROUP BY lexeme HAVING sum(n) <> 0),"
        " u AS (INSERT INTO lexeme_stats AS t (lexeme, ndoc) SELECT lexeme, n FROM s"
        "  ON CONFLICT (lexeme) DO UPDATE SET ndoc = t.ndoc + EXCLUDED.ndoc"
        "  RETURNING t.lexeme, t.ndoc, (t.xmax = 0) AS new)"
        " SELECT count(*) FILTER (WHERE new), count(*), coalesce(array_agg(lexeme) FILTER (WHERE ndoc = 0), '{}'),"
        " count(*) FILTER (WHERE ndoc < 0) FROM u", (watermark,)).fetchone()
    if zero:
        conn.execute("DELETE FROM lexeme_stats WHERE lexeme = ANY(%s)", (zero,))
    if negative:
        # a count below zero: the state was not what the deltas assumed (e.g. chunks inserted with explicit
        # ids below the watermark). Recompute; the result is then exact again.
        out = _chunks_full(conn, watermark)
        out.update(changed_documents=docs, mode="full")
        return out
    flipped = _refresh_chunk_texts(conn, docs)
    return {"mode": "incremental", "n_chunks": n_chunks + delta, "n_lexemes": n_lex + inserted - len(zero),
            "watermark": max(watermark, max_id or 0), "lexemes_changed": changed,
            "changed_documents": docs, "flipped_documents": flipped, "updated_documents": updated}


def _changed_documents(conn, watermark: int) -> tuple[set[int], int, set[int]]:
    """Documents whose chunks changed since the last refresh (consumes chunk_changes), the net change in the
    number of chunks, and the documents with a chunk updated in place (its id kept: the update trigger's
    positive count; kb itself replaces chunks, so only a change by hand)."""
    rows = conn.execute(
        "WITH d AS (DELETE FROM chunk_changes RETURNING document_id, n)"
        " SELECT document_id, sum(n)::bigint, bool_or(upd) FROM (SELECT document_id, n, n > 0 AS upd FROM d"
        " UNION ALL SELECT document_id, count(*), false FROM chunks WHERE id > %s GROUP BY 1) x GROUP BY 1",
        (watermark,)).fetchall()
    return {r[0] for r in rows}, sum(r[1] for r in rows), {r[0] for r in rows if r[2]}


def _refresh_chunk_texts(conn, docs: set[int]) -> set[int]:
    """Recount the chunk texts of `docs`; returns the documents whose boilerplate set changed because a text
    crossed the BOILERPLATE_DOCS threshold (their vectors must be recomputed too)."""
    if not docs:
        return set()
    ids = list(docs)
    old = set(conn.execute("DELETE FROM chunk_texts WHERE document_id = ANY(%s) RETURNING text_md5, document_id",
                           (ids,)).fetchall())
    new = set(conn.execute(
        "INSERT INTO chunk_texts (text_md5, document_id, n) SELECT md5(text)::uuid, document_id, count(*) FROM chunks"
        " WHERE document_id = ANY(%s) GROUP BY 1, 2 RETURNING text_md5, document_id", (ids,)).fetchall())
    touched = list({m for m, _ in old ^ new})   # texts that some document gained or lost
    if not touched:
        return set()
    was = {r[0] for r in conn.execute("DELETE FROM common_texts WHERE text_md5 = ANY(%s) RETURNING text_md5",
                                      (touched,))}
    now = {r[0] for r in conn.execute(
        "INSERT INTO common_texts (text_md5, ndocs) SELECT text_md5, count(*) FROM chunk_texts"
        " WHERE text_md5 = ANY(%s) GROUP BY 1 HAVING count(*) > %s RETURNING text_md5", (touched, BOILERPLATE_DOCS))}
    return _documents_with(conn, was ^ now)


# ---- the keyword channel's document postings --------------------------------------------------------------

# One row per (lexeme, document): the document's chunks holding the lexeme. The ids' order does not matter (the
# best chunk is chosen by coverage, then lowest id).
_TERMS_SQL = ("INSERT INTO document_terms (lexeme, document_id, chunk_ids)"
              " SELECT l, c.document_id, array_agg(c.id) FROM chunks c, unnest(tsvector_to_array(c.tsv)) AS l{where}"
              " GROUP BY 1, 2")


def _document_terms_full(conn, *, unread: bool) -> int:
    """document_terms from scratch. `unread`: no query reads it now (query_stats.document_terms is false), so
    its indexes are dropped and built after the bulk insert (40K synthetic chunks, 1.9M postings: ~6 s in all);
    else DELETE, not TRUNCATE or an index rebuild (both lock readers out): queries read the previous rows
    meanwhile."""
    from kb_assets.store.spaces import own

    # the aggregate as a hash table in memory (the default 4 MB sorts on disk: ~2x slower)
    conn.execute("SET LOCAL work_mem = '128MB'")
    if unread:   # nothing reads it: a TRUNCATE leaves no dead rows between the new ones
        conn.execute("TRUNCATE document_terms")
        conn.execute(sql.SQL("DROP INDEX IF EXISTS {}, {}").format(own(conn, "document_terms_lexeme_idx"),
                                                                   own(conn, "document_terms_document_idx")))
    else:
        conn.execute("DELETE FROM document_terms")
    # each lexeme's rows together, so a query reads them from a few adjacent pages (unordered: the keyword SQL
    # 1.1x slower); ordered by the lexeme's hash, not its text: the text sort took ~2 s of 40K chunks' ~7 s
    n = conn.execute(_TERMS_SQL.format(where="") + " ORDER BY hashtext(l)").rowcount
    if unread:
        conn.execute("CREATE UNIQUE INDEX document_terms_lexeme_idx ON document_terms (lexeme, document_id)")
        conn.execute("CREATE INDEX document_terms_document_idx ON document_terms (document_id)")
    conn.execute("RESET work_mem")
    return n


def _document_terms_for(conn, docs: set[int], watermark: int, *, rebuild: set[int] = frozenset()) -> int:
    """The rows of `docs` (documents whose chunks changed, deleted ones included) brought up to date; returns
    the rows written.

    Only the (lexeme, document) rows a change touched are rewritten: those holding the id of a chunk that is
    gone, and those of the lexemes of the document's chunks above `watermark` (cut since the last refresh).
    The chunk stage keeps a re-cut document's unchanged chunks (pipeline/chunks._swap), so a paragraph appended
    to a long document rewrites its last chunk's rows, not all of the document's: on 30 synthetic documents
    ~2K rows instead of ~20K deleted and inserted. A document that kept no chunk (new, deleted, renamed: a new
    row) and those in `rebuild` (a chunk updated in place keeps its id: neither test above sees it) have all their
    rows recomputed."""
    if not docs:
        return 0
    written = 0
    # a document none of whose chunks was there before (new, renamed, deleted, cut again from the top): all its
    # rows go and come from its chunks, the plain way; only one that kept chunks is worth the comparison
    kept = {r[0] for r in conn.execute("SELECT DISTINCT document_id FROM chunks WHERE document_id = ANY(%s)"
                                       " AND id <= %s", (list(docs), watermark))}
    full = [d for d in docs if d in rebuild or d not in kept]
    if full:
        conn.execute("DELETE FROM document_terms WHERE document_id = ANY(%s)", (full,))
        written += conn.execute(_TERMS_SQL.format(where=" WHERE c.document_id = ANY(%s)"), (full,)).rowcount
    part = [d for d in docs if d not in rebuild and d in kept]
    if not part:
        return written
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS _terms_touched (lexeme text, document_id bigint, chunk_ids bigint[])"
                 " ON COMMIT DELETE ROWS")
    conn.execute("DELETE FROM _terms_touched")   # (inside a caller's longer transaction, a previous refresh's)
    # each touched row's new chunk ids: its old ones still live, and the new chunks holding its lexeme (no
    # unnesting of the document's other chunks: the old row already lists them)
    conn.execute(
        "INSERT INTO _terms_touched"
        " WITH live AS (SELECT document_id, array_agg(id) AS ids FROM chunks WHERE document_id = ANY(%(d)s)"
        "  GROUP BY 1),"
        " fresh AS (SELECT l AS lexeme, c.document_id, array_agg(c.id) AS ids"
        "  FROM chunks c, unnest(tsvector_to_array(c.tsv)) AS l WHERE c.document_id = ANY(%(d)s) AND c.id > %(w)s"
        "  GROUP BY 1, 2),"
        # the documents' rows read once (by document: the planner, guessing, took a scan of every row to
        # join the touched ones back)
        " old AS MATERIALIZED (SELECT t.lexeme, t.document_id, t.chunk_ids FROM document_terms t"
        "  WHERE t.document_id = ANY(%(d)s)),"
        " touched AS (SELECT o.lexeme, o.document_id FROM old o LEFT JOIN live USING (document_id)"
        "  WHERE live.ids IS NULL OR NOT o.chunk_ids <@ live.ids UNION SELECT lexeme, document_id FROM fresh)"
        " SELECT x.lexeme, x.document_id, ARRAY(SELECT DISTINCT i FROM unnest(coalesce(o.chunk_ids, '{}')"
        "  || coalesce(f.ids, '{}')) AS i WHERE i = ANY(l.ids) ORDER BY i)"
        " FROM touched x LEFT JOIN old o ON o.lexeme = x.lexeme AND o.document_id = x.document_id"
        " LEFT JOIN fresh f ON f.lexeme = x.lexeme AND f.document_id = x.document_id"
        " LEFT JOIN live l ON l.document_id = x.document_id",
        {"d": part, "w": watermark})
    conn.execute("DELETE FROM document_terms t USING _terms_touched x"
                 " WHERE t.lexeme = x.lexeme AND t.document_id = x.document_id")
    written += conn.execute("INSERT INTO document_terms (lexeme, document_id, chunk_ids)"
                            " SELECT lexeme, document_id, chunk_ids FROM _terms_touched WHERE cardinality(chunk_ids) > 0"
                            ).rowcount
    return written


def _documents_with(conn, texts: set[str]) -> set[int]:
    if not texts:
        return set()
    return {r[0] for r in conn.execute("SELECT DISTINCT document_id FROM chunk_texts WHERE text_md5 = ANY(%s)",
                                       (list(texts),))}


# ---- document vectors ----------------------------------------------------------------------------------------

# A relation of the connection's own schema (the first of its search_path that exists), never a same-named one
# further down the path: the regression check's schema sits in front of another index's tables.
_OWN = "to_regclass(quote_ident(current_schema()) || '.' || quote_ident({}))"


def _doc_index(doc_table: str) -> str:
    return doc_table[:58] + "_hnsw"


def _prepare_space(conn, space_table: str, dim: int) -> bool:
    """The space's document-vector table (no foreign key) and the trigger that reports deleted vectors; True
    when the table was created now. Its own short transaction, before the refresh takes its lock."""
    doc = doc_vector_table(space_table)
    exists, fk, trig = conn.execute(
        "SELECT " + _OWN.format("%(d)s") + " IS NOT NULL,"
        " (SELECT conname FROM pg_constraint WHERE conrelid = " + _OWN.format("%(d)s") + " AND contype = 'f'"
        "  LIMIT 1),"
        " EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = " + _OWN.format("%(e)s") +
        "  AND tgname = 'kb_vectors_deleted')", {"d": doc, "e": space_table}).fetchone()
    if exists and fk is None and trig:
        return False
    t, e = sql.Identifier(doc), sql.Identifier(space_table)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (PREPARE_LOCK_ID,))
        created = conn.execute("SELECT " + _OWN.format("%s") + " IS NULL", (doc,)).fetchone()[0]
        if created:
            conn.execute(sql.SQL(
                "CREATE TABLE {t} (document_id bigint PRIMARY KEY, content_hash text, n_chunks int NOT NULL,"
                " embedding vector({d}) NOT NULL)").format(t=t, d=sql.Literal(dim)))
        elif fk is not None:
            # a table made before migration 004: drop its foreign key (documents first, as writers lock them)
            conn.execute("LOCK TABLE documents IN SHARE ROW EXCLUSIVE MODE")
            conn.execute(sql.SQL("ALTER TABLE {t} DROP CONSTRAINT IF EXISTS {c}").format(t=t, c=sql.Identifier(fk)))
        if not conn.execute("SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = " + _OWN.format("%s") +
                            " AND tgname = 'kb_vectors_deleted')", (space_table,)).fetchone()[0]:
            conn.execute(sql.SQL(
                "CREATE TRIGGER kb_vectors_deleted AFTER DELETE ON {e} REFERENCING OLD TABLE AS old_rows"
                " FOR EACH STATEMENT EXECUTE FUNCTION kb_vectors_deleted()").format(e=e))
            conn.execute(sql.SQL(
                "CREATE TRIGGER kb_vectors_truncated AFTER TRUNCATE ON {e}"
                " FOR EACH STATEMENT EXECUTE FUNCTION kb_vectors_deleted()").format(e=e))
    return created


# A document's vector: the mean of its chunks' vectors, boilerplate chunks left out. md5 is computed only for
# the chunks of documents that have a boilerplate text (cd); the fallback mean (every chunk of the document is
# boilerplate) only for those documents too. n_all: its chunks; n_emb: those with a vector in the space.
_MEANS_SQL = (
    "WITH cd AS (SELECT DISTINCT x.document_id FROM chunk_texts x JOIN common_texts USING (text_md5))"
    " SELECT d.id, d.content_hash, count(*) AS n_all, count(e.chunk_hash) AS n_emb,"
    " coalesce(avg(e.embedding) FILTER (WHERE cd.document_id IS NULL"
    "  OR md5(c.text)::uuid NOT IN (SELECT text_md5 FROM common_texts)),"
    "  avg(e.embedding) FILTER (WHERE cd.document_id IS NOT NULL)) AS v"
    " FROM documents d JOIN chunks c ON c.document_id = d.id LEFT JOIN {e} e ON e.chunk_hash = c.chunk_hash"
    " LEFT JOIN cd ON cd.document_id = d.id"
    " WHERE d.status = 'active'{where} GROUP BY d.id, d.content_hash")


def refresh_document_vectors(conn, space_table: str, dim: int, *, changed: set[int] | None = None) -> dict:
    """Recompute the vectors of documents that changed (`changed`: documents whose chunks or boilerplate set
    changed; None: all of them). Runs inside refresh_query_stats's transaction, after the chunk texts.

    A document's vector is the mean of its chunks' vectors, boilerplate chunks left out (a chunk text found
    in more than BOILERPLATE_DOCS documents: licence footers, templates — whatever heading they sit under),
    which would pull every document vector the same way; n_chunks counts its chunks that have a vector.
    Documents without a vector for some chunk are kept in doc_vector_pending until that number moves.
    """
    t = sql.Identifier(doc_vector_table(space_table))
    e = sql.Identifier(space_table)
    index = _doc_index(doc_vector_table(space_table))
    empty, build_index = conn.execute(sql.SQL("SELECT NOT EXISTS (SELECT 1 FROM {t}),"
                                              " " + _OWN.format("%s") + " IS NULL").format(t=t),
                                      (index,)).fetchone()   # a missing index is built after the commit
    if changed is None and empty:
        # first build: bulk insert, then build the HNSW index once (much faster than row by row)
        from kb_assets.store.spaces import own

        conn.execute(sql.SQL("DROP INDEX IF EXISTS {i}").format(i=own(conn, index)))
        conn.execute("TRUNCATE doc_vector_pending")
        conn.execute("DELETE FROM vector_deletes")   # every space's: another space starts from scratch too
        # the aggregate's state is ~3 KB per document: without room it spills to disk (~2x slower)
        conn.execute("SET LOCAL work_mem = '64MB'")
        added = conn.execute(sql.SQL(
            "WITH s AS (" + _MEANS_SQL + "),"
            " p AS (INSERT INTO doc_vector_pending (document_id, n_embedded) SELECT id, n_emb FROM s"
            " WHERE n_emb < n_all)"
            " INSERT INTO {t} (document_id, content_hash, n_chunks, embedding)"
            " SELECT id, content_hash, n_emb, v FROM s WHERE n_emb > 0").format(t=t, e=e, where=sql.SQL(""))).rowcount
        return {"added": added, "removed": 0, "rebuilt": True, "build_index": True}

    if changed is None:     # everything recomputed, into a table that has rows (repair, a TRUNCATE of chunks)
        conn.execute("TRUNCATE doc_vector_pending")
        conn.execute("DELETE FROM vector_deletes")
        ids = None
    else:
        docs = set(changed)
        # documents deleted, no longer active, or whose content changed
        docs.update(r[0] for r in conn.execute(sql.SQL(
            "SELECT x.document_id FROM {t} x LEFT JOIN documents d ON d.id = x.document_id WHERE d.id IS NULL"
            " OR d.status <> 'active' OR d.content_hash IS DISTINCT FROM x.content_hash").format(t=t)))
        # vectors deleted from the space (and replaced, perhaps): the documents that use them
        gone = [h for table, h in conn.execute("DELETE FROM vector_deletes RETURNING space_table, chunk_hash")
                if table == space_table]
        if gone:
            docs.update(r[0] for r in conn.execute(
                "SELECT DISTINCT document_id FROM chunks WHERE chunk_hash = ANY(%s)", (gone,)))
        # documents some of whose chunks had no vector yet, when that number moved
        docs.update(r[0] for r in conn.execute(sql.SQL(
            "SELECT p.document_id FROM doc_vector_pending p WHERE p.n_embedded <> (SELECT count(*) FROM chunks c"
            " JOIN {e} e ON e.chunk_hash = c.chunk_hash WHERE c.document_id = p.document_id)").format(e=e)))
        if not docs:
            return {"added": 0, "removed": 0, "rebuilt": False, "build_index": build_index}
        ids = list(docs)
        conn.execute("DELETE FROM doc_vector_pending WHERE document_id = ANY(%s)", (ids,))
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS _doc_means (id bigint, content_hash text, n_all bigint,"
                 " n_emb bigint, v vector) ON COMMIT DELETE ROWS")
    conn.execute("DELETE FROM _doc_means")   # (inside a caller's longer transaction, a previous refresh's)
    if ids is not None and len(ids) <= BULK_DOCUMENTS:
        conn.execute(sql.SQL("INSERT INTO _doc_means " + _MEANS_SQL).format(
            e=e, where=sql.SQL(" AND d.id = ANY(%s)")), (ids,))
    else:   # many documents (e.g. all re-chunked): hash joins over everything beat an index lookup per chunk
        conn.execute("SET LOCAL work_mem = '64MB'")
        conn.execute(sql.SQL("INSERT INTO _doc_means SELECT * FROM (" + _MEANS_SQL + ") m"
                             + (" WHERE id = ANY(%s)" if ids is not None else "")).format(e=e, where=sql.SQL("")),
                     (ids,) if ids is not None else None)
    conn.execute("INSERT INTO doc_vector_pending (document_id, n_embedded) SELECT id, n_emb FROM _doc_means"
                 " WHERE n_emb < n_all")
    # Only rows that differ are replaced: each replacement is an HNSW insert (~1-2 ms), and a document whose
    # chunks were cut again the same (e.g. every document re-chunked) keeps its row.
    removed = conn.execute(sql.SQL(
        "DELETE FROM {t} x WHERE " + ("x.document_id = ANY(%s) AND " if ids is not None else "") +
        "NOT EXISTS (SELECT 1 FROM _doc_means s WHERE s.id = x.document_id AND s.n_emb > 0"
        " AND s.n_emb = x.n_chunks AND s.content_hash IS NOT DISTINCT FROM x.content_hash AND s.v = x.embedding)"
    ).format(t=t), (ids,) if ids is not None else None).rowcount
    added = conn.execute(sql.SQL(
        "INSERT INTO {t} (document_id, content_hash, n_chunks, embedding) SELECT id, content_hash, n_emb, v"
        " FROM _doc_means s WHERE n_emb > 0 AND NOT EXISTS (SELECT 1 FROM {t} x WHERE x.document_id = s.id)"
    ).format(t=t)).rowcount
    return {"added": added, "removed": removed, "rebuilt": ids is None, "build_index": build_index}
