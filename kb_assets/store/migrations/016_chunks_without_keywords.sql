-- The chunks keyword search can never find (no keyword vector, or an empty one for a text with words): the
-- vector_keyword_parity check counts them on every run. A partial index of those (normally none) answers that
-- count without reading every chunk's text and tsvector (kb_assets/store/health.py: chunk_coverage). Its predicate
-- is health._NO_KEYWORDS, word for word: the planner uses it only for a query with the same condition.
CREATE INDEX IF NOT EXISTS chunks_without_keywords ON chunks (document_id)
    WHERE tsv IS NULL OR (tsv = ''::tsvector AND text ~ '[[:alpha:]]{2}');
