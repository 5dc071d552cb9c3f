"""`kb search`: plain hybrid search over chunks (vector + keyword, reciprocal rank fusion).

Chunk-level and unbudgeted, for people checking what the index holds. Agents use `recall`.
"""
from __future__ import annotations

import psycopg
from psycopg import sql

from kb_assets.store import spaces


def search_chunks(conn: psycopg.Connection, cfg, query: str, *, limit: int = 10, window: int = 100,
                  embedder=None) -> list[dict]:
    from kb_assets.embedding import make_embedder
    from kb_assets.query.inputs import MAX_SEARCH_LIMIT, check_limit, check_query_text

    check_query_text(query)
    check_limit("limit", limit, lowest=1, highest=MAX_SEARCH_LIMIT)
    window = max(window, limit)      # every asked-for result can come back
    rrf_k = cfg.query.rrf_k
    ranks: dict[int, float] = {}
    active = spaces.active_space(conn)
    if active is not None:
        embedder = embedder or make_embedder(cfg)
        if (embedder.model, embedder.dimension) != active[:2]:
            raise RuntimeError(f"the index was built with {active[0]} ({active[1]}-d) but the config says "
                               f"{embedder.model} ({embedder.dimension}-d): run `kb index`")
        qvec = embedder.embed_query(query)
        with conn.transaction():
            conn.execute(sql.SQL("SET LOCAL hnsw.ef_search = {n}").format(n=sql.Literal(max(window, 40))))
            rows = conn.execute(sql.SQL(
                "SELECT c.id FROM {t} e JOIN chunks c ON c.chunk_hash = e.chunk_hash"
                " ORDER BY e.embedding <=> %s::vector LIMIT {n}").format(
                    t=sql.Identifier(active[2]), n=sql.Literal(window)), (list(map(float, qvec)),)).fetchall()
        for rank, (cid,) in enumerate(rows):
            ranks[cid] = ranks.get(cid, 0.0) + cfg.query.vector_weight / (rrf_k + rank + 1)
    rows = conn.execute(
        "SELECT c.id FROM chunks c, websearch_to_tsquery('english', %s) q WHERE c.tsv @@ q"
        " ORDER BY ts_rank_cd(c.tsv, q) DESC LIMIT %s", (query, window)).fetchall()
    for rank, (cid,) in enumerate(rows):
        ranks[cid] = ranks.get(cid, 0.0) + cfg.query.keyword_weight / (rrf_k + rank + 1)
    best = sorted(ranks.items(), key=lambda kv: -kv[1])[:limit]
    if not best:
        return []
    ids = [cid for cid, _ in best]
    info = {
        r[0]: r[1:] for r in conn.execute(
            "SELECT c.id, d.source_key, d.path, d.kind, c.heading, c.start_line, c.end_line, c.text"
            " FROM chunks c JOIN documents d ON d.id = c.document_id WHERE c.id = ANY(%s)", (ids,))
    }
    out = []
    for cid, score in best:
        if cid not in info:
            continue
        source, path, kind, heading, start, end, text = info[cid]
        out.append({"score": round(score, 6), "source": source, "path": path, "kind": kind, "heading": heading,
                    "start_line": start, "end_line": end, "text": text})
    return out
