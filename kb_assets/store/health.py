"""What the per-partition checks read (no Dagster): drift between the indexed commit and the source's tip,
vector/keyword parity of the active chunks, and include globs that match nothing."""
from __future__ import annotations

from typing import TYPE_CHECKING

import psycopg

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


# a chunk with words but an empty keyword vector: keyword search can never find it
_NO_KEYWORDS = "c.tsv IS NULL OR (c.tsv = ''::tsvector AND c.text ~ '[[:alpha:]]{2}')"


def chunk_coverage(conn: psycopg.Connection, table: str | None) -> dict:
    """Every chunk against its document and its vector in `table` (None: no space yet), in one scan with hash
    joins — what the checks every_chunk_embedded, vector_keyword_parity and no_orphans each counted with
    their own scans (up to five, correlated, ~0.3 s each on 55K chunks; this is ~0.2 s in all):

    {"table", "sources": {key: {"chunks", "without_vector", "without_keywords"}} over active documents,
     "orphan_chunks": chunks of no active document, "chunk_hashes" / "missing_hashes": distinct texts over
     every chunk, and those without a vector}."""
    vec = f'LEFT JOIN "{table}" e ON e.chunk_hash = c.chunk_hash' if table else \
        "LEFT JOIN (SELECT NULL::text AS chunk_hash) e ON false"
    sources: dict[str, dict] = {}
    orphans = 0
    for key, active, n, no_vec, no_kw in conn.execute(
            "SELECT d.source_key, d.status = 'active', count(*), count(*) FILTER (WHERE e.chunk_hash IS NULL),"
            f" count(*) FILTER (WHERE {_NO_KEYWORDS})"
            f" FROM chunks c LEFT JOIN documents d ON d.id = c.document_id {vec} GROUP BY 1, 2"):
        if active:
            sources[key] = {"chunks": n, "without_vector": no_vec, "without_keywords": no_kw}
        else:
            orphans += n
    hashes, missing = conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE e.chunk_hash IS NULL)"
        f" FROM (SELECT DISTINCT chunk_hash FROM chunks) c {vec}").fetchone()
    return {"table": table, "sources": sources, "orphan_chunks": orphans, "chunk_hashes": hashes,
            "missing_hashes": missing}


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
