"""What the projections show, loaded from the index in a few queries (no document text but for entries
without a signpost)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ID_PREFIX = "kb:"


@dataclass
class Entry:
    doc_id: int
    source: str
    path: str
    kind: str
    title: str
    status: str = ""
    status_raw: str = ""
    tags: list[str] = field(default_factory=list)
    summary: str = ""
    first_decision: str = ""
    purpose: str = ""
    functions: list[str] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)
    superseded_by: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{ID_PREFIX}{self.source}/{self.path}"


@dataclass
class Edge:
    source: str          # kb id of the document stating it
    kind: str
    target: str          # kb id when resolved, else the reference as written
    resolved: bool


_ENTRIES = """
-- status: the documents stage's one normalisation (migration 007), the stored meta for a row not yet refilled
SELECT d.id, d.source_key, d.path, d.kind, d.title, coalesce(d.doc_status, d.meta->>'status'),
       coalesce(d.doc_status_raw, d.meta->>'status_raw'), d.meta->'tags',
       sp.payload->>'summary', sp.payload->'tags', sp.payload->>'status', sp.payload->'key_decisions'->0->>'decision',
       sp.payload->>'purpose', sp.payload->'key_functions', sp.payload->'tables',
       CASE WHEN sp.payload IS NULL THEN left(d.text, 3000) END
FROM documents d
LEFT JOIN signpost_state st ON st.document_id = d.id
LEFT JOIN signposts sp ON sp.content_hash = st.content_hash AND sp.generator = st.generator
     AND sp.model = st.model AND sp.prompt_version = st.prompt_version
WHERE d.status = 'active'
ORDER BY d.source_key, d.path
"""

_EDGES = """
SELECT fd.source_key, fd.path, r.kind, r.target, td.source_key, td.path
FROM relations r
JOIN documents fd ON fd.id = r.document_id AND fd.status = 'active'
LEFT JOIN documents td ON td.id = r.target_document_id
"""


def _strings(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value if v not in (None, "")]
    if isinstance(value, str) and value.strip():
        return [value]
    return []


def load_entries(conn) -> list[Entry]:
    from kb_assets.query.records import first_prose

    out = []
    for (did, src, path, kind, title, status, status_raw, meta_tags, summary, sp_tags, sp_status, decision,
         purpose, functions, tables, head) in conn.execute(_ENTRIES):
        e = Entry(did, src, path, kind, title or path, status=status or sp_status or "",
                  status_raw=status_raw or "")
        tags = _strings(meta_tags) + _strings(sp_tags)
        e.tags = tags
        if head is not None:           # no signpost yet: the document's first prose stands in
            text = first_prose(head, 400)
            if kind == "code":
                e.purpose = text
            else:
                e.summary = text
        else:
            e.summary, e.first_decision, e.purpose = summary or "", decision or "", purpose or ""
            e.functions = [str(f.get("name")) if isinstance(f, dict) else str(f)
                           for f in (functions or []) if f and (not isinstance(f, dict) or f.get("name"))]
            e.tables = _strings(tables)
        out.append(e)
    return out


def load_edges(conn) -> list[Edge]:
    edges = []
    for fs, fp, kind, target, ts, tp in conn.execute(_EDGES):
        resolved = ts is not None
        edges.append(Edge(f"{ID_PREFIX}{fs}/{fp}", kind, f"{ID_PREFIX}{ts}/{tp}" if resolved else target, resolved))
    return edges
