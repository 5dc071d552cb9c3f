"""The committed regression set: 26 agent-style queries over a fixed corpus of 21 files (ADRs, code, a README).

It runs as a test (kb_assets_tests/test_query_regression.py) and as a Dagster asset check after indexing:
index a source built from `source_config()` (its root is the packaged `regression/corpus/` folder), then

    from kb_assets.query.regression import run_regression
    report = run_regression(cfg_or_conn, "regression")   # {"passed", "hits", "misses", "mrr", "details"}

A query passes when one of its expected paths is within the top `k` (default 3) of its section (`documents`,
or `code` for source files), with the default threshold in force — so a threshold that starts dropping
relevant documents fails the set too. Provenance and licences: regression/PROVENANCE.md.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REGRESSION_DIR = Path(__file__).resolve().parent / "regression"
CORPUS_DIR = REGRESSION_DIR / "corpus"
QUERIES_FILE = REGRESSION_DIR / "queries.jsonl"
INCLUDE = ["**/*.md", "**/*.py"]
EXCLUDE = ["**/LICEN*"]


def source_config(key: str = "regression") -> dict[str, Any]:
    """The kb.yaml `sources` entry that indexes the regression corpus: one mixed tree, kinds classified per
    file (kind "code" with auto_kind: .py files stay code, README.md is a readme, the ADRs are documents).
    Walked, never listed by git: the corpus is package data, the same files in a wheel as in a checkout, and
    git's five processes would start on every first load (each briefly the size of the indexing process)."""
    return {"key": key, "kind": "code", "root": str(CORPUS_DIR), "include": list(INCLUDE),
            "exclude": list(EXCLUDE), "auto_kind": True, "use_git": False}


def load_queries() -> list[dict[str, Any]]:
    out = []
    for n, line in enumerate(QUERIES_FILE.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            q = json.loads(line)
            if not q.get("id") or not q.get("query") or not q.get("expected"):
                raise ValueError(f"{QUERIES_FILE}:{n}: needs id, query and expected")
            out.append(q)
    return out


def run_regression(config_or_conn, source_key: str = "regression", *, k: int = 3, embedder=None,
                   mode: str = "hybrid", tuning=None) -> dict[str, Any]:
    """Run every regression query against the indexed source `source_key`.

    `config_or_conn`: a KbConfig, a kb.yaml path, or a psycopg connection (then `embedder` may be given; it
    defaults to the one the default config selects).
    """
    from kb_assets.query.engine import recall

    kw: dict[str, Any] = {"source": source_key, "limit": k, "code_limit": k, "mode": mode, "embedder": embedder,
                          "tuning": tuning}
    if hasattr(config_or_conn, "execute") and hasattr(config_or_conn, "cursor"):
        kw["conn"] = config_or_conn
    else:
        kw["config"] = config_or_conn
    details, hits, rr = [], 0, 0.0
    for q in load_queries():
        r = recall(q["query"], **kw)
        section = r.code if q.get("section") == "code" else r.documents
        got = [rec.path for rec in section]
        rank = next((i for i, p in enumerate(got, 1) if p in q["expected"]), None)
        ok = rank is not None and rank <= k
        hits += ok
        rr += 1.0 / rank if rank else 0.0
        details.append({"id": q["id"], "query": q["query"], "expected": q["expected"], "got": got, "rank": rank,
                        "ok": ok})
    total = len(details)
    return {"passed": hits == total, "hits": hits, "misses": total - hits, "total": total,
            "mrr": round(rr / total, 4) if total else 0.0, "k": k,
            "details": details}
