"""What the per-partition checks read (no Dagster): drift between the indexed commit and the source's tip,
vector/keyword parity of the active chunks, and include globs that match nothing."""
from __future__ import annotations

from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from kb_assets.store import spaces

if TYPE_CHECKING:
    from kb_assets.config import KbConfig, SourceConfig


def drift(conn: psycopg.Connection, cfg: KbConfig, source: SourceConfig) -> dict:
    """{indexed_commit, tip_commit, ref, commits_behind, drifted}: drifted is True when a git source's
    indexed commit is not its tip (None for sources that are not git)."""
    from kb_assets.sources import discovery
    from kb_assets.sources.gitutil import GitError, run_git
    from kb_assets.sources.watch import is_git_source

    row = conn.execute("SELECT indexed_commit FROM sources WHERE key = %s", (source.key,)).fetchone()
    indexed = row[0] if row else None
    out = {"source": source.key, "indexed_commit": indexed, "tip_commit": None, "ref": None,
           "commits_behind": None, "drifted": None}
    if not is_git_source(cfg, source):
        return out
    root = cfg.source_root(source)
    ref = discovery.tip_ref(root, source) if source.content == "HEAD" else "HEAD"
    tip = discovery.tip_commit(root, source) if source.content == "HEAD" else discovery.head_commit(root)
    out.update(ref=ref, tip_commit=tip, drifted=(tip is not None and indexed != tip))
    if tip and indexed and indexed != tip:
        try:
            p = run_git(root, "rev-list", "--count", f"{indexed}..{tip}", check=False, timeout=60)
            out["commits_behind"] = int(p.stdout.strip()) if p.returncode == 0 else None
        except (GitError, ValueError):
            pass
    return out


# a chunk with words but an empty keyword vector: keyword search can never find it. Migration 016's partial index
# has this predicate (without the alias): keep the two the same, or the count below reads every chunk again.
_NO_KEYWORDS = "c.tsv IS NULL OR (c.tsv = ''::tsvector AND c.text ~ '[[:alpha:]]{2}')"


def chunk_coverage(conn: psycopg.Connection, table: str | None) -> dict:
    """Every chunk against its document and its vector in `table` (None: no space yet), in one statement —
    what the checks every_chunk_embedded, vector_keyword_parity and no_orphans each counted with their own
    scans (up to five, correlated, ~0.3 s each on 55K chunks):

    {"table", "sources": {key: {"chunks", "without_vector", "without_keywords"}} over active documents,
     "orphan_chunks": chunks of no active document, "chunk_hashes" / "missing_hashes": distinct texts over
     every chunk, and those without a vector}.

    No part reads the chunks' heap, where their text is: the counts per document come from the (document_id,
    ordinal) key, index-only; the texts without a vector from the space's missing hashes (spaces.
    hashes_without_vector: index-only, normally none); those without keywords from migration 016's partial index
    (normally empty). One join over every chunk's row read the whole table instead: 21-31 ms on the PEPs' 26K
    chunks, on every small pass (docs/BENCHMARKS.md, "Small passes: one anti-join plan")."""
    missing = spaces.hashes_without_vector(table) if table else \
        sql.SQL("SELECT DISTINCT chunk_hash FROM chunks")        # no space: no text has a vector
    group = sql.SQL("SELECT d.source_key AS key, d.status = 'active' AS active, count(*) AS n FROM {rows}"
                    " LEFT JOIN documents d ON d.id = c.document_id GROUP BY 1, 2")
    with spaces.merge_anti_joins(conn):
        rows = conn.execute(sql.SQL(
            "WITH m AS MATERIALIZED ({missing}), all_chunks AS ({all}), without_vector AS ({nov}),"
            " without_keywords AS ({nok}),"
            " hashes AS (SELECT (SELECT count(DISTINCT chunk_hash) FROM chunks) AS n, (SELECT count(*) FROM m) AS missing)"
            " SELECT a.key, a.active, a.n, COALESCE(v.n, 0), COALESCE(k.n, 0), h.n, h.missing FROM all_chunks a"
            " LEFT JOIN without_vector v ON v.key IS NOT DISTINCT FROM a.key AND v.active IS NOT DISTINCT FROM a.active"
            " LEFT JOIN without_keywords k ON k.key IS NOT DISTINCT FROM a.key AND k.active IS NOT DISTINCT FROM a.active"
            " RIGHT JOIN hashes h ON true"
        ).format(missing=missing, all=group.format(rows=sql.SQL("chunks c")),
                 nov=group.format(rows=sql.SQL("m JOIN chunks c ON c.chunk_hash = m.chunk_hash")),
                 nok=group.format(rows=sql.SQL("(SELECT document_id FROM chunks c WHERE {cond}) c").format(
                     cond=sql.SQL(_NO_KEYWORDS))))).fetchall()
    sources: dict[str, dict] = {}
    orphans = hashes = missing_hashes = 0
    for key, active, n, no_vec, no_kw, hashes, missing_hashes in rows:
        if n is None:           # no chunk at all: only the hash counts' row
            continue
        if active:
            sources[key] = {"chunks": n, "without_vector": no_vec, "without_keywords": no_kw}
        else:
            orphans += n
    return {"table": table, "sources": sources, "orphan_chunks": orphans, "chunk_hashes": hashes,
            "missing_hashes": missing_hashes}


def source_counts(coverage: dict | None, table: str | None, source_key: str) -> tuple[int, int] | None:
    """(chunks, chunks without a vector) of the source's active documents from a chunk_coverage taken of `table`;
    None without one, or when it was taken of another space (the caller counts then)."""
    if coverage is None or table is None or coverage.get("table") != table:
        return None
    row = coverage["sources"].get(source_key, {})
    return row.get("chunks", 0), row.get("without_vector", 0)


def parity_from(coverage: dict, active: tuple | None, source_key: str) -> dict:
    """parity() of one source, from a chunk_coverage of the active space."""
    row = coverage["sources"].get(source_key, {"chunks": 0, "without_vector": 0, "without_keywords": 0})
    return {"source": source_key, "active_space": f"{active[0]}/{active[1]}" if active else None, **row}


def parity(conn: psycopg.Connection, source_key: str) -> dict:
    """Active chunks of the source without a vector in the active space, and without a keyword vector
    (an empty tsvector for a chunk that has words: keyword search can never find it)."""
    active = spaces.active_space(conn)
    return parity_from(chunk_coverage(conn, active[2] if active else None), active, source_key)


def unmatched_includes(conn: psycopg.Connection, source: SourceConfig) -> list[str]:
    """Include globs of the source that match no listed file (active or skipped) — usually a typo, or a
    folder that moved. Empty when the source was never indexed (nothing to say yet)."""
    from kb_assets.sources.globs import compile_glob

    from kb_assets.config import DEFAULT_DOC_GLOBS

    # the built-in default (no kb.yaml) lists file types a repository may or may not have: not a typo
    if not source.include or list(source.include) == DEFAULT_DOC_GLOBS:
        return []
    paths = [p.split("#", 1)[0] for (p,) in conn.execute(
        "SELECT path FROM documents WHERE source_key = %s", (source.key,))]
    indexed = conn.execute("SELECT listed_at IS NOT NULL OR indexed_commit IS NOT NULL FROM sources"
                           " WHERE key = %s", (source.key,)).fetchone()
    if not indexed or not indexed[0]:
        return []
    rx = [(pattern, compile_glob(pattern)) for pattern in source.include]
    return [pattern for pattern, r in rx if not any(r.match(p) for p in paths)]


def glob_warning(source_key: str, patterns: list[str]) -> str:
    quoted = ", ".join(repr(p) for p in patterns)
    return (f"source {source_key!r}: include {quoted} matched no file — check the glob against the root "
            "(patterns are relative to it; use '**/' for any depth)")
