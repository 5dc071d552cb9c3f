"""Asset checks: the index is complete, has no orphans, and signposting is not failing."""

import dagster as dg

from kb_assets.defs.assets import (kb_chunks, kb_documents, kb_embeddings, kb_projections, kb_search_index,
                                   kb_signposts)
from kb_assets.defs.resources import KbResource
from kb_assets.pipeline.embeddings import count_missing
from kb_assets.store import spaces

SIGNPOST_FAILURE_RATE_LIMIT = 0.05


@dg.asset_check(asset=kb_embeddings, description="Every chunk has a vector for the configured model.")
def every_chunk_embedded(kb: KbResource) -> dg.AssetCheckResult:
    embedder = kb.embedder()

    def read(conn):
        table = spaces.space_table(conn, embedder.model, embedder.dimension)
        total = conn.execute("SELECT count(DISTINCT chunk_hash) FROM chunks").fetchone()[0]
        missing = total if table is None else count_missing(conn, table)
        # per source, for the data engineer: which partition is incomplete
        per_source = [dict(zip(("source", "chunks", "missing"), r)) for r in conn.execute(
            "SELECT d.source_key, count(*), count(*) FILTER (WHERE %s::text IS NULL OR NOT EXISTS"
            " (SELECT 1 FROM " + (f'"{table}"' if table else "(SELECT NULL::text AS chunk_hash) z") +
            " e WHERE e.chunk_hash = c.chunk_hash))"
            " FROM chunks c JOIN documents d ON d.id = c.document_id WHERE d.status = 'active'"
            " GROUP BY 1 ORDER BY 1", (table,)).fetchall()]
        return total, missing, per_source

    # checks retry a database that is restarting like the stages do (no source lock: they only read)
    total, missing, per_source = kb.run_stage(None, read, lock=False)
    return dg.AssetCheckResult(passed=missing == 0, metadata={
        "model": embedder.model, "dimension": embedder.dimension, "chunk_hashes": total, "missing": missing,
        "sources": _md_table(per_source, ["source", "chunks", "missing"])})


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


@dg.asset_check(asset=kb_search_index, description=(
    "The committed regression set (agent-style queries over a fixed corpus shipped in kb_assets/query/"
    "regression/) finds its expected documents in the top 3, with the configured embedder. The corpus is "
    "indexed into its own schema (kb's schema + _regression), so the check never touches the real index. It "
    "runs again only when something it depends on changed (either index, the embedder, the query code): "
    "otherwise it reports its stored result, marked reused, without loading the model; query vectors are "
    "cached per model."))
def recall_regression_set(kb: KbResource) -> dg.AssetCheckResult:
    from kb_assets.pipeline.regression_check import run_regression_check

    # its schema is shared by every run: two runs at once check one after the other (the lock), and a
    # database restart is retried like the stages
    report = kb.run_stage(":regression-check", lambda conn: run_regression_check(kb.config, kb.embedder()))
    misses = [d for d in report["details"] if not d["ok"]]
    return dg.AssetCheckResult(
        passed=report["passed"], severity=dg.AssetCheckSeverity.WARN,
        metadata={"hits": report["hits"], "total": report["total"], "mrr": report["mrr"],
                  "reused": report["reused"], "checked_at": report.get("checked_at") or "now",
                  "query_vectors_embedded": report["query_vectors_embedded"],
                  "misses": dg.MetadataValue.json([{k: d[k] for k in ("id", "query", "expected", "got")}
                                                   for d in misses])})


# ---------------------------------------------------------------- per partition: drift and parity
def _run_sources(context: dg.AssetCheckExecutionContext, kb: KbResource) -> list:
    """The run's partition (a source), or every enabled source when the check runs on its own."""
    key = context.run.tags.get("dagster/partition") if context.run else None
    if key:
        return [kb.config.source(key)]
    return [s for s in kb.config.sources if s.enabled]


def _md_table(rows: list[dict], columns: list[str]) -> dg.MetadataValue:
    from kb_assets.defs.assets import _table   # one renderer, without pandas' import (assets.py)

    return _table(rows, columns)


@dg.asset_check(asset=kb_documents, description=(
    "Drift: the commit the source is indexed at is the tip of its branch (HEAD, `branch:`, or "
    "<remote>/<branch> after the sensor's fetch). Warns when the index is behind; sources that are not git "
    "have no commit and pass."))
def indexed_commit_matches_tip(context: dg.AssetCheckExecutionContext, kb: KbResource) -> dg.AssetCheckResult:
    from kb_assets.store.health import drift

    with kb.connect() as conn:
        rows = [drift(conn, kb.config, s) for s in _run_sources(context, kb)]
    drifted = [r for r in rows if r["drifted"]]
    return dg.AssetCheckResult(
        passed=not drifted, severity=dg.AssetCheckSeverity.WARN,
        description=(f"{len(drifted)} source(s) behind their tip: " + ", ".join(r["source"] for r in drifted)
                     if drifted else "every git source is indexed at its tip"),
        metadata={"drifted": len(drifted), "sources": _md_table(
            [{"source": r["source"], "ref": r["ref"] or "(not git)", "indexed": (r["indexed_commit"] or "-")[:12],
              "tip": (r["tip_commit"] or "-")[:12], "commits behind": r["commits_behind"],
              "drifted": r["drifted"]} for r in rows],
            ["source", "ref", "indexed", "tip", "commits behind", "drifted"])})


@dg.asset_check(asset=kb_search_index, description=(
    "Vector/keyword parity: every active chunk of the source has a vector in the active space and a "
    "keyword vector (tsvector), so both halves of hybrid search can find it."))
def vector_keyword_parity(context: dg.AssetCheckExecutionContext, kb: KbResource) -> dg.AssetCheckResult:
    from kb_assets.store.health import parity

    with kb.connect() as conn:
        rows = [parity(conn, s.key) for s in _run_sources(context, kb)]
    no_vec = sum(r["without_vector"] for r in rows)
    no_kw = sum(r["without_keywords"] for r in rows)
    return dg.AssetCheckResult(
        passed=no_vec == 0 and no_kw == 0,
        description=("every active chunk has both" if not (no_vec or no_kw)
                     else f"{no_vec} chunk(s) without a vector, {no_kw} without keywords"),
        metadata={"chunks": sum(r["chunks"] for r in rows), "without_vector": no_vec, "without_keywords": no_kw,
                  "sources": _md_table(rows, ["source", "active_space", "chunks", "without_vector",
                                              "without_keywords"])})


@dg.asset_check(asset=kb_projections, description=(
    "Every document tag is in the kb.yaml `tags:` vocabulary (or one of its aliases). Tags outside it get no "
    "by-tag file: add them to the vocabulary (or as aliases) or fix the documents. Passes when no vocabulary is set."))
def tags_in_vocabulary(kb: KbResource) -> dg.AssetCheckResult:
    from kb_assets.projections.report import tags_report

    with kb.connect() as conn:
        report = tags_report(conn, kb.config)
    outside = report["outside"]
    return dg.AssetCheckResult(
        passed=not outside, severity=dg.AssetCheckSeverity.WARN,
        metadata={"governed": report["governed"], "vocabulary": len(report["vocabulary"]),
                  "tags_used": len(report["tags"]), "outside": len(outside),
                  "outside_tags": dg.MetadataValue.json(dict(list(outside.items())[:100]))})
