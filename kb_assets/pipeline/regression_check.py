"""The regression set as a check after indexing (the Dagster asset check `recall_regression_set` calls this).

Its corpus is indexed into its own schema (`<kb schema>_regression`), beside the real index and never in it,
and its answer depends on nothing else: the regression index, the embedder, kb's code (the query code, the
query set and the corpus are files of the package) and the settings. So it costs nothing when none of those
changed, whatever happened to the real index: the result is stored in that schema with the fingerprint of the
regression index's state, the embedder and the query code, and with the digest of its inputs (kb's code and the
settings, `inputs_digest`). When both still hold, the stored result is reported, marked `reused`, without
indexing the corpus again, loading the model or calling an API (a small `kb index` of the real corpus paid
~0.7 s for that before). When something did change, the corpus is indexed (a no-op unless it changed) and the
set runs; the 26 queries' vectors come from a cache per (model, dimension), so they are embedded once per
model, not once per run.
"""
from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

CHECK_NAME = "recall_regression_set"


class CachedQueryEmbedder:
    """An embedder's `embed_query`, memoised in the `query_vectors` table of the connection's schema.

    `embedded` counts the texts that really went to the embedder (0 once the cache holds the query set).
    recall() calls embed_query in a thread of its own while it searches on the connection, so new vectors are
    kept in memory and written by save(), in the caller's thread: the connection is never used by two threads
    at once (it was: "cannot enter pipeline mode, connection not idle", a retried check)."""

    def __init__(self, conn, embedder):
        self.conn, self.inner = conn, embedder
        self.model, self.dimension = embedder.model, int(embedder.dimension)
        self.embedded = 0
        self._memo: dict[str, list[float]] = {}
        self._new: dict[str, list[float]] = {}

    def preload(self, texts: list[str]) -> int:
        """Read the cached vectors of `texts` in one query; returns how many were found."""
        keys = {_md5(t): t for t in texts}
        rows = self.conn.execute(
            "SELECT text_md5::text, embedding FROM query_vectors WHERE model = %s AND dimension = %s"
            " AND text_md5 = ANY(%s::uuid[])", (self.model, self.dimension, list(keys))).fetchall()
        for md5, vec in rows:
            self._memo[keys[md5]] = [float(x) for x in vec]
        return len(rows)

    def embed_query(self, text: str) -> list[float]:
        vec = self._memo.get(text)
        if vec is None:
            import numpy as np

            vec = [float(x) for x in np.asarray(self.inner.embed_query(text), dtype=np.float32)]
            self.embedded += 1
            self._memo[text] = self._new[text] = vec
        return vec

    def save(self) -> int:
        """Write the vectors embedded since the last save (on the connection's own thread); returns how many."""
        new, self._new = self._new, {}
        if new:
            with self.conn.transaction(), self.conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO query_vectors (model, dimension, text_md5, embedding) VALUES (%s, %s, %s::uuid, %s)"
                    " ON CONFLICT DO NOTHING", [(self.model, self.dimension, _md5(t), v) for t, v in new.items()])
        return len(new)


def _md5(text: str) -> str:
    """As PostgreSQL prints md5(text)::uuid."""
    return str(uuid.UUID(hashlib.md5(text.encode("utf-8")).hexdigest()))


def _index_state(conn) -> list[Any]:
    """What recall() reads, summarised: statistics watermark and refresh time, the active space, documents."""
    return [list(r) if r else None for r in (
        conn.execute("SELECT n_chunks, n_lexemes, chunk_watermark, vector_space, refreshed_at::text"
                     " FROM query_stats WHERE id = 1").fetchone(),
        conn.execute("SELECT model, dimension, table_name, activated_at::text FROM embedding_spaces"
                     " WHERE activated_at IS NOT NULL ORDER BY activated_at DESC LIMIT 1").fetchone(),
        conn.execute("SELECT count(*), max(updated_at)::text FROM documents").fetchone(),
    )]


def _code_hash() -> str:
    """The query code and the query set: a change of either is a change of what the check measures."""
    from kb_assets.query.regression import QUERIES_FILE

    h = hashlib.sha256()
    for path in sorted(Path(QUERIES_FILE).parent.parent.glob("*.py")) + [Path(QUERIES_FILE)]:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def fingerprint(regression_conn, embedder, k: int) -> str:
    """What the result depends on, as the regression schema shows it now."""
    parts = {"regression_index": _index_state(regression_conn),
             "embedder": [embedder.model, int(embedder.dimension)], "k": k, "code": _code_hash()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def inputs_digest(reg_cfg, embedder, k: int) -> str:
    """What indexing the regression corpus depends on: kb's code and files (the corpus among them), every
    setting, the embedder. Equal to the stored one (and the fingerprint equal too): the corpus need not be
    indexed again to know the stored result holds."""
    from kb_assets.pipeline.source_state import code_version, settings_digest

    parts = [code_version(), settings_digest(reg_cfg, reg_cfg.sources[0]), embedder.model,
             int(embedder.dimension), k]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


def run_regression_check(cfg, embedder, *, k: int = 3, force: bool = False) -> dict[str, Any]:
    """Index the regression corpus (a no-op when it is unchanged) and run the set, unless the stored result's
    fingerprint still holds. Returns run_regression's report plus `reused`, `fingerprint`,
    `query_vectors_embedded` and `documents_embedded`."""
    from kb_assets.config import SourceConfig
    from kb_assets.pipeline import index_sources
    from kb_assets.query.regression import load_queries, run_regression, source_config
    from kb_assets.signposts.extractive_signposter import ExtractiveSignposter
    from kb_assets.store.db import connect, open_database
    from kb_assets.store.locks import source_lock
    from kb_assets.store.schema import regression_schema

    main_url = open_database(cfg)   # kb's own schema first: an old install in public moves there, not here
    reg_cfg = cfg.model_copy(update={"sources": [SourceConfig(**source_config())]})
    inputs = inputs_digest(reg_cfg, embedder, k)
    # its schema is shared by every run: two runs at once index it and check one after the other
    with source_lock(main_url, ":regression-check"), \
            connect(open_database(cfg, schema=regression_schema(cfg.effective_schema()))) as conn:
        row = conn.execute("SELECT fingerprint, result, checked_at::text FROM check_results WHERE name = %s",
                           (CHECK_NAME,)).fetchone()
        if row is not None and not force and row[1].get("inputs") == inputs \
                and row[0] == fingerprint(conn, embedder, k):
            return {**row[1], "reused": True, "checked_at": row[2], "fingerprint": row[0],
                    "query_vectors_embedded": 0, "documents_embedded": 0}
        # extractive signposts: the set measures retrieval, and must not spend LLM calls
        runs = index_sources(reg_cfg, conn, embedder=embedder, signposter=ExtractiveSignposter())
        embedded = sum(r.embeddings.chunks_embedded for r in runs.values())
        fp = fingerprint(conn, embedder, k)
        if row is not None and row[0] == fp and not force:
            if row[1].get("inputs") != inputs:   # indexed again to the same state: the result holds
                conn.execute("UPDATE check_results SET result = result || %s::jsonb WHERE name = %s",
                             (json.dumps({"inputs": inputs}), CHECK_NAME))
            return {**row[1], "reused": True, "checked_at": row[2], "fingerprint": fp,
                    "query_vectors_embedded": 0, "documents_embedded": embedded}
        cached = CachedQueryEmbedder(conn, embedder)
        cached.preload([q["query"] for q in load_queries()])
        report = run_regression(conn, "regression", k=k, embedder=cached)
        cached.save()
        conn.execute(
            "INSERT INTO check_results (name, fingerprint, result) VALUES (%s, %s, %s::jsonb)"
            " ON CONFLICT (name) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, result = EXCLUDED.result,"
            " checked_at = now()", (CHECK_NAME, fp, json.dumps({**report, "inputs": inputs}, default=str)))
    return {**report, "reused": False, "fingerprint": fp, "query_vectors_embedded": cached.embedded,
            "documents_embedded": embedded}
