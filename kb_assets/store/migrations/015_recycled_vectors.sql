-- Pay once per (chunk hash, model), also across deletes: a vector no chunk uses any more (its file deleted, a
-- branch checked out without it, a paragraph edited away) moves here instead of being dropped, and comes back
-- when a chunk with that hash returns (a revert, the branch checked out again) instead of being embedded again
-- (kb_assets/pipeline/embeddings.py: remove_orphan_vectors, restore_recycled). Kept RECYCLE_DAYS after removal.
-- Never searched and never indexed: a space's table holds only vectors some chunk uses.
CREATE TABLE IF NOT EXISTS recycled_vectors (
    space_table  text NOT NULL,                 -- embedding_spaces.table_name the vector came from
    chunk_hash   text NOT NULL,
    embedding    vector NOT NULL,
    created_at   timestamptz NOT NULL,          -- when it was embedded (kept when it comes back)
    removed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (space_table, chunk_hash)
);
CREATE INDEX IF NOT EXISTS recycled_vectors_removed_at ON recycled_vectors (removed_at);
