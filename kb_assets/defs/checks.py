"""Asset checks: the index is complete, has no orphans, and signposting is not failing."""

import dagster as dg

from kb_assets.defs.assets import kb_chunks, kb_embeddings, kb_search_index, kb_signposts
from kb_assets.defs.resources import KbResource
from kb_assets.pipeline.embeddings import count_missing
from kb_assets.store import spaces
from kb_assets.store.locks import ddl_lock

SIGNPOST_FAILURE_RATE_LIMIT = 0.05


@dg.asset_check(asset=kb_embeddings, description="Every chunk has a vector for the configured model.")
def every_chunk_embedded(kb: KbResource) -> dg.AssetCheckResult:
    embedder = kb.embedder()

    def read(conn):
        table = spaces.space_table(conn, embedder.model, embedder.dimension)
        total = conn.execute("SELECT count(DISTINCT chunk_hash) FROM chunks").fetchone()[0]
        return total, (total if table is None else count_missing(conn, table))

    # checks retry a database that is restarting like the stages do (no source lock: they only read)
    total, missing = kb.run_stage(None, read, lock=False)
    return dg.AssetCheckResult(passed=missing == 0, metadata={
        "model": embedder.model, "dimension": embedder.dimension, "chunk_hashes": total, "missing": missing})


@dg.asset_check(asset=kb_chunks, description="No chunk without a live document, no vector without a chunk.")
def no_orphans(kb: KbResource) -> dg.AssetCheckResult:
    def read(conn):
        orphan_chunks = conn.execute(
            "SELECT count(*) FROM chunks c LEFT JOIN documents d ON d.id = c.document_id"
            " WHERE d.id IS NULL OR d.status <> 'active'").fetchone()[0]
        stale_chunks = conn.execute(
            "SELECT count(*) FROM documents WHERE status = 'active' AND chunked_hash IS DISTINCT FROM content_hash"
        ).fetchone()[0]
        orphan_vectors = 0
        for (table,) in conn.execute("SELECT table_name FROM embedding_spaces").fetchall():
            orphan_vectors += conn.execute(
                f'SELECT count(*) FROM "{table}" e WHERE NOT EXISTS'
                f' (SELECT 1 FROM chunks c WHERE c.chunk_hash = e.chunk_hash)').fetchone()[0]
        return orphan_chunks, stale_chunks, orphan_vectors

    orphan_chunks, stale_chunks, orphan_vectors = kb.run_stage(None, read, lock=False)
    return dg.AssetCheckResult(
        passed=orphan_chunks == 0 and orphan_vectors == 0,
        metadata={"orphan_chunks": orphan_chunks, "orphan_vectors": orphan_vectors,
                  "documents_awaiting_chunking": stale_chunks})


@dg.asset_check(asset=kb_signposts, description=f"Under {SIGNPOST_FAILURE_RATE_LIMIT:.0%} of documents failing.")
def signpost_failure_rate(kb: KbResource) -> dg.AssetCheckResult:
    active, failing, parked = kb.run_stage(None, lambda conn: conn.execute(
        "SELECT count(*), count(s.document_id) FILTER (WHERE s.failures > 0 OR s.stale),"
        " count(s.document_id) FILTER (WHERE s.parked)"
        " FROM documents d LEFT JOIN signpost_state s ON s.document_id = d.id WHERE d.status = 'active'"
    ).fetchone(), lock=False)
    rate = failing / active if active else 0.0
    return dg.AssetCheckResult(
        passed=rate <= SIGNPOST_FAILURE_RATE_LIMIT,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"documents": active, "failing": failing, "parked": parked, "failure_rate": round(rate, 4)})


REGRESSION_SCHEMA = "kb_regression"


@dg.asset_check(asset=kb_search_index, description=(
    "The committed regression set (agent-style queries over a fixed corpus shipped in kb_assets/query/"
    "regression/) finds its expected documents in the top 3, with the configured embedder and query settings. "
    "The corpus is indexed into its own schema, so the check never touches the real index; after the first "
    "run it costs only the queries."))
def recall_regression_set(kb: KbResource) -> dg.AssetCheckResult:
    from kb_assets.config import SourceConfig
    from kb_assets.pipeline import index_sources
    from kb_assets.query.regression import run_regression, source_config
    from kb_assets.signposts.extractive import ExtractiveSignposter
    from kb_assets.store.db import migrate

    cfg = kb.config.model_copy(update={"sources": [SourceConfig(**source_config())]})
    embedder = kb.embedder()

    def work(conn):
        with conn.transaction():   # two runs at once: CREATE SCHEMA IF NOT EXISTS can still collide
            ddl_lock(conn)
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {REGRESSION_SCHEMA}")
        conn.execute(f"SET search_path TO {REGRESSION_SCHEMA}, public")
        migrate(conn)
        from pgvector.psycopg import register_vector

        register_vector(conn)
        # extractive signposts: the set measures retrieval, and must not spend LLM calls
        index_sources(cfg, conn, embedder=embedder, signposter=ExtractiveSignposter())
        return run_regression(conn, "regression", embedder=embedder)

    # its schema is shared by every run: two runs at once index it one after the other (the lock), and a
    # database restart is retried like the stages
    report = kb.run_stage(":regression-check", work)
    misses = [d for d in report["details"] if not d["ok"]]
    return dg.AssetCheckResult(
        passed=report["passed"], severity=dg.AssetCheckSeverity.WARN,
        metadata={"hits": report["hits"], "total": report["total"], "mrr": report["mrr"],
                  "misses": dg.MetadataValue.json([{k: d[k] for k in ("id", "query", "expected", "got")}
                                                   for d in misses])})
