"""Retrieval metrics with BEIR / pytrec_eval conventions (standard library only).

- nDCG@k: gain = relevance grade (linear, as pytrec_eval's ndcg_cut), discount log2(rank + 1); ideal DCG from
  the query's judged documents sorted by grade.
- Recall@k: relevant documents (grade > 0) in the top k / all relevant documents of the query.
- MRR@k: 1 / rank of the first relevant document within the top k, else 0.
Queries without any relevant judgement are left out of the means (as BEIR does); queries that have
judgements but no run entry count as 0.
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Iterable, Mapping, Sequence

Qrels = dict[str, dict[str, int]]


def dcg(gains: Iterable[float]) -> float:
    return sum(g / math.log2(i + 2) for i, g in enumerate(gains))


def ndcg_at_k(ranked: Sequence[str], rels: Mapping[str, int], k: int) -> float:
    ideal = dcg(sorted((g for g in rels.values() if g > 0), reverse=True)[:k])
    if ideal <= 0:
        return 0.0
    seen: set[str] = set()
    gains = []
    for doc in ranked[:k]:
        gains.append(rels.get(doc, 0) if doc not in seen else 0)   # a repeated document earns nothing twice
        seen.add(doc)
    return dcg(gains) / ideal


def recall_at_k(ranked: Sequence[str], rels: Mapping[str, int], k: int) -> float:
    relevant = {d for d, g in rels.items() if g > 0}
    if not relevant:
        return 0.0
    return len(relevant & set(ranked[:k])) / len(relevant)


def mrr_at_k(ranked: Sequence[str], rels: Mapping[str, int], k: int) -> float:
    for i, doc in enumerate(ranked[:k], 1):
        if rels.get(doc, 0) > 0:
            return 1.0 / i
    return 0.0


def load_qrels(path: str | Path) -> Qrels:
    """BEIR qrels: TSV `query-id  corpus-id  score` with a header line (detected, not required)."""
    qrels: Qrels = {}
    with open(path, encoding="utf-8", newline="") as fh:
        for n, row in enumerate(csv.reader(fh, delimiter="\t"), 1):
            if not row or not "".join(row).strip():
                continue
            if len(row) < 3:
                raise ValueError(f"{path}:{n}: expected 'query-id<TAB>corpus-id<TAB>score', got {row!r}")
            qid, did, score = row[0].strip(), row[1].strip(), row[2].strip()
            try:
                grade = int(float(score))
            except ValueError:
                if n == 1:
                    continue          # header
                raise ValueError(f"{path}:{n}: score {score!r} is not a number") from None
            qrels.setdefault(qid, {})[did] = grade
    return qrels


def load_queries(path: str | Path) -> dict[str, str]:
    """JSONL queries: `{"_id", "text"}` (BEIR) or `{"id", "query"}` (kb recall --queries) per line."""
    out: dict[str, str] = {}
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not JSON ({exc.msg})") from None
            qid = obj.get("_id", obj.get("id"))
            text = obj.get("text", obj.get("query"))
            if qid is None or not isinstance(text, str) or not text.strip():
                raise ValueError(f"{path}:{n}: needs an id ('_id' or 'id') and a text ('text' or 'query')")
            out[str(qid)] = text
    return out


def evaluate(run: Mapping[str, Sequence[str]], qrels: Qrels, *, ks: Sequence[int] = (1, 5, 10, 100)) -> dict:
    """Mean nDCG@10, Recall@1/5/10/100, MRR@10 over the judged queries; per-query values under "per_query"."""
    judged = [q for q, rels in qrels.items() if any(g > 0 for g in rels.values())]
    per_query: dict[str, dict[str, float]] = {}
    for q in judged:
        ranked = list(run.get(q, []))
        rels = qrels[q]
        m = {"ndcg@10": ndcg_at_k(ranked, rels, 10), "mrr@10": mrr_at_k(ranked, rels, 10)}
        for k in ks:
            m[f"recall@{k}"] = recall_at_k(ranked, rels, k)
        per_query[q] = m
    keys = ["ndcg@10", "mrr@10"] + [f"recall@{k}" for k in ks]
    n = len(per_query)
    means = {k: (sum(m[k] for m in per_query.values()) / n if n else 0.0) for k in keys}
    return {**means, "queries": n, "missing_in_run": sum(1 for q in judged if q not in run),
            "per_query": per_query}


def _key_function(key: str, qrels: Qrels):
    """How a result id maps to a qrels corpus-id: "id" (kb:<source>/<path>), "path", "stem" (file name
    without extension, e.g. pep-0008 for peps/pep-0008.rst), or "auto" (guessed from the qrels)."""
    if key == "auto":
        sample = next((d for rels in qrels.values() for d in rels), "")
        key = "id" if sample.startswith("kb:") else "path" if "/" in sample else "stem"

    def path_of(doc_id: str) -> str:
        return doc_id.split("/", 1)[1] if "/" in doc_id else doc_id

    if key == "id":
        return lambda doc_id: doc_id
    if key == "path":
        return path_of
    if key == "stem":
        return lambda doc_id: Path(path_of(doc_id).split("#", 1)[0]).stem
    raise ValueError(f"unknown key {key!r}: use auto, id, path or stem")


def evaluate_recall(queries: Mapping[str, str] | str | Path, qrels: Qrels | str | Path, *, config=None, conn=None,
                    embedder=None, mode: str = "hybrid", depth: int = 100, key: str = "auto",
                    **recall_kw) -> dict:
    """Run recall() for every query (documents and code together, before the display limits, threshold off)
    and score the ranking: what `kb eval --queries Q --qrels R` reports. Adds the run itself under "run"
    and latency percentiles (embedding excluded) under "latency_ms"."""
    from kb_assets.query.engine import Tuning, recall

    if not isinstance(queries, Mapping):
        queries = load_queries(queries)
    if not isinstance(qrels, dict):
        qrels = load_qrels(qrels)
    to_key = _key_function(key, qrels)
    tuning = recall_kw.pop("tuning", None) or Tuning(gate=False)
    run: dict[str, list[str]] = {}
    lat: list[float] = []
    for qid, text in queries.items():
        r = recall(text, config=config, conn=conn, embedder=embedder, mode=mode, limit=depth, code_limit=0,
                   ranked_ids=True, min_score=0.0, tuning=tuning, **recall_kw)
        seen: list[str] = []
        for doc_id, _score in r.ranked[0][:depth]:
            k = to_key(doc_id)
            if k not in seen:
                seen.append(k)
        run[qid] = seen
        lat.append(r.timings["recall_ms"] - r.timings["fetch_ms"])
    out = evaluate(run, qrels)
    lat.sort()
    out["latency_ms"] = {"p50": lat[len(lat) // 2] if lat else None,
                         "p95": lat[min(len(lat) - 1, int(len(lat) * 0.95))] if lat else None}
    out["mode"] = mode
    out["run"] = run
    return out
