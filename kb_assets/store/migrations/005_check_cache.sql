-- What lets a nothing-changed `kb index` cost nothing (issue 11 §4): the last result of a check with the
-- fingerprint of everything it depends on (unchanged fingerprint: the stored result is reported, marked as
-- reused), and query vectors cached per (model, dimension, text) so a query set is embedded once.
CREATE TABLE IF NOT EXISTS check_results (
    name         text PRIMARY KEY,
    fingerprint  text NOT NULL,
    result       jsonb NOT NULL,
    checked_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS query_vectors (
    model       text NOT NULL,
    dimension   int NOT NULL,
    text_md5    uuid NOT NULL,
    embedding   real[] NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (model, dimension, text_md5)
);
