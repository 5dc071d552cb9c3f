-- Identifiers split for the keyword index (issue 9 §3): PostgreSQL's parser keeps `getUserName` as one word,
-- `click.core.Context` and `httpx/_client.py` as one host / file token, so a bug report that says "user name",
-- "Context" or "_client" never matches them. The chunk's tsvector now also holds the parts of every
-- camelCase, snake_case, dotted or path-like word of its heading and text (the whole words stay as before).
-- kb_assets.query.engine.identifier_words splits a query the same way.
CREATE OR REPLACE FUNCTION kb_identifier_words(t text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT coalesce(string_agg(p, ' '), '')
    FROM regexp_matches(t, '[A-Za-z_][A-Za-z0-9_]*(?:[./-][A-Za-z_][A-Za-z0-9_]*)*', 'g') AS m(w),
         LATERAL regexp_split_to_table(
             regexp_replace(regexp_replace(m.w[1], '([a-z0-9])([A-Z])', '\1 \2', 'g'),
                            '([A-Z]+)([A-Z][a-z])', '\1 \2', 'g'),
             '[ ./_-]+') AS p
    WHERE m.w[1] ~ '[a-z0-9][A-Z]|[A-Za-z0-9][./_-][A-Za-z]' AND length(p) > 1
$$;

-- A generated column's expression cannot change in PostgreSQL 16: the column (and its GIN index) is rebuilt.
ALTER TABLE chunks DROP COLUMN IF EXISTS tsv;
ALTER TABLE chunks ADD COLUMN tsv tsvector GENERATED ALWAYS AS (
    setweight(to_tsvector('english', heading), 'A') || to_tsvector('english', text)
    || setweight(to_tsvector('english', kb_identifier_words(heading || ' ' || text)), 'D')
) STORED;
CREATE INDEX IF NOT EXISTS chunks_tsv_idx ON chunks USING gin (tsv);

-- The lexeme statistics counted the old vectors: the next refresh is a full one.
UPDATE query_stats SET chunk_watermark = NULL WHERE id = 1;
