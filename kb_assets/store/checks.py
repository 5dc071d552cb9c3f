"""The asset checks' evaluations, without Dagster: one function per check, each returning a CheckOutcome.

`kb_assets/defs/checks.py` turns them into Dagster's AssetCheckResult; `kb index` runs them itself after a
source it indexed without a Dagster run (pipeline/direct_run.py), and the `kb_direct_runs_sensor` reports
what they found to Dagster. One evaluation, whoever runs it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

    from kb_assets.config import KbConfig, SourceConfig

SIGNPOST_FAILURE_RATE_LIMIT = 0.05


@dataclass
class CheckOutcome:
    name: str                       # the Dagster check's name
    asset: str                      # the asset it checks
    passed: bool
    severity: str = "error"         # "error" | "warn" (Dagster's AssetCheckSeverity)
    description: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)   # plain values, lists and dicts (JSON)
    tables: dict[str, tuple[list[dict], list[str]]] = field(default_factory=dict)   # name -> (rows, columns)

    def as_json(self) -> dict:
        return {"name": self.name, "asset": self.asset, "passed": self.passed, "severity": self.severity,
                "description": self.description, "metadata": self.metadata,
                "tables": {k: {"rows": rows, "columns": cols} for k, (rows, cols) in self.tables.items()}}

    @classmethod
    def from_json(cls, d: dict) -> "CheckOutcome":
        return cls(d["name"], d["asset"], d["passed"], d.get("severity", "error"), d.get("description"),
                   d.get("metadata") or {},
                   {k: (t["rows"], t["columns"]) for k, t in (d.get("tables") or {}).items()})


def every_chunk_embedded(conn: psycopg.Connection, model: str, dimension: int, *,
                         coverage: dict | None = None) -> CheckOutcome:
    """`coverage`: a health.chunk_coverage of this model's space taken after the stages (the direct run
    shares one scan among the checks); computed here otherwise."""
    from kb_assets.store import health, spaces

    table = spaces.space_table(conn, model, dimension)
    if coverage is None or coverage["table"] != table:
        coverage = health.chunk_coverage(conn, table)
    # per source, for the data engineer: which partition is incomplete
    per_source = [{"source": key, "chunks": row["chunks"], "missing": row["without_vector"]}
                  for key, row in sorted(coverage["sources"].items())]
    missing = coverage["missing_hashes"]
    return CheckOutcome("every_chunk_embedded", "kb_embeddings", missing == 0, metadata={
        "model": model, "dimension": dimension, "chunk_hashes": coverage["chunk_hashes"], "missing": missing},
        tables={"sources": (per_source, ["source", "chunks", "missing"])})


def no_orphans(conn: psycopg.Connection, *, coverage: dict | None = None) -> CheckOutcome:
    from psycopg import sql

    from kb_assets.store import spaces

    if coverage is not None:
        orphan_chunks = coverage["orphan_chunks"]
    else:
        orphan_chunks = conn.execute(
            "SELECT count(*) FROM chunks c LEFT JOIN documents d ON d.id = c.document_id"
            " WHERE d.id IS NULL OR d.status <> 'active'").fetchone()[0]
    stale_chunks = conn.execute(
        "SELECT count(*) FROM documents WHERE status = 'active' AND chunked_hash IS DISTINCT FROM content_hash"
    ).fetchone()[0]
    orphan_vectors = 0
    for (table,) in conn.execute("SELECT table_name FROM embedding_spaces").fetchall():
        with spaces.merge_anti_joins(conn):
            orphan_vectors += conn.execute(sql.SQL("SELECT count(*) FROM ({orphans}) o").format(
                orphans=spaces.vectors_without_chunk(table))).fetchone()[0]
    return CheckOutcome("no_orphans", "kb_chunks", orphan_chunks == 0 and orphan_vectors == 0, metadata={
        "orphan_chunks": orphan_chunks, "orphan_vectors": orphan_vectors,
        "documents_awaiting_chunking": stale_chunks})


def signpost_failure_rate(conn: psycopg.Connection) -> CheckOutcome:
    active, failing, parked = conn.execute(
        "SELECT count(*), count(s.document_id) FILTER (WHERE s.failures > 0 OR s.stale),"
        " count(s.document_id) FILTER (WHERE s.parked)"
        " FROM documents d LEFT JOIN signpost_state s ON s.document_id = d.id WHERE d.status = 'active'"
    ).fetchone()
    rate = failing / active if active else 0.0
    return CheckOutcome("signpost_failure_rate", "kb_signposts", rate <= SIGNPOST_FAILURE_RATE_LIMIT, "warn",
                        metadata={"documents": active, "failing": failing, "parked": parked,
                                  "failure_rate": round(rate, 4)})


def recall_regression_set(cfg: KbConfig, embedder) -> CheckOutcome:
    """Runs (or reuses) the regression set in its own schema: no connection of the caller's is used."""
    from kb_assets.pipeline.regression_check import run_regression_check

    report = run_regression_check(cfg, embedder)
    misses = [d for d in report["details"] if not d["ok"]]
    return CheckOutcome("recall_regression_set", "kb_search_index", report["passed"], "warn", metadata={
        "hits": report["hits"], "total": report["total"], "mrr": report["mrr"], "reused": report["reused"],
        "checked_at": report.get("checked_at") or "now", "query_vectors_embedded": report["query_vectors_embedded"],
        "misses": [{k: d[k] for k in ("id", "query", "expected", "got")} for d in misses]})


def indexed_commit_matches_tip(conn: psycopg.Connection, cfg: KbConfig,
                               sources: list[SourceConfig]) -> CheckOutcome:
    from kb_assets.store.health import drift

    rows = [drift(conn, cfg, s) for s in sources]
    drifted = [r for r in rows if r["drifted"]]
    return CheckOutcome(
        "indexed_commit_matches_tip", "kb_documents", not drifted, "warn",
        description=(f"{len(drifted)} source(s) behind their tip: " + ", ".join(r["source"] for r in drifted)
                     if drifted else "every git source is indexed at its tip"),
        metadata={"drifted": len(drifted)},
        tables={"sources": ([{"source": r["source"], "ref": r["ref"] or "(not git)",
                              "indexed": (r["indexed_commit"] or "-")[:12], "tip": (r["tip_commit"] or "-")[:12],
                              "commits behind": r["commits_behind"], "drifted": r["drifted"]} for r in rows],
                            ["source", "ref", "indexed", "tip", "commits behind", "drifted"])})


def vector_keyword_parity(conn: psycopg.Connection, sources: list[SourceConfig], *,
                          coverage: dict | None = None) -> CheckOutcome:
    """`coverage`: as every_chunk_embedded's (used when it is of the active space)."""
    from kb_assets.store import health, spaces

    active = spaces.active_space(conn)
    table = active[2] if active else None
    if coverage is None or coverage["table"] != table:
        coverage = health.chunk_coverage(conn, table)
    rows = [health.parity_from(coverage, active, s.key) for s in sources]
    no_vec = sum(r["without_vector"] for r in rows)
    no_kw = sum(r["without_keywords"] for r in rows)
    return CheckOutcome(
        "vector_keyword_parity", "kb_search_index", no_vec == 0 and no_kw == 0,
        description=("every active chunk has both" if not (no_vec or no_kw)
                     else f"{no_vec} chunk(s) without a vector, {no_kw} without keywords"),
        metadata={"chunks": sum(r["chunks"] for r in rows), "without_vector": no_vec, "without_keywords": no_kw},
        tables={"sources": (rows, ["source", "active_space", "chunks", "without_vector", "without_keywords"])})


def tags_in_vocabulary(conn: psycopg.Connection, cfg: KbConfig) -> CheckOutcome:
    from kb_assets.projections.report import tags_report

    report = tags_report(conn, cfg)
    outside = report["outside"]
    return CheckOutcome("tags_in_vocabulary", "kb_projections", not outside, "warn", metadata={
        "governed": report["governed"], "vocabulary": len(report["vocabulary"]), "tags_used": len(report["tags"]),
        "outside": len(outside), "outside_tags": dict(list(outside.items())[:100])})
