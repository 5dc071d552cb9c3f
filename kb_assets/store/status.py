"""What `kb status` and the Dagster checks read: per-source counts, skips with reasons, freshness."""
from __future__ import annotations

from pathlib import Path

import psycopg

from kb_assets.sources.gitutil import head_commit
from kb_assets.store import health, spaces


def source_status(conn: psycopg.Connection, source_keys: list[str] | None = None,
                  model: str | None = None, dimension: int | None = None, config=None,
                  coverage: dict[str, dict] | None = None) -> list[dict]:
    """One dict per source. `embedded` counts active chunks with a vector for (model, dimension)
    (default: the active space). With `config`, a source that sets `branch:`/`remote:` is fresh against
    that branch's tip (what the sensor indexes), not the checkout's HEAD. `coverage`: source -> a
    health.chunk_coverage its run took after its last write (`kb index`: the direct run's checks); the
    source's chunks and those without a vector come from it when it is of the same space table."""
    tips: dict[str, str | None] = {}
    if config is not None:
        from kb_assets.sources.discovery import tip_commit

        for s in config.sources:
            if not s.use_git:         # walked even inside a work tree: no commit to be fresh against
                tips[s.key] = None
            elif s.branch or s.remote:
                tips[s.key] = tip_commit(config.source_root(s), s)
    table = None
    if model and dimension:
        table = spaces.space_table(conn, model, dimension)
    else:
        active = spaces.active_space(conn)
        table = active[2] if active else None
        model, dimension = (active[0], active[1]) if active else (None, None)
    index_state = spaces.vector_index_state(conn, table) if table else None
    vector_index = index_state == "ready"

    rows = conn.execute(
        "SELECT key, kind, root, indexed_commit, listed_at, last_run_at, last_run_status, last_run_stats"
        " FROM sources WHERE %s::text[] IS NULL OR key = ANY(%s) ORDER BY key",
        (source_keys, source_keys)).fetchall()
    result = []
    for key, kind, root, commit, listed_at, last_run_at, last_status, last_stats in rows:
        counts = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'active'), count(*) FILTER (WHERE status = 'skipped')"
            " FROM documents WHERE source_key = %s", (key,)).fetchone()
        if table:
            chunks, without = (health.source_counts((coverage or {}).get(key), table, key)
                               or spaces.chunks_without_vector(conn, table, key))
            embedded = chunks - without
        else:
            chunks = conn.execute(
                "SELECT count(*) FROM chunks c JOIN documents d ON d.id = c.document_id WHERE d.source_key = %s",
                (key,)).fetchone()[0]
            embedded = 0
        signposted = conn.execute(
            "SELECT count(*) FROM signpost_state s JOIN documents d ON d.id = s.document_id"
            " WHERE d.source_key = %s AND d.status = 'active' AND s.content_hash = d.content_hash", (key,)
        ).fetchone()[0]
        signpost_problems = conn.execute(
            "SELECT count(*) FILTER (WHERE s.stale), count(*) FILTER (WHERE s.parked)"
            " FROM signpost_state s JOIN documents d ON d.id = s.document_id WHERE d.source_key = %s", (key,)
        ).fetchone()
        skipped = [
            {"path": p, "reason": r, "detail": d or ""}
            for p, r, d in conn.execute(
                "SELECT path, skip_reason, skip_detail FROM documents WHERE source_key = %s AND status = 'skipped'"
                " ORDER BY skip_reason, path", (key,))
        ]
        reasons: dict[str, int] = {}
        for s in skipped:
            reasons[s["reason"]] = reasons.get(s["reason"], 0) + 1
        head = tips[key] if key in tips else head_commit(Path(root)) if Path(root).is_dir() else None
        result.append({
            "source": key, "kind": kind, "root": root,
            "documents": counts[0], "chunks": chunks, "embedded": embedded,
            "signposted": signposted, "signposts_stale": signpost_problems[0], "signposts_parked": signpost_problems[1],
            "skipped": counts[1], "skip_reasons": reasons, "skipped_files": skipped,
            "indexed_commit": commit, "head_commit": head,
            "fresh": (commit == head) if head else None,
            "listed_at": listed_at.isoformat() if listed_at else None,
            "last_run_at": last_run_at.isoformat() if last_run_at else None,
            "last_run_status": last_status, "last_run": last_stats or {},
            "embedding_model": model, "embedding_dimension": dimension,
            "vector_index": vector_index,   # False between a large load and the search-index stage
            "vector_index_state": index_state,   # ready | building (in the background) | missing | None
        })
    return result


# This process's own figures per source, when a caller (the `kb index` command) asked for them: the
# `sources` row is shared with every other run, so a summary read from it showed another run's work.
_captured: dict[str, dict] | None = None


def capture_runs() -> None:
    """From now on, keep what record_run records in this process (see captured_run)."""
    global _captured
    _captured = {}


def captured_run(source_key: str) -> dict:
    """The stage figures this process recorded for the source since capture_runs() ({}: none)."""
    return dict((_captured or {}).get(source_key, {}))


def record_run(conn: psycopg.Connection, source_key: str, status: str, stats: dict) -> None:
    if _captured is not None:
        _captured.setdefault(source_key, {}).update(stats)
    conn.execute(
        "UPDATE sources SET last_run_at = now(), last_run_status = %s, last_run_stats = last_run_stats || %s::jsonb"
        " WHERE key = %s", (status, psycopg.types.json.Json(stats), source_key))


def status_report(conn: psycopg.Connection, configured: list[str], config=None) -> dict:
    """The JSON of `kb status --json` (also GET /api/v1/status, the MCP status tool): every source's status,
    whether it is configured, its failing signposts, the configured sources never indexed and, with `config`,
    freshness against a configured branch and the include globs that match nothing (`warnings`)."""
    rows = source_status(conn, None, config=config)
    failures: dict[str, list] = {}
    try:
        from kb_assets.pipeline.signposts import signpost_failures

        for r in rows:
            failures[r["source"]] = signpost_failures(conn, r["source"])
    except ImportError:
        pass
    for r in rows:
        r["configured"] = r["source"] in configured
        r["signpost_failures"] = failures.get(r["source"], [])
    never = [k for k in configured if k not in {r["source"] for r in rows}]
    report = {"sources": rows, "never_indexed": never}
    if config is not None:
        from kb_assets.guards import glob_warnings

        report["warnings"] = glob_warnings(conn, config)
    return report
