"""Capture every candidate of every query (judged and off-topic), gate off, on the cached quality indexes,
with the evidence the relevance gate reads (similarity, coverage, channels, ranks): then gate designs can
be compared offline on all four sets jointly (bench/gate_study.py --capture; --simulate).

Reuses bench/quality.py's cache (KB_QUALITY_CACHE); never builds: a set whose index key has no finished build
is skipped with a message (the key covers the indexing code only; query/ is not in it)."""
from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quality as Q  # noqa: E402

SETS = ("regression", "code_history", "rust_rfcs", "peps_whatsnew")


def capture(set_name: str, out: Path) -> None:
    from dataclasses import replace

    from kb_assets.config import load_config
    from kb_assets.query import Tuning, recall
    from kb_assets.query import engine
    from kb_assets.store.db import connect, open_database

    es = Q.make_sets()[set_name]
    key = Q.set_key(es)
    work = Q.OUT / "index" / f"{es.name}-{key}"
    if not (work / "built.json").exists():
        # query-only work: the newest finished build of the set measures the same ranking code
        done = sorted((Q.OUT / "index").glob(f"{es.name}-*/built.json"), key=lambda p: p.stat().st_mtime)
        if not done:
            print(f"{set_name}: no finished index: skipped (this script never builds)", file=sys.stderr)
            return
        work, key = done[-1].parent, done[-1].parent.name.rsplit("-", 1)[1]
        print(f"{set_name}: key {Q.set_key(es)} not built; using the newest build {work.name}", file=sys.stderr)
    cfg = load_config(work / "kb.yaml")
    conn = connect(open_database(cfg), register=False)
    emb = Q.MemoEmbedder(cfg)
    names = {did: (f"{src}/{path}", kind) for did, src, path, kind in conn.execute(
        "SELECT id, source_key, path, kind FROM documents WHERE status = 'active'")}
    captured: list = []
    real_gate = engine._gate

    def spy(ranked, channels, floor, settings, *rest):
        captured.append((floor, [dict(doc=h.doc_id, kind=h.kind, sim=h.similarity, cov=h.coverage,
                                      vec=[s for s, _ in h.vec], kw=[s for s, _ in h.kw], d_sim=h.d_sim,
                                      score=h.score, v_rank=h.v_rank, k_rank=h.k_rank, d_rank=h.d_rank,
                                      k_score=h.k_score, v_score=h.v_score)
                             for h in ranked]))
        return real_gate(ranked, channels, floor, settings, *rest)

    engine._gate = spy
    t = replace(Tuning(), gate=True)
    rows = {"queries": [], "off_topic": []}
    src_one = es.sources[0].key if len(es.sources) == 1 else None
    try:
        for mode in ("hybrid", "keyword"):
            for q in es.queries():
                captured.clear()
                r = recall(q["query"], config=cfg, conn=conn, embedder=emb, mode=mode, tuning=t, limit=100,
                           code_limit=100, source=q.get("source"), ranked_ids=True)
                rows["queries"].append(dict(mode=mode, id=q["id"], section=q["section"], query=q["query"],
                                            source=q.get("source"), floor=captured[0][0], hits=captured[0][1],
                                            candidates=r.candidates.get("per_query")))
            for text in es.off_topic:
                captured.clear()
                recall(text, config=cfg, conn=conn, embedder=emb, mode=mode, tuning=t, source=src_one)
                rows["off_topic"].append(dict(mode=mode, query=text, floor=captured[0][0], hits=captured[0][1]))
    finally:
        engine._gate = real_gate
    rows["names"] = names
    rows["qrels"] = es.qrels()
    rows["key"] = key
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{set_name}.pkl").write_bytes(pickle.dumps(rows))
    print(f"{set_name}: {len(rows['queries'])} query runs, {len(rows['off_topic'])} off-topic runs captured "
          f"(load {Q.load_avg()})", file=sys.stderr)
    conn.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "out" / "gate_study"))
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    for s in a.sets.split(","):
        t0 = time.time()
        capture(s, Path(a.out))
        print(f"{s}: {time.time() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
