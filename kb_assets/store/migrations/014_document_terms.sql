-- The keyword channel's postings per document (recall()'s document-level BM25, kb_assets/query/engine.py).
-- Read from the chunk heap, one GIN bitmap heap scan per query lexeme, its SQL took ~50 ms of a ~70 ms recall()
-- on the real PEP index (docs/BENCHMARKS.md, "The keyword channel from document postings"). Here each
-- (lexeme, document) is one row, read by the lexeme's index range; BM25's tf is the number of chunks holding
-- the lexeme (cardinality(chunk_ids), Tuning.bm25_tf "chunks"), and chunk_ids give the best chunk of a window
-- document (its query-IDF coverage, for the gate and the passage) without reading the chunks.
--
-- Maintained by refresh_query_stats (kb_assets/pipeline/query_stats.py) with the other statistics: from scratch
-- on a full refresh, else for the documents whose chunks changed since the last one (chunk_changes). So it is
-- as fresh as the last refresh, like the document vectors; until query_stats.document_terms is true (a
-- database migrated but not refreshed since, or chunks truncated) recall() reads the chunks as before.
CREATE TABLE IF NOT EXISTS document_terms (
    lexeme       text NOT NULL,
    document_id  bigint NOT NULL,      -- no foreign key: a refresh removes a deleted document's rows
    chunk_ids    bigint[] NOT NULL     -- the document's chunks holding the lexeme
);
CREATE UNIQUE INDEX IF NOT EXISTS document_terms_lexeme_idx ON document_terms (lexeme, document_id);
CREATE INDEX IF NOT EXISTS document_terms_document_idx ON document_terms (document_id);

ALTER TABLE query_stats ADD COLUMN IF NOT EXISTS document_terms boolean NOT NULL DEFAULT false;

-- TRUNCATE fires no delete trigger: forget the state (document_terms too), the next refresh is a full one.
CREATE OR REPLACE FUNCTION kb_chunks_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE query_stats SET chunk_watermark = NULL, document_terms = false WHERE id = 1;
    RETURN NULL;
END $$;

-- The title's lexemes, as the keyword channel's title weight reads them (the title, or a path, split on / _ . -
-- and camelCase): stored, not computed for the window's 200 documents on every query (~3 ms).
ALTER TABLE documents ADD COLUMN IF NOT EXISTS title_terms tsvector GENERATED ALWAYS AS (
    to_tsvector('english', regexp_replace(regexp_replace(coalesce(title, ''), '([a-z])([A-Z])', '\1 \2', 'g'),
                                          '[/_.-]+', ' ', 'g'))
) STORED;
