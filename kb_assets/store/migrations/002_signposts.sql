-- Signposts: which model actually answered (the fallback after a truncated / unparseable answer), how many
-- segments a long document was split into, and per-document failure bookkeeping for stale-on-failure and parking.
ALTER TABLE signposts ADD COLUMN IF NOT EXISTS kind text NOT NULL DEFAULT '';
ALTER TABLE signposts ADD COLUMN IF NOT EXISTS model_used text NOT NULL DEFAULT '';
ALTER TABLE signposts ADD COLUMN IF NOT EXISTS segments int NOT NULL DEFAULT 1;

-- failed_hash / failed_version: the document version and (generator/model/prompt_version) the failures are about.
-- A parked document is retried only when one of them changes.
ALTER TABLE signpost_state ADD COLUMN IF NOT EXISTS failed_hash text;
ALTER TABLE signpost_state ADD COLUMN IF NOT EXISTS failed_version text;
ALTER TABLE signpost_state ADD COLUMN IF NOT EXISTS last_attempts int NOT NULL DEFAULT 0;   -- API attempts, last try
ALTER TABLE signpost_state ADD COLUMN IF NOT EXISTS updated_at timestamptz NOT NULL DEFAULT now();
