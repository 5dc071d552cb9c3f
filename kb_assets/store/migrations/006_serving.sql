-- kb serve: bearer tokens (stored hashed) and their rate-limit buckets, one row per token.
-- The HMAC key lives here too: every server process and worker sharing this database agrees on it.
CREATE TABLE IF NOT EXISTS serve_secret (
    id          int PRIMARY KEY CHECK (id = 1),
    secret      bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS api_tokens (
    name            text PRIMARY KEY,
    token_hash      bytea NOT NULL UNIQUE,     -- HMAC-SHA256(serve_secret, token): the token itself is never stored
    prefix          text NOT NULL,             -- the first characters, to tell tokens apart in `kb token list`
    rate_text       text NOT NULL,             -- as given: "60/min"
    rate_per_s      double precision NOT NULL CHECK (rate_per_s > 0),
    burst           double precision NOT NULL CHECK (burst >= 1),
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz,
    revoked_at      timestamptz,
    last_used_at    timestamptz,
    -- token bucket: level at bucket_at; refilled lazily by the one UPDATE each request makes
    bucket_level    double precision NOT NULL,
    bucket_at       timestamptz NOT NULL DEFAULT now()
);
