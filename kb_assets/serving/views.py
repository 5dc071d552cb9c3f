"""What the API and the page compute: recall with the server's pool and model, the knowledge search
shape, links a person can open, the index summary with drift, facet counts."""
from __future__ import annotations

import functools
import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote

from kb_assets.query.freshness import changed_paths, git_head


def run_recall(conn, st, queries: list[str], *, limit=None, code_limit=None, passage=False, filters=None):
    from kb_assets.query import QueryError, recall

    from kb_assets.serving.app import ApiError

    try:
        return recall(queries if len(queries) > 1 else queries[0], config=st.cfg, conn=conn, embedder=st.embedder,
                      limit=limit, code_limit=code_limit, include_passage=passage,
                      **(filters.as_recall_kwargs() if filters else {}))
    except QueryError as exc:
        raise ApiError(str(exc)) from None


# ------------------------------------------------------------------------------------------ links
_SCP_LIKE = re.compile(r"^(?:[^@/]+@)?([^:/]+):(?!/)(.+?)(?:\.git)?/?$")          # git@host:owner/repo.git
_URL_LIKE = re.compile(r"^(?:ssh|https?|git)://(?:[^@/]+@)?([^/:]+)(?::\d+)?/(.+?)(?:\.git)?/?$")


def web_base(remote: str) -> str | None:
    """https://host/owner/repo for a remote URL; credentials in it are dropped. None for local remotes."""
    remote = remote.strip()
    m = _URL_LIKE.match(remote) or (None if "://" in remote else _SCP_LIKE.match(remote))
    if not m:
        return None
    host, repo = m.group(1), m.group(2)
    if host in ("localhost",) or not repo or ".." in repo:
        return None
    return f"https://{host}/{quote(repo)}"


@functools.lru_cache(maxsize=256)
def _repo_info(root: str) -> tuple[str | None, str]:
    """(web base of the origin remote, the source root's path inside the repository)."""
    def git(*args):
        try:
            out = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    remote = git("config", "--get", "remote.origin.url")
    prefix = git("rev-parse", "--show-prefix") or ""
    return (web_base(remote) if remote else None), prefix


def source_url(root: str | None, path: str, commit: str | None, line: int | None = None) -> str | None:
    """The file at the indexed commit on the source's web host, else a file: URL on this machine."""
    if not root:
        return None
    file_path = path.split("#", 1)[0]
    base, prefix = _repo_info(root) if commit and Path(root).is_dir() else (None, "")
    if base and commit:
        rel = quote(prefix + file_path)
        host = base.split("/")[2]
        blob = "-/blob" if "gitlab" in host else "src" if "bitbucket" in host else "blob"
        return f"{base}/{blob}/{commit}/{rel}" + (f"#L{line}" if line and blob == "blob" else "")
    return (Path(root) / file_path).as_uri() if Path(root).is_absolute() else None


# ------------------------------------------------------------------------------------------ index summary
def index_info(conn) -> dict[str, Any]:
    rows = conn.execute(
        "SELECT s.key, s.kind, s.indexed_commit, s.last_run_at,"
        " (SELECT count(*) FROM documents d WHERE d.source_key = s.key AND d.status = 'active')"
        " FROM sources s ORDER BY s.key").fetchall()
    sources = [{"key": k, "kind": kind, "documents": n, "indexed_commit": c,
                "last_indexed_at": at.isoformat() if at else None} for k, kind, c, at, n in rows]
    last = max((s["last_indexed_at"] for s in sources if s["last_indexed_at"]), default=None)
    return {"last_indexed_at": last, "sources": sources}


def drift(conn) -> list[dict[str, Any]]:
    """Per source: indexed commit vs the source's HEAD now, and how many indexed documents changed since."""
    out = []
    for key, root, commit, at in conn.execute(
            "SELECT key, root, indexed_commit, last_run_at FROM sources ORDER BY key").fetchall():
        head = git_head(root) if root and Path(root).is_dir() else None
        changed = None
        if commit and head and head != commit:
            paths = changed_paths(root, commit, head)
            if paths is not None:
                changed = conn.execute(
                    "SELECT count(*) FROM documents WHERE source_key = %s AND split_part(path, '#', 1) = ANY(%s)",
                    (key, list(paths))).fetchone()[0]
        out.append({"source": key, "indexed_commit": commit, "head": head,
                    "behind": bool(commit and head and head != commit), "changed_documents": changed,
                    "last_indexed_at": at.isoformat() if at else None})
    return out


# ------------------------------------------------------------------------------------------ search
def knowledge_search(conn, st, q: str, top_k: int, filters) -> dict[str, Any]:
    result = run_recall(conn, st, [q], limit=top_k, code_limit=top_k, passage=True, filters=filters)
    recs = sorted(result.documents + result.code, key=lambda r: -r.score)[:top_k]
    roots = dict(conn.execute("SELECT key, root FROM sources").fetchall())
    results = []
    for r in recs:
        passage = r.passage or {}
        snippet = passage.get("text") or r.signpost.get("summary") or r.signpost.get("purpose") or ""
        line = (passage.get("lines") or [None])[0]
        results.append({
            "score": round(float(r.score), 4),
            "source_url": source_url(roots.get(r.source), r.path, r.indexed_commit, line),
            "citation": r.id, "snippet": snippet, "id": r.id, "title": r.title, "kind": r.kind,
            "source": r.source, "path": r.path, "stale": bool(r.stale),
        })
    return {"query": q, "results": results, "index": index_info(conn)}


# ------------------------------------------------------------------------------------------ facets
def facet_counts(records) -> dict[str, list[tuple[str, int]]]:
    """Counts per source, kind, tag and year among a result list (what clicking a facet would keep)."""
    src, kind, tag, year = Counter(), Counter(), Counter(), Counter()
    for r in records:
        src[r.source] += 1
        kind[r.kind] += 1
        for t in set((r.signpost.get("tags") or [])):
            tag[str(t).lower()] += 1
        d = r.updated or r.created
        if d and re.match(r"^\d{4}", d):
            year[d[:4]] += 1
    top = lambda c: sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))  # noqa: E731
    return {"source": top(src), "kind": top(kind), "tag": top(tag)[:20],
            "year": sorted(year.items(), reverse=True)}


def index_facets(conn) -> dict[str, list[tuple[str, int]]]:
    """The same facets over the whole index (the page before any search)."""
    src = conn.execute("SELECT source_key, count(*) FROM documents WHERE status = 'active' GROUP BY 1"
                       " ORDER BY 2 DESC, 1").fetchall()
    kind = conn.execute("SELECT kind, count(*) FROM documents WHERE status = 'active' GROUP BY 1"
                        " ORDER BY 2 DESC, 1").fetchall()
    tag = conn.execute(
        "SELECT lower(t), count(DISTINCT d.id) FROM documents d, jsonb_array_elements_text("
        " CASE WHEN jsonb_typeof(d.meta->'tags') = 'array' THEN d.meta->'tags' ELSE '[]'::jsonb END) t"
        " WHERE d.status = 'active' GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 20").fetchall()
    return {"source": [tuple(r) for r in src], "kind": [tuple(r) for r in kind], "tag": [tuple(r) for r in tag],
            "year": []}
