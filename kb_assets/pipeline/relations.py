"""Relations between documents: extracted with each document, resolved later, served as a graph.

Edges (table `relations`, migration 011):
- supersedes / superseded_by / amends / amended_by: from the readers' metadata (ADR fields and sentences, PEP
  `Replaces:` / `Superseded-By:`; NATS-style "Updates ADR-8" counts as amends);
- references: the readers' `references` (ADR / PEP numbers, links to decision files) plus, for every prose
  kind, relative links to files and `kb:<source>/<path>` ids written in the text;
- touches: a signpost's artifacts that name a code document (written by the resolve pass).

The documents stage writes a document's own edges in the transaction that writes the document
(`replace_document_edges`); `resolve_relations` (projections stage) resolves targets to documents — a target
may be indexed after the document naming it —, adds the inverse of every resolved supersedes / superseded_by /
amends edge, and rebuilds the touches edges. Unresolved edges are kept (target_document_id NULL) and counted.
"""
from __future__ import annotations

import json
import posixpath
import re
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

import psycopg

EDGE_KINDS = ("supersedes", "superseded_by", "amends", "amended_by", "references", "touches")
INVERSE = {"supersedes": "superseded_by", "superseded_by": "supersedes", "amends": "amended_by",
           "amended_by": "amends"}
# meta key -> edge kind, strongest first (a target named by a stronger kind is not also a plain reference)
_META_EDGES = (("superseded_by", "superseded_by"), ("supersedes", "supersedes"), ("amends", "amends"),
               ("updates", "amends"), ("amended_by", "amended_by"), ("references", "references"))
_NO_TEXT_LINKS = {"transcript", "code", "work_item"}   # their own structure says what they link to
ID_PREFIX = "kb:"
RESOLVE_LOCK_ID = 0x6B62_0011        # pg_advisory_xact_lock key of the resolve pass (store/db.py uses 0x6B62_0001)

_MD_LINK_RE = re.compile(r"\[[^\]\n]{0,300}\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_RST_LINK_RE = re.compile(r"`[^`<\n]{0,200}<([^`>\s]+)>`_")
_KB_ID_RE = re.compile(r"(?<![\w/])kb:([A-Za-z0-9_][A-Za-z0-9_.-]{0,63}/[^\s)\]>`'\",;|]+)")
_SCHEME_RE = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)
_FILE_EXT_RE = re.compile(r"\.[A-Za-z0-9]{1,8}$")


def edges_for(kind: str, path: str, meta: dict[str, Any], text: str | None) -> list[tuple[str, str]]:
    """A document's own edges as (kind, target), deduplicated, in a stable order."""
    out: list[tuple[str, str]] = []
    strong: set[str] = set()
    for key, edge in _META_EDGES:
        values = meta.get(key) or []
        if isinstance(values, str):
            values = [values]
        for v in values:
            t = str(v).strip()
            if not t or t == path:
                continue
            if edge == "references" and t in strong:
                continue
            if edge != "references":
                strong.add(t)
            out.append((edge, t))
    if text and kind not in _NO_TEXT_LINKS:
        for t in text_references(path, text):
            if t not in strong:
                out.append(("references", t))
    seen: set[tuple[str, str]] = set()
    return [e for e in out if not (e in seen or seen.add(e))]


def text_references(path: str, text: str) -> list[str]:
    """Relative links to files (root-relative after resolving against the document's folder) and kb: ids."""
    here = posixpath.dirname(path.split("#", 1)[0])
    found: list[str] = []
    for rx in (_MD_LINK_RE, _RST_LINK_RE):
        for m in rx.finditer(text):
            target = m.group(1).split("#", 1)[0].split("?", 1)[0].strip()
            if not target or _SCHEME_RE.match(target) or target.startswith("//"):
                continue
            if not _FILE_EXT_RE.search(target):
                continue                               # a folder or an anchor-only link: no document
            joined = posixpath.normpath(target.lstrip("/") if target.startswith("/")
                                        else posixpath.join(here, target))
            if joined.startswith("..") or joined == path:
                continue                               # outside the source root: nothing to resolve against
            found.append(joined)
    for m in _KB_ID_RE.finditer(text):
        ident = m.group(1).rstrip(".")
        if not ident.endswith("/"):                      # "kb:nats/adr/" names a folder, not a document
            found.append(ID_PREFIX + ident)
    return found


# --------------------------------------------------------------------------------------------- writing
_INSERT_EDGES = """
INSERT INTO relations (document_id, kind, target, origin)
SELECT d, k, t, 'document' FROM unnest(%s::bigint[], %s::text[], %s::text[]) AS u(d, k, t)
ON CONFLICT DO NOTHING
"""


def replace_document_edges(conn: psycopg.Connection, source_key: str,
                           docs: Iterable[tuple[str, str, dict[str, Any] | str | None, str | None]]) -> int:
    """Rewrite the own edges of the given documents (path, kind, meta, text) of a source; call it inside the
    transaction that wrote them. A skipped document (meta None) loses its edges. Returns edges written."""
    docs = list(docs)
    if not docs:
        return 0
    ids = dict(conn.execute("SELECT path, id FROM documents WHERE source_key = %s AND path = ANY(%s)",
                            (source_key, [d[0] for d in docs])).fetchall())
    if not ids:
        return 0
    conn.execute("DELETE FROM relations WHERE document_id = ANY(%s) AND origin = 'document'", (list(ids.values()),))
    d_ids, kinds, targets = [], [], []
    for path, kind, meta, text in docs:
        if meta is None or path not in ids:
            continue
        if isinstance(meta, str):
            meta = json.loads(meta)
        for edge, target in edges_for(kind, path, meta, text):
            d_ids.append(ids[path])
            kinds.append(edge)
            targets.append(target[:1000])
    if d_ids:
        conn.execute(_INSERT_EDGES, (d_ids, kinds, targets))
    return len(d_ids)


# --------------------------------------------------------------------------------------------- resolving
@dataclass
class RelationStats:
    edges: int = 0
    resolved: int = 0
    unresolved: int = 0
    inverse: int = 0
    touches: int = 0
    touches_resolved: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    unresolved_by_kind: dict[str, int] = field(default_factory=dict)

    def as_metadata(self) -> dict:
        return asdict(self)


_DOC_EXTS = (".md", ".rst", ".txt", ".adoc", ".ipynb")
_CODE_EXTS = {".py", ".pyi", ".js", ".mjs", ".ts", ".tsx", ".jsx", ".go", ".rs", ".java", ".kt", ".rb", ".php", ".c",
              ".h", ".cc", ".cpp", ".hpp", ".cs", ".swift", ".scala", ".clj", ".cljs", ".ex", ".exs", ".sql", ".sh",
              ".lua", ".dart", ".vue", ".svelte"}
_NUMBERED_FILE_RE = re.compile(r"(?i)^(adr|pep|rfc)[-_]?0*(\d{1,5})\.[a-z]+$")
_NUMBER_ID_RE = re.compile(r"^(ADR|PEP|RFC)-(\d+)$", re.I)


class _Index:
    """Every live document, addressable the ways references name them."""

    def __init__(self, conn: psycopg.Connection):
        self.by_path: dict[tuple[str, str], int] = {}
        self.roots: dict[str, str] = dict(conn.execute("SELECT key, root FROM sources").fetchall())
        self.by_root_path: dict[tuple[str, str], list[int]] = defaultdict(list)
        self.numbers: dict[tuple[str, str, int], list[int]] = defaultdict(list)   # (source, family, n)
        self.numbers_any: dict[tuple[str, int], list[int]] = defaultdict(list)
        self.code_by_path: dict[str, list[int]] = defaultdict(list)
        self.code_by_name: dict[str, list[int]] = defaultdict(list)
        self.source_of: dict[int, str] = {}
        self.kb_id: dict[int, str] = {}      # an inverse edge's target is the stating document's kb id
        for did, src, path, kind, fmt, number in conn.execute(
                "SELECT id, source_key, path, kind, meta->>'format', meta->>'number' FROM documents"
                " WHERE status = 'active'"):
            self.source_of[did] = src
            self.kb_id[did] = f"{ID_PREFIX}{src}/{path}"
            self.by_path[(src, path)] = did
            self.by_root_path[(self.roots.get(src, src), path)].append(did)
            if number and number.isdigit():
                family = "pep" if fmt == "pep" else ("rfc" if "rfc" in path.lower() else "adr")
                self.numbers[(src, family, int(number))].append(did)
                self.numbers_any[(family, int(number))].append(did)
            if kind == "code":
                self.code_by_path[path].append(did)
                self.code_by_name[posixpath.basename(path)].append(did)

    def resolve(self, source: str, target: str) -> int | None:
        if target.startswith(ID_PREFIX):
            rest = target[len(ID_PREFIX):]
            if "/" in rest:
                src, path = rest.split("/", 1)
                return self.by_path.get((src, path))
            return None
        m = _NUMBER_ID_RE.match(target)
        if m:
            family, n = m.group(1).lower(), int(m.group(2))
            hits = self.numbers.get((source, family, n)) or self.numbers_any.get((family, n)) or []
            return hits[0] if len(hits) == 1 else None
        did = self.by_path.get((source, target))
        if did is not None:
            return did
        same_root = self.by_root_path.get((self.roots.get(source, source), target)) or []
        if len(same_root) == 1:
            return same_root[0]
        # A numbered sibling spelled with another zero padding ("pep-245.rst" for pep-0245.rst): by number.
        m = _NUMBERED_FILE_RE.match(posixpath.basename(target))
        if m:
            hits = self.numbers.get((source, m.group(1).lower(), int(m.group(2)))) or []
            return hits[0] if len(hits) == 1 else None
        return None

    def resolve_code(self, source: str, artifact: str) -> int | None:
        a = artifact.strip().strip("`'\"").lstrip("./")
        if "/" not in a and "." not in a:
            return None                                   # a bare word is no path
        same_root = [d for d in self.by_root_path.get((self.roots.get(source, source), a)) or []
                     if d in self._code_ids()]
        if len(same_root) == 1:
            return same_root[0]
        hits = self.code_by_path.get(a) or []
        if len(hits) == 1:
            return hits[0]
        if "/" in a:
            suffix = [d for p, ds in self.code_by_path.items() if p.endswith("/" + a) for d in ds]
        elif posixpath.splitext(a)[1].lower() in _CODE_EXTS:
            suffix = self.code_by_name.get(a) or []      # "engine.py": the one file of that name
        else:
            suffix = []                                   # "kb.yaml": too generic a name to guess its folder
        return suffix[0] if len(suffix) == 1 else None

    def _code_ids(self) -> set[int]:
        if not hasattr(self, "_codes"):
            self._codes = {d for ds in self.code_by_path.values() for d in ds}
        return self._codes


_SIGNPOST_ARTIFACTS = """
SELECT d.id, d.source_key, sp.payload->'artifacts'
FROM documents d
JOIN signpost_state st ON st.document_id = d.id
JOIN signposts sp ON sp.content_hash = st.content_hash AND sp.generator = st.generator
     AND sp.model = st.model AND sp.prompt_version = st.prompt_version
WHERE d.status = 'active' AND d.kind <> 'code' AND jsonb_typeof(sp.payload->'artifacts') = 'array'
"""


def resolve_relations(conn: psycopg.Connection) -> RelationStats:
    """Resolve every edge's target, rebuild inverse and touches edges; one transaction. Idempotent: a re-run
    over an unchanged index writes nothing."""
    stats = RelationStats()
    with conn.transaction():
        # two partitions' projections runs at once: one resolves after the other (same result, no duplicate work)
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (RESOLVE_LOCK_ID,))
        index = _Index(conn)
        rows = conn.execute("SELECT id, document_id, target, target_document_id FROM relations"
                            " WHERE origin = 'document'").fetchall()
        changes: list[tuple[int, int | None]] = []
        for rid, did, target, current in rows:
            new = index.resolve(index.source_of.get(did, ""), target)
            if new == did:
                new = None                                # a document naming itself links nowhere
            if new != current:
                changes.append((rid, new))
        if changes:
            conn.execute("UPDATE relations r SET target_document_id = u.t FROM unnest(%s::bigint[], %s::bigint[])"
                         " AS u(id, t) WHERE r.id = u.id", ([c[0] for c in changes], [c[1] for c in changes]))
        # Inverse edges: exactly the set implied by the resolved directed edges.
        want_inverse = {(t, INVERSE[k], index.kb_id.get(d, f"#{d}"), d) for d, k, t in conn.execute(
            "SELECT document_id, kind, target_document_id FROM relations WHERE origin = 'document'"
            " AND target_document_id IS NOT NULL AND kind = ANY(%s)", (list(INVERSE),)).fetchall()}
        # ... unless the target document states that edge itself
        stated = {(d, k, t) for d, k, t in conn.execute(
            "SELECT document_id, kind, target_document_id FROM relations WHERE origin = 'document'"
            " AND target_document_id IS NOT NULL").fetchall()}
        want_inverse = {w for w in want_inverse if (w[0], w[1], w[3]) not in stated}
        _sync(conn, "inverse", want_inverse)
        # Touches: a signpost's artifacts naming a code document (unresolved ones kept: they may be indexed later).
        want_touches = set()
        for did, src, artifacts in conn.execute(_SIGNPOST_ARTIFACTS).fetchall():
            for a in artifacts or []:
                a = str(a).strip()
                if not a or not _path_like(a) or a.lower().endswith(_DOC_EXTS):
                    continue                  # documents are references, not code a document touches
                if index.resolve(src, a.lstrip("./")) is not None and index.resolve_code(src, a) is None:
                    continue                  # names a document of the index that is not code
                want_touches.add((did, "touches", a[:1000], index.resolve_code(src, a)))
        _sync(conn, "signpost", want_touches)
    for kind, total, resolved in conn.execute(
            "SELECT kind, count(*), count(target_document_id) FROM relations GROUP BY kind ORDER BY kind"):
        stats.by_kind[kind] = total
        stats.edges += total
        stats.resolved += resolved
        if total - resolved:
            stats.unresolved_by_kind[kind] = total - resolved
    stats.unresolved = stats.edges - stats.resolved
    stats.inverse = len(want_inverse)
    stats.touches = len(want_touches)
    stats.touches_resolved = sum(1 for w in want_touches if w[3] is not None)
    return stats


def _path_like(artifact: str) -> bool:
    """A file path (with an extension) or a folder path; not "add/delete/lock"-style word lists."""
    a = artifact.strip("`'\" ")
    if " " in a or len(a) > 300 or a.startswith(("/", "~", "../")) or "://" in a:
        return False                    # outside any source root: nothing in the index to touch
    if _FILE_EXT_RE.search(a) and not a.endswith("."):
        return True
    return a.endswith("/") and a.count("/") >= 1


def _sync(conn: psycopg.Connection, origin: str, want: set[tuple[int, str, str, int | None]]) -> None:
    """Make the rows of one origin exactly `want` (document_id, kind, target, target_document_id)."""
    have = {(d, k, t, td): rid for rid, d, k, t, td in conn.execute(
        "SELECT id, document_id, kind, target, target_document_id FROM relations WHERE origin = %s", (origin,))}
    drop = [rid for key, rid in have.items() if key not in want]
    add = [w for w in want if w not in have]
    if drop:
        conn.execute("DELETE FROM relations WHERE id = ANY(%s)", (drop,))
    if add:
        conn.execute("INSERT INTO relations (document_id, kind, target, target_document_id, origin)"
                     " SELECT d, k, t, td, %s FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::bigint[])"
                     " AS u(d, k, t, td) ON CONFLICT DO NOTHING",
                     (origin, [a[0] for a in add], [a[1] for a in add], [a[2] for a in add], [a[3] for a in add]))


