-- Core tables: sources, documents, chunks, embedding spaces, signposts, runs.
CREATE EXTENSION IF NOT EXISTS vector;

CREATE TABLE IF NOT EXISTS sources (
    key              text PRIMARY KEY,
    kind             text NOT NULL,
    root             text NOT NULL,
    config_hash      text,                 -- of the source's settings: a change forces a full listing
    indexed_commit   text,                 -- git commit the documents reflect (NULL: folder walk)
    listed_at        timestamptz,          -- time of the last complete, successful listing
    last_run_at      timestamptz,
    last_run_status  text,
    last_run_stats   jsonb NOT NULL DEFAULT '{}'::jsonb
);

-- One row per live or skipped document. Deleted documents are removed (chunks cascade).
CREATE TABLE IF NOT EXISTS documents (
    id             bigserial PRIMARY KEY,
    source_key     text NOT NULL REFERENCES sources(key) ON DELETE CASCADE,
    path           text NOT NULL,        -- POSIX, relative to the source root
    kind           text NOT NULL,
    title          text NOT NULL DEFAULT '',
    status         text NOT NULL CHECK (status IN ('active', 'skipped')),
    skip_reason    text,
    skip_detail    text,
    content_hash   text,                 -- of the redacted text (NULL for skipped)
    file_sig       text,                 -- size:mtime_ns or git blob id: cheap "unchanged" test before reading
    chunked_hash   text,                 -- content_hash that the current chunks were cut from
    meta           jsonb NOT NULL DEFAULT '{}'::jsonb,
    text           text,                 -- redacted document text (tier 2: kb show)
    indexed_commit text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (source_key, path)
);
CREATE INDEX IF NOT EXISTS documents_hash_idx ON documents (content_hash);
CREATE INDEX IF NOT EXISTS documents_kind_idx ON documents (kind);

CREATE TABLE IF NOT EXISTS chunks (
    id           bigserial PRIMARY KEY,
    document_id  bigint NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
    ordinal      int NOT NULL,
    heading      text NOT NULL DEFAULT '',
    start_line   int NOT NULL,
    end_line     int NOT NULL,
    token_count  int NOT NULL,
    chunk_hash   text NOT NULL,
    text         text NOT NULL,
    tsv          tsvector GENERATED ALWAYS AS (
                    setweight(to_tsvector('english', heading), 'A') || to_tsvector('english', text)
                 ) STORED,
    UNIQUE (document_id, ordinal)
);
CREATE INDEX IF NOT EXISTS chunks_hash_idx ON chunks (chunk_hash);
CREATE INDEX IF NOT EXISTS chunks_tsv_idx ON chunks USING gin (tsv);

-- Each (model, dimension) is its own vector space with its own table embeddings_<id>:
-- vectors of different models never share a column or an index (invariant 7).
CREATE TABLE IF NOT EXISTS embedding_spaces (
    id          serial PRIMARY KEY,
    model       text NOT NULL,
    dimension   int NOT NULL,
    table_name  text NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now(),
    activated_at timestamptz,            -- set when this space became the one queries use
    UNIQUE (model, dimension)
);

-- Signposts are content-addressed: (document hash, generator, model, prompt version) -> JSON.
CREATE TABLE IF NOT EXISTS signposts (
    content_hash    text NOT NULL,
    generator       text NOT NULL,       -- extractive | gemini
    model           text NOT NULL,       -- '' for extractive
    prompt_version  text NOT NULL,
    schema_version  int NOT NULL,
    payload         jsonb NOT NULL,
    input_tokens    int NOT NULL DEFAULT 0,
    output_tokens   int NOT NULL DEFAULT 0,
    seconds         real NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (content_hash, generator, model, prompt_version)
);

-- Per-document signpost state: which signpost it shows, and failures (stale-on-failure, parked).
CREATE TABLE IF NOT EXISTS signpost_state (
    document_id     bigint PRIMARY KEY REFERENCES documents(id) ON DELETE CASCADE,
    content_hash    text,                -- hash of the document version the current signpost describes
    generator       text,
    model           text,
    prompt_version  text,
    stale           boolean NOT NULL DEFAULT false,
    failures        int NOT NULL DEFAULT 0,
    parked          boolean NOT NULL DEFAULT false,
    last_error      text,
    last_attempt_at timestamptz
);

CREATE TABLE IF NOT EXISTS runs (
    id          bigserial PRIMARY KEY,
    source_key  text NOT NULL,
    stage       text NOT NULL,           -- documents | chunks | embeddings | signposts
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    status      text NOT NULL DEFAULT 'running',
    stats       jsonb NOT NULL DEFAULT '{}'::jsonb,
    error       text
);
