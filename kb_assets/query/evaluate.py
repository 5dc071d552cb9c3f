"""`kb eval --queries Q --qrels R`: retrieval quality of recall() in one or more modes, side by side."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from kb_assets.query.metrics import evaluate_recall, load_qrels, load_queries

DEFAULT_MODES = ("keyword", "vector", "hybrid")


class _CachedEmbedder:
    """Embeds each query once, whatever the number of modes evaluated."""

    def __init__(self, inner):
        self.inner = inner
        self.model, self.dimension = inner.model, inner.dimension
        self._cache: dict[str, list[float]] = {}

    def embed_query(self, text: str) -> list[float]:
        if text not in self._cache:
            self._cache[text] = self.inner.embed_query(text)
        return self._cache[text]


def run_eval(cfg, *, queries_path: str | Path, qrels_path: str | Path, modes: Sequence[str] | None = None,
             doc_key: str = "auto", depth: int = 100, conn=None, embedder=None) -> dict[str, Any]:
    """nDCG@10, MRR@10, Recall@1/5/10/100 per mode (ranking of the top `depth` documents, threshold off).

    `doc_key`: how the qrels name documents — "id" (kb:<source>/<path>), "path", "stem" (file name without
    extension, e.g. pep-0008), or "auto". Returns {"metrics": {mode: {...}}, "queries", "judged",
    "per_query": {mode: {qid: {...}}}}.
    """
    from kb_assets.query.engine import _connection_for, _embedder_for

    queries = load_queries(queries_path)
    qrels = load_qrels(qrels_path)
    modes = list(modes or DEFAULT_MODES)
    conn = conn if conn is not None else _connection_for(cfg)
    emb = None
    if any(m != "keyword" for m in modes):
        emb = _CachedEmbedder(embedder if embedder is not None else _embedder_for(cfg))
    metrics: dict[str, dict] = {}
    per_query: dict[str, dict] = {}
    for mode in modes:
        m = evaluate_recall(queries, qrels, config=cfg, conn=conn, embedder=emb, mode=mode, depth=depth,
                            key=doc_key)
        per_query[mode] = m.pop("per_query")
        m.pop("run", None)
        lat = m.pop("latency_ms")
        m["latency_p50_ms"], m["latency_p95_ms"] = lat["p50"], lat["p95"]
        m.pop("mode", None)
        metrics[mode] = m
    return {"metrics": metrics, "queries": len(queries), "judged": sum(1 for r in qrels.values() if r),
            "doc_key": doc_key, "per_query": per_query}
