-- Query statistics for keyword search (kb_assets.query.stats.refresh_query_stats, run after indexing).
-- Long queries (a whole paragraph) are searched with their most selective words only: the chunk frequency
-- of every lexeme tells which words are selective and weights them (IDF). ts_stat over all chunks is too slow
-- for query time, so it is materialized here.
CREATE TABLE IF NOT EXISTS lexeme_stats (
    lexeme  text PRIMARY KEY,
    ndoc    int NOT NULL          -- chunks containing the lexeme
);

CREATE TABLE IF NOT EXISTS query_stats (
    id            int PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    n_chunks      bigint NOT NULL,
    n_lexemes     bigint NOT NULL,
    refreshed_at  timestamptz NOT NULL DEFAULT now()
);
