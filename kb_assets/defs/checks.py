"""Asset checks: the index is complete, has no orphans, and signposting is not failing."""

import dagster as dg

from kb_assets.defs.assets import kb_chunks, kb_embeddings, kb_search_index, kb_signposts
from kb_assets.defs.resources import KbResource
from kb_assets.pipeline.embeddings import count_missing
from kb_assets.store import spaces

SIGNPOST_FAILURE_RATE_LIMIT = 0.05


@dg.asset_check(asset=kb_embeddings, description="Every chunk has a vector for the configured model.")
def every_chunk_embedded(kb: KbResource) -> dg.AssetCheckResult:
    embedder = kb.embedder()
    with kb.connect() as conn:
        table = spaces.space_table(conn, embedder.model, embedder.dimension)
        total = conn.execute("SELECT count(DISTINCT chunk_hash) FROM chunks").fetchone()[0]
        missing = total if table is None else count_missing(conn, table)
    return dg.AssetCheckResult(passed=missing == 0, metadata={
        "model": embedder.model, "dimension": embedder.dimension, "chunk_hashes": total, "missing": missing})


@dg.asset_check(asset=kb_chunks, description="No chunk without a live document, no vector without a chunk.")
def no_orphans(kb: KbResource) -> dg.AssetCheckResult:
    with kb.connect() as conn:
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
    return dg.AssetCheckResult(
        passed=orphan_chunks == 0 and orphan_vectors == 0,
        metadata={"orphan_chunks": orphan_chunks, "orphan_vectors": orphan_vectors,
                  "documents_awaiting_chunking": stale_chunks})


@dg.asset_check(asset=kb_signposts, description=f"Under {SIGNPOST_FAILURE_RATE_LIMIT:.0%} of documents failing.")
def signpost_failure_rate(kb: KbResource) -> dg.AssetCheckResult:
    with kb.connect() as conn:
        active, failing, parked = conn.execute(
            "SELECT count(*), count(s.document_id) FILTER (WHERE s.failures > 0 OR s.stale),"
            " count(s.document_id) FILTER (WHERE s.parked)"
            " FROM documents d LEFT JOIN signpost_state s ON s.document_id = d.id WHERE d.status = 'active'"
        ).fetchone()
    rate = failing / active if active else 0.0
    return dg.AssetCheckResult(
        passed=rate <= SIGNPOST_FAILURE_RATE_LIMIT,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"documents": active, "failing": failing, "parked": parked, "failure_rate": round(rate, 4)})


@dg.asset_check(asset=kb_search_index, description=(
    "The committed regression set (agent-style queries over a fixed corpus shipped in kb_assets/query/"
    "regression/) finds its expected documents in the top 3, with the configured embedder. The corpus is "
    "indexed into its own schema (kb's schema + _regression), so the check never touches the real index. It "
    "runs again only when something it depends on changed (either index, the embedder, the query code): "
    "otherwise it reports its stored result, marked reused, without loading the model; query vectors are "
    "cached per model."))
def recall_regression_set(kb: KbResource) -> dg.AssetCheckResult:
    from kb_assets.pipeline.regression_check import run_regression_check

    report = run_regression_check(kb.config, kb.embedder())
    misses = [d for d in report["details"] if not d["ok"]]
    return dg.AssetCheckResult(
        passed=report["passed"], severity=dg.AssetCheckSeverity.WARN,
        metadata={"hits": report["hits"], "total": report["total"], "mrr": report["mrr"],
                  "reused": report["reused"], "checked_at": report.get("checked_at") or "now",
                  "query_vectors_embedded": report["query_vectors_embedded"],
                  "misses": dg.MetadataValue.json([{k: d[k] for k in ("id", "query", "expected", "got")}
                                                   for d in misses])})
