-- Incremental refresh of recall()'s statistics (kb_assets.query.stats.refresh_query_stats).
--
-- A refresh counts every chunk whose id is <= query_stats.chunk_watermark (ids come from the chunks_id_seq
-- sequence: a chunk inserted after a refresh has a larger id). The next refresh reads the chunks above the
-- watermark itself, so inserts cost nothing extra (a full load COPYs 40K chunks); what it cannot read any more
-- are chunks deleted (or updated) since, so statement-level triggers append their lexeme counts and document
-- ids to the delta tables below. Those are appended to only (no upsert, no unique key): two sources swapping
-- chunks at once never wait on each other there.
--
-- Chunk writers hold the advisory lock 0x6B620002 shared (BEFORE STATEMENT trigger, until they commit); a
-- refresh takes it exclusively, so it sees no writer half-way and the watermark it sets is exact.

ALTER TABLE query_stats ADD COLUMN IF NOT EXISTS chunk_watermark bigint;  -- NULL: the next refresh is a full one
ALTER TABLE query_stats ADD COLUMN IF NOT EXISTS vector_space text;      -- space table whose document vectors are kept
ALTER TABLE query_stats ADD COLUMN IF NOT EXISTS boilerplate_docs int;   -- threshold common_texts was built with

-- Chunks deleted (or updated) since the last refresh, among those it counted: lexeme counts (negative for
-- a deleted chunk) and the documents they belonged to.
CREATE TABLE IF NOT EXISTS lexeme_deltas (
    lexeme  text NOT NULL,
    n       int NOT NULL
);
CREATE TABLE IF NOT EXISTS chunk_changes (
    document_id  bigint NOT NULL,
    n            int NOT NULL          -- chunks added (+) or removed (-) in that document
);

-- The boilerplate rule of the document vectors (a chunk text found in more than N documents is left out
-- of their mean), kept per document: which chunk texts (md5) each document has, and the texts over N.
CREATE TABLE IF NOT EXISTS chunk_texts (
    text_md5     uuid NOT NULL,        -- md5(text)::uuid
    document_id  bigint NOT NULL,
    n            int NOT NULL          -- chunks of that document with that text
);
-- plain indexes, no constraint: a refresh from scratch drops them and builds them after the bulk insert
CREATE UNIQUE INDEX IF NOT EXISTS chunk_texts_text_idx ON chunk_texts (text_md5, document_id);
CREATE INDEX IF NOT EXISTS chunk_texts_document_idx ON chunk_texts (document_id);
CREATE TABLE IF NOT EXISTS common_texts (
    text_md5  uuid PRIMARY KEY,
    ndocs     int NOT NULL
);

-- Documents whose vector was computed while some of their chunks had no vector in the space (yet): the
-- next refresh recomputes them when that count moved.
CREATE TABLE IF NOT EXISTS doc_vector_pending (
    document_id  bigint PRIMARY KEY,
    n_embedded   int NOT NULL
);
-- Vectors deleted from a space table (orphans, by hand): their documents' vectors are recomputed.
CREATE TABLE IF NOT EXISTS vector_deletes (
    space_table  text NOT NULL,
    chunk_hash   text NOT NULL
);

CREATE OR REPLACE FUNCTION kb_chunks_writer_lock() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1801584642);   -- 0x6B620002, see kb_assets/query/stats.py
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION kb_chunks_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    w bigint;
BEGIN
    SELECT chunk_watermark INTO w FROM query_stats WHERE id = 1;
    IF w IS NULL THEN
        RETURN NULL;   -- never counted: the next refresh is a full one
    END IF;
    INSERT INTO lexeme_deltas (lexeme, n)
        SELECT l, -count(*) FROM old_rows o, unnest(tsvector_to_array(o.tsv)) AS l WHERE o.id <= w GROUP BY l;
    INSERT INTO chunk_changes (document_id, n)
        SELECT document_id, -count(*) FROM old_rows WHERE id <= w GROUP BY document_id;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION kb_chunks_updated() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    w bigint;
BEGIN
    SELECT chunk_watermark INTO w FROM query_stats WHERE id = 1;
    IF w IS NULL THEN
        RETURN NULL;
    END IF;
    -- the old version was counted (id <= w); the new one is counted now if its id is <= w (else the next
    -- refresh reads it above the watermark)
    INSERT INTO lexeme_deltas (lexeme, n)
        SELECT l, sum(n) FROM (
            SELECT l, -1 AS n FROM old_rows o, unnest(tsvector_to_array(o.tsv)) AS l WHERE o.id <= w
            UNION ALL
            SELECT l, 1 FROM new_rows o, unnest(tsvector_to_array(o.tsv)) AS l WHERE o.id <= w) x
        GROUP BY l HAVING sum(n) <> 0;
    INSERT INTO chunk_changes (document_id, n)
        SELECT document_id, -count(*) FROM old_rows WHERE id <= w GROUP BY document_id
        UNION ALL
        SELECT document_id, count(*) FROM new_rows WHERE id <= w GROUP BY document_id;
    RETURN NULL;
END $$;

-- TRUNCATE fires no delete trigger: forget the state, the next refresh is a full one.
CREATE OR REPLACE FUNCTION kb_chunks_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE query_stats SET chunk_watermark = NULL WHERE id = 1;
    RETURN NULL;
END $$;

-- On each space table (created by refresh_query_stats when it first keeps that space's document vectors).
CREATE OR REPLACE FUNCTION kb_vectors_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        UPDATE query_stats SET vector_space = NULL WHERE id = 1 AND vector_space = TG_TABLE_NAME;
    ELSE
        INSERT INTO vector_deletes (space_table, chunk_hash) SELECT TG_TABLE_NAME, chunk_hash FROM old_rows;
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS kb_chunks_lock_ins ON chunks;
CREATE TRIGGER kb_chunks_lock_ins BEFORE INSERT ON chunks
    FOR EACH STATEMENT EXECUTE FUNCTION kb_chunks_writer_lock();
DROP TRIGGER IF EXISTS kb_chunks_lock_upd ON chunks;
CREATE TRIGGER kb_chunks_lock_upd BEFORE UPDATE ON chunks
    FOR EACH STATEMENT EXECUTE FUNCTION kb_chunks_writer_lock();
DROP TRIGGER IF EXISTS kb_chunks_lock_del ON chunks;
CREATE TRIGGER kb_chunks_lock_del BEFORE DELETE ON chunks
    FOR EACH STATEMENT EXECUTE FUNCTION kb_chunks_writer_lock();
DROP TRIGGER IF EXISTS kb_chunks_deleted ON chunks;
CREATE TRIGGER kb_chunks_deleted AFTER DELETE ON chunks REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION kb_chunks_deleted();
DROP TRIGGER IF EXISTS kb_chunks_updated ON chunks;
CREATE TRIGGER kb_chunks_updated AFTER UPDATE ON chunks REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION kb_chunks_updated();
DROP TRIGGER IF EXISTS kb_chunks_truncated ON chunks;
CREATE TRIGGER kb_chunks_truncated AFTER TRUNCATE ON chunks
    FOR EACH STATEMENT EXECUTE FUNCTION kb_chunks_truncated();
