-- Runs that `kb index` made without Dagster (a small change to a source indexed before: pipeline/direct_run.py).
-- Each row holds what the run's assets and checks would have reported to Dagster; the `kb_direct_runs` sensor
-- reports them to the Dagster instance (asset materializations and check evaluations), its cursor the last id.
CREATE TABLE IF NOT EXISTS direct_runs (
    id           bigserial PRIMARY KEY,
    source_key   text NOT NULL,
    started_at   timestamptz NOT NULL,
    finished_at  timestamptz NOT NULL DEFAULT now(),
    assets       jsonb NOT NULL DEFAULT '{}',  -- asset name -> its materialization's metadata
    checks       jsonb NOT NULL DEFAULT '[]'   -- CheckOutcome.as_json() of each check (kb_assets/store/checks.py)
);
CREATE INDEX IF NOT EXISTS direct_runs_finished_at ON direct_runs (finished_at);
