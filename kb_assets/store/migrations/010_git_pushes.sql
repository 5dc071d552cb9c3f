-- Pushes received by POST /hooks/git (kb_assets/serving/webhooks.py), read by git_commit_sensor.
-- delivery_id is unique: a replayed or redelivered webhook is recorded once.
CREATE TABLE IF NOT EXISTS git_pushes (
    id           bigserial PRIMARY KEY,
    delivery_id  text NOT NULL UNIQUE,         -- X-GitHub-Delivery / X-Gitlab-Event-UUID, else the body's sha256
    provider     text NOT NULL,                -- github | gitlab
    repository   text,                         -- owner/name or group/project
    repo_urls    text[] NOT NULL DEFAULT '{}', -- clone / ssh / web URLs, matched against a source's remote URL
    ref          text,                         -- refs/heads/<branch>
    before_sha   text,
    after_sha    text,
    forced       boolean NOT NULL DEFAULT false,
    received_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS git_pushes_received_at ON git_pushes (received_at);
