"""Reading the relations graph (table `relations`, written by kb_assets/pipeline/relations.py).

Standard library only (the connection is passed in): imported by recall() and `kb related`.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

ID_PREFIX = "kb:"


def related(conn, source_key: str, path: str, depth: int = 1) -> dict[str, Any]:
    """Neighbours of one document up to `depth` hops, both directions, with edge kinds.

    Returns {"id", "found", "edges": [{"from", "kind", "to", "resolved", "depth"}]} sorted by depth, kind, ids.
    An edge seen from its target reads in its own direction (from → to), so `kb related` shows who points here.
    """
    row = conn.execute("SELECT id FROM documents WHERE source_key = %s AND path = %s", (source_key, path)).fetchone()
    me = f"{ID_PREFIX}{source_key}/{path}"
    if row is None:
        return {"id": me, "found": False, "edges": []}
    start = row[0]
    seen_docs = {start}
    frontier = [start]
    edges: dict[tuple[str, str, str], dict[str, Any]] = {}
    for level in range(1, max(1, depth) + 1):
        if not frontier:
            break
        found = conn.execute(
            "SELECT r.document_id, r.kind, r.target, r.target_document_id, fd.source_key, fd.path,"
            " td.source_key, td.path FROM relations r JOIN documents fd ON fd.id = r.document_id"
            " LEFT JOIN documents td ON td.id = r.target_document_id"
            " WHERE r.document_id = ANY(%s) OR r.target_document_id = ANY(%s)", (frontier, frontier)).fetchall()
        nxt = []
        for did, kind, target, tdid, fs, fp, ts, tp in found:
            frm = f"{ID_PREFIX}{fs}/{fp}"
            to = f"{ID_PREFIX}{ts}/{tp}" if tdid is not None else target
            key = (frm, kind, to)
            if key not in edges:
                edges[key] = {"from": frm, "kind": kind, "to": to, "resolved": tdid is not None, "depth": level}
            for other in (did, tdid):
                if other is not None and other not in seen_docs:
                    seen_docs.add(other)
                    nxt.append(other)
        frontier = nxt
    ordered = sorted(edges.values(), key=lambda e: (e["depth"], e["kind"], e["from"], e["to"]))
    return {"id": me, "found": True, "edges": ordered}


def successors(conn, doc_ids: list[int]) -> dict[int, list[tuple[int | None, str]]]:
    """superseded_by edges of the given documents: {doc id: [(successor doc id or None, kb id or raw target)]}."""
    if not doc_ids:
        return {}
    out: dict[int, list[tuple[int | None, str]]] = defaultdict(list)
    for did, tdid, target, ts, tp in conn.execute(
            "SELECT r.document_id, r.target_document_id, r.target, td.source_key, td.path FROM relations r"
            " LEFT JOIN documents td ON td.id = r.target_document_id"
            " WHERE r.document_id = ANY(%s) AND r.kind = 'superseded_by'"
            " ORDER BY r.document_id, td.source_key NULLS LAST, td.path, r.target", (doc_ids,)).fetchall():
        name = f"{ID_PREFIX}{ts}/{tp}" if tdid is not None else target
        if all(name != n for _, n in out[did]):
            out[did].append((tdid, name))
    return dict(out)


def successors_first(chosen: list, succ: dict[int, list[tuple[int | None, str]]]) -> list:
    """Reorder ranked (hit, …) pairs so that a successor found with the document it supersedes sits right above
    it (an agent reading top-down meets the current decision first). Other positions do not move."""
    order = [item[0].doc_id for item in chosen]
    pos = {d: i for i, d in enumerate(order)}
    moved = False
    for did in list(order):
        for tdid, _name in succ.get(did, []):
            if tdid is None or tdid not in pos or tdid == did:
                continue
            i, j = order.index(did), order.index(tdid)
            if j > i:                      # the successor is below: lift it to just above
                order.pop(j)
                order.insert(i, tdid)
                moved = True
    if not moved:
        return chosen
    by_id = {item[0].doc_id: item for item in chosen}
    return [by_id[d] for d in order]
