-- Nothing changed costs nothing (issue 14 / 11 §4): what a source looked like when its last complete, successful
-- `kb index` run started (kb_assets/pipeline/source_state.py). `kb index` compares it with the source's state
-- now and, when equal, reports the source unchanged without a Dagster run. The documents stage deletes the row
-- when any run of the source starts (CLI, UI, sensor, schedule), so an interrupted or failed run, or one started
-- elsewhere, is never taken for a complete one.
CREATE TABLE IF NOT EXISTS source_state (
    source_key   text PRIMARY KEY REFERENCES sources(key) ON DELETE CASCADE,
    fingerprint  text NOT NULL,                 -- sha256 over what could change the source's index
    details      jsonb NOT NULL DEFAULT '{}',   -- the parts, readable (mode, commit, files, code version)
    recorded_at  timestamptz NOT NULL DEFAULT now()
);
