"""Retrieval quality on What's-New → PEP (../shared/eval/peps_whatsnew) with the local embedder.

    python bench/eval_peps.py                    # index (if needed) with the real pipeline, evaluate 3 modes
    python bench/eval_peps.py --loader dev       # development loader (own chunker), for tuning only
    python bench/eval_peps.py --grid             # also try fusion settings (reported side by side)

Steps: unpack the PEP corpus tarball into WORK/src, write WORK/kb.yaml (source "peps", kind adr, include
peps/pep-*.rst), index it (kb_assets.pipeline when it exists — the reported figure must come from it — or
the dev loader), refresh the query statistics, then run the 244 queries in keyword, vector and hybrid mode
and print nDCG@10, MRR@10, Recall@1/5/10/100. Results go to WORK/results-<loader>.json.
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED = ROOT.parent / "shared"
EVAL = SHARED / "eval" / "peps_whatsnew"


def unpack(work: Path) -> Path:
    src = work / "src"
    if (src / "peps").is_dir():
        return src
    tars = sorted(glob.glob(str(SHARED / "corpora" / "python-peps-*.tar.gz")))
    if not tars:
        sys.exit(f"no PEP corpus under {SHARED / 'corpora'}")
    tmp = work / "src.tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tars[0]) as tf:
        tf.extractall(tmp, filter="data")
    # the tarball has one top folder holding peps/
    top = next(p for p in tmp.iterdir() if p.is_dir())
    top.rename(src)
    tmp.rmdir()
    return src


def write_config(work: Path, src: Path) -> Path:
    cfg = work / "kb.yaml"
    cfg.write_text(
        "data_dir: data\n"
        "embedder: local\n"
        "signposter: extractive\n"
        "sources:\n"
        f"  - key: peps\n    kind: adr\n    root: {src}\n    include: [\"peps/pep-*.rst\"]\n",
        encoding="utf-8")
    return cfg


# ------------------------------------------------------------------------------------------------------
# Development loader: a small rst chunker and the real local model, straight into the tables.
_UNDER = re.compile(r"^([=\-~^*#+`'\".:_])\1{2,}\s*$")


def _dev_chunks(text: str, max_words: int = 180) -> list[tuple[str, str, int, int]]:
    lines = text.splitlines()
    sections: list[tuple[str, int, list[str]]] = []
    heading, start, buf = "", 1, []
    i = 0
    while i < len(lines):
        if i + 1 < len(lines) and lines[i].strip() and _UNDER.match(lines[i + 1]) and \
                len(lines[i + 1].strip()) >= len(lines[i].strip()) - 2:
            if buf:
                sections.append((heading, start, buf))
            heading, start, buf = lines[i].strip(), i + 1, []
            i += 2
            continue
        buf.append(lines[i])
        i += 1
    if buf:
        sections.append((heading, start, buf))
    out = []
    for heading, start, body in sections:
        para, words, first = [], 0, start
        for j, line in enumerate(body + [""]):
            n = len(line.split())
            if para and (words + n > max_words) and not line.strip() or (words > max_words * 1.5):
                t = "\n".join(para).strip()
                if t:
                    out.append((heading, t, first, start + j))
                para, words, first = [], 0, start + j + 1
            para.append(line)
            words += n
        t = "\n".join(para).strip()
        if t:
            out.append((heading, t, first, start + len(body)))
    return out


def dev_index(work: Path, src: Path, cfg_path: Path) -> dict:
    import numpy as np

    from kb_assets.config import load_config
    from kb_assets.embedding import make_embedder
    from kb_assets.store.db import connect, open_database
    from kb_assets.store.spaces import activate_space, ensure_space

    cfg = load_config(cfg_path)
    url = open_database(cfg)
    conn = connect(url)
    have = conn.execute("SELECT count(*) FROM documents").fetchone()[0]
    if have:
        return {"url": url, "documents": have, "reused": True}
    emb = make_embedder(cfg)
    table = ensure_space(conn, emb.model, emb.dimension)
    cache_file = work / "vector-cache.npz"
    cache: dict[str, np.ndarray] = {}
    if cache_file.exists():
        z = np.load(cache_file)
        cache = dict(zip(z["keys"].tolist(), z["vecs"]))
    conn.execute("INSERT INTO sources (key, kind, root, indexed_commit) VALUES ('peps', 'adr', %s, NULL)"
                 " ON CONFLICT DO NOTHING", (str(src),))
    rows = []
    for f in sorted((src / "peps").glob("pep-*.rst")):
        text = f.read_text(encoding="utf-8", errors="replace")
        head = {}
        for line in text.splitlines()[:40]:
            m = re.match(r"^([A-Z][A-Za-z-]+):\s*(.*)$", line)
            if m:
                head[m.group(1).lower()] = m.group(2).strip()
            elif not line.strip():
                break
        title = f"PEP {int(f.stem[4:])} – {head.get('title', f.stem)}"
        meta = {"status": head.get("status", ""), "created": head.get("created", ""), "type": head.get("type", "")}
        rows.append((f"peps/{f.name}", title, meta, text, _dev_chunks(text)))
    todo = []
    for path, title, meta, text, chunks in rows:
        for heading, body, a, b in chunks:
            h = hashlib.sha256((heading + "\0" + body).encode()).hexdigest()
            if h not in cache:
                todo.append((h, f"{heading}\n{body}" if heading else body))
    todo = list(dict(todo).items())
    print(f"dev loader: {len(rows)} documents, {sum(len(r[4]) for r in rows)} chunks, {len(todo)} to embed",
          flush=True)
    t0 = time.time()
    for i in range(0, len(todo), 256):
        batch = todo[i:i + 256]
        vecs = emb.embed_documents([t for _, t in batch]).vectors
        for (h, _), v in zip(batch, vecs):
            cache[h] = v
        print(f"  embedded {i + len(batch)}/{len(todo)} ({(i + len(batch)) / (time.time() - t0):.1f}/s)", flush=True)
        if (i // 256) % 8 == 7 or i + 256 >= len(todo):
            keys = list(cache)
            np.savez(cache_file, keys=np.array(keys), vecs=np.stack([cache[k] for k in keys]))
    with conn.transaction():
        for path, title, meta, text, chunks in rows:
            did = conn.execute(
                "INSERT INTO documents (source_key, path, kind, title, status, content_hash, meta, text)"
                " VALUES ('peps', %s, 'adr', %s, 'active', %s, %s, %s) RETURNING id",
                (path, title, hashlib.sha256(text.encode()).hexdigest(), json.dumps(meta), text)).fetchone()[0]
            with conn.cursor().copy("COPY chunks (document_id, ordinal, heading, start_line, end_line, token_count,"
                                    " chunk_hash, text) FROM STDIN") as cp:
                for n, (heading, body, a, b) in enumerate(chunks):
                    h = hashlib.sha256((heading + "\0" + body).encode()).hexdigest()
                    cp.write_row((did, n, heading, a, b, len(body.split()), h, body))
        hashes = {r[0] for r in conn.execute("SELECT DISTINCT chunk_hash FROM chunks")}
        with conn.cursor().copy(f"COPY {table} (chunk_hash, embedding) FROM STDIN") as cp:
            for h in hashes:
                cp.write_row((h, "[" + ",".join(f"{x:.7g}" for x in cache[h]) + "]"))
    activate_space(conn, emb.model, emb.dimension)
    return {"url": url, "documents": len(rows), "reused": False}


def pipeline_index(cfg_path: Path) -> dict:
    """The real pipeline: kb_assets.pipeline.index_sources (reader, chunker, local model, extractive signposts)."""
    from kb_assets.config import load_config
    from kb_assets.embedding import make_embedder
    from kb_assets.pipeline import index_sources
    from kb_assets.signposts import make_signposter
    from kb_assets.store.db import connect, open_database

    cfg = load_config(cfg_path)
    url = open_database(cfg)
    t0 = time.time()
    with connect(url) as conn:
        runs = index_sources(cfg, conn, embedder=make_embedder(cfg), signposter=make_signposter(cfg))
        n = conn.execute("SELECT count(*) FROM documents WHERE status = 'active'").fetchone()[0]
        c = conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
    return {"seconds": round(time.time() - t0, 1), "documents": n, "chunks": c,
            "runs": {k: {"seconds": v.seconds, "embedded": v.embeddings.chunks_embedded}
                     for k, v in runs.items()}}


# ------------------------------------------------------------------------------------------------------
def run_eval(cfg_path: Path, modes: list[str], grid: bool, out: Path) -> dict:
    from kb_assets.config import load_config
    from kb_assets.embedding import make_embedder
    from kb_assets.pipeline.query_stats import refresh_query_stats
    from kb_assets.query import Tuning, recall
    from kb_assets.query.engine import _connection_for
    from kb_assets.query.metrics import evaluate, load_qrels, load_queries

    cfg = load_config(cfg_path)
    conn = _connection_for(cfg)
    st = conn.execute("SELECT n_chunks FROM query_stats").fetchone()
    n_chunks = conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
    if not st or st[0] != n_chunks:
        print("refresh_query_stats:", refresh_query_stats(conn), flush=True)
    queries = load_queries(EVAL / "queries.jsonl")
    qrels = load_qrels(EVAL / "qrels" / "test.tsv")
    emb = make_embedder(cfg)
    # embed every query once (the embedding is not what we tune)
    t0 = time.time()
    qvecs = {qid: emb.embed_query(text) for qid, text in queries.items()}
    print(f"embedded {len(qvecs)} queries in {time.time() - t0:.1f}s", flush=True)

    class Cached:
        model, dimension = emb.model, emb.dimension

        def __init__(self):
            self.current = None

        def embed_query(self, text):
            return qvecs[self.current]

    cached = Cached()

    def key(doc_id: str) -> str:
        return Path(doc_id.split("/", 1)[1]).stem

    def one(mode: str, tuning: Tuning | None = None, settings: dict | None = None, **kw) -> dict:
        c = cfg if not settings else cfg.model_copy(update={"query": cfg.query.model_copy(update=settings)})
        run, lat = {}, []
        for qid, text in queries.items():
            cached.current = qid
            r = recall(text, config=c, conn=conn, embedder=cached, mode=mode, limit=100, code_limit=0,
                       tuning=tuning or Tuning(gate=False), ranked_ids=True, min_score=0.0, **kw)
            seen = []
            for i, _ in r.ranked[0]:
                k = key(i)
                if k not in seen:
                    seen.append(k)
            run[qid] = seen
            lat.append(r.timings["recall_ms"] - r.timings["fetch_ms"])
        m = evaluate(run, qrels)
        lat.sort()
        m["search_ms_p50"] = lat[len(lat) // 2]
        m["search_ms_p95"] = lat[int(len(lat) * 0.95)]
        return m

    results = {}
    header = f"{'run':44s} nDCG@10  MRR@10  R@1    R@5    R@10   R@100  p50ms"
    print(header)

    def show(name, m):
        results[name] = {k: v for k, v in m.items() if k != "per_query"}
        results[name]["per_query_ndcg"] = {q: round(v["ndcg@10"], 4) for q, v in m["per_query"].items()}
        print(f"{name:44s} {m['ndcg@10']:.4f}  {m['mrr@10']:.4f}  {m['recall@1']:.3f}  {m['recall@5']:.3f}  "
              f"{m['recall@10']:.3f}  {m['recall@100']:.3f}  {m['search_ms_p50']:.1f}", flush=True)

    for mode in modes:
        show(mode, one(mode))
    if grid:
        from dataclasses import replace
        base = Tuning(gate=False)
        variants = [
            ("hybrid without document vectors", None, {"document_window": 0}),
            ("hybrid chunk max only (decay 0)", replace(base, doc_decay=0.0), None),
            ("hybrid decay 0.5", replace(base, doc_decay=0.5), None),
            ("hybrid convex fusion", replace(base, fusion="convex"), None),
            ("hybrid rrf k=20", None, {"rrf_k": 20}),
            ("hybrid keyword weight 2", None, {"keyword_weight": 2.0}),
            ("hybrid keyword weight 0.5", None, {"keyword_weight": 0.5}),
            ("hybrid document weight 0.5", None, {"document_weight": 0.5}),
            ("hybrid document weight 2", None, {"document_weight": 2.0}),
            ("hybrid window 100", None, {"candidate_window": 100}),
            ("hybrid window 400", None, {"candidate_window": 400}),
            ("hybrid postings 12000, tf (ts_rank)", replace(base, keyword_postings=12000, keyword_tf=True), None),
            ("hybrid postings 3000", replace(base, keyword_postings=3000), None),
            ("hybrid postings 12000", replace(base, keyword_postings=12000), None),
            ("hybrid terms 12", replace(base, keyword_max_terms=12), None),
            ("hybrid terms 16", replace(base, keyword_max_terms=16), None),
            ("keyword terms 12", replace(base, keyword_max_terms=12), None),
            ("keyword terms 16", replace(base, keyword_max_terms=16), None),
            ("keyword postings 12000, tf (ts_rank)", replace(base, keyword_postings=12000, keyword_tf=True), None),
            ("keyword postings 3000", replace(base, keyword_postings=3000), None),
            ("keyword postings 12000", replace(base, keyword_postings=12000), None),
        ]
        only = os.environ.get("GRID_ONLY")
        for name, t, st in variants:
            if only and only not in name:
                continue
            show(name, one(name.split()[0], t, st))
    results["threshold_calibration"] = calibrate(cfg, conn, emb, queries, qrels, qvecs)
    out.write_text(json.dumps(results, indent=1), encoding="utf-8")
    return results


OFF_TOPIC = [
    "restart celery workers nightly", "terraform remote state locking", "kubernetes horizontal pod autoscaler",
    "chocolate cake recipe", "react component lifecycle hooks", "rotate AWS IAM access keys",
    "bid pipeline kafka streaming", "jwt refresh token expiry", "nginx reverse proxy health check",
    "grafana dashboard for redis memory", "mobile app push notifications", "tax rules for invoices in Germany",
]


def calibrate(cfg, conn, emb, queries, qrels, qvecs) -> dict:
    """Where the relevance gate should sit: similarity / keyword coverage of relevant documents (What's-New
    queries) against the best candidates of off-topic queries (nothing in the PEPs answers them)."""
    from kb_assets.query import Tuning, recall

    off_gate = Tuning(gate=False)

    class Fixed:
        model, dimension = emb.model, emb.dimension

        def __init__(self, vec):
            self.vec = vec

        def embed_query(self, text):
            return self.vec

    rel_sim, rel_cov = [], []
    for qid, text in queries.items():
        r = recall(text, config=cfg, conn=conn, embedder=Fixed(qvecs[qid]), limit=100, code_limit=0,
                   tuning=off_gate, ranked_ids=True)
        for doc_id, sc in r.channel_scores.items():
            if Path(doc_id.split("/", 1)[1]).stem in qrels.get(qid, {}):
                rel_sim.append(sc["similarity"])
                rel_cov.append(sc["coverage"])
    off_sim, off_cov = [], []
    for text in OFF_TOPIC:
        r = recall(text, config=cfg, conn=conn, embedder=emb, limit=20, code_limit=0, tuning=off_gate,
                   ranked_ids=True)
        top = sorted(r.channel_scores.values(), key=lambda x: -x["similarity"])[:5]
        off_sim += [x["similarity"] for x in top]
        off_cov += [x["coverage"] for x in sorted(r.channel_scores.values(), key=lambda x: -x["coverage"])[:5]]

    def q(v, p):
        v = sorted(v)
        return round(v[min(len(v) - 1, int(p / 100 * len(v)))], 3) if v else None

    # the default gate at work: PEP nDCG with it on, and what off-topic queries get back
    gated_run = {}
    for qid, text in queries.items():
        r = recall(text, config=cfg, conn=conn, embedder=Fixed(qvecs[qid]), limit=100, code_limit=0,
                   ranked_ids=True)
        gated_run[qid] = [Path(i.split("/", 1)[1]).stem for i, _ in r.ranked[0]]
    from kb_assets.query.metrics import evaluate
    gated = evaluate(gated_run, qrels)
    off_counts = [len(recall(t, config=cfg, conn=conn, embedder=emb).documents) for t in OFF_TOPIC]
    kw_run = {}
    for qid, text in queries.items():
        r = recall(text, config=cfg, conn=conn, mode="keyword", limit=100, code_limit=0, ranked_ids=True)
        kw_run[qid] = [Path(i.split("/", 1)[1]).stem for i, _ in r.ranked[0]]
    kw_gated = evaluate(kw_run, qrels)
    off_counts_kw = [len(recall(t, config=cfg, conn=conn, mode="keyword").documents) for t in OFF_TOPIC]
    off_counts_nogate = [len(recall(t, config=cfg, conn=conn, embedder=emb, tuning=off_gate).documents)
                         for t in OFF_TOPIC]
    out = {"gate_on_ndcg@10": round(gated["ndcg@10"], 4), "gate_on_recall@100": round(gated["recall@100"], 4),
           "gate_on_results_per_query_mean": round(sum(len(v) for v in gated_run.values()) / len(gated_run), 1),
           "off_topic_documents_returned_gate_on": off_counts,
           "keyword_mode_gate_on_ndcg@10": round(kw_gated["ndcg@10"], 4),
           "keyword_mode_gate_on_recall@100": round(kw_gated["recall@100"], 4),
           "keyword_mode_off_topic_documents_returned_gate_on": off_counts_kw,
           "off_topic_documents_returned_gate_off": off_counts_nogate,
           "relevant_similarity_p1_p5_p10_p50": [q(rel_sim, p) for p in (1, 5, 10, 50)],
           "relevant_coverage_p50_p90": [q(rel_cov, p) for p in (50, 90)],
           "off_topic_top5_similarity_p50_p90_max": [q(off_sim, 50), q(off_sim, 90), max(off_sim, default=None)],
           "off_topic_top5_coverage_p50_p90_max": [q(off_cov, 50), q(off_cov, 90), max(off_cov, default=None)],
           "relevant_found": len(rel_sim)}
    print("threshold calibration:", json.dumps(out), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="/tmp/kb-eval-peps")
    ap.add_argument("--loader", choices=["pipeline", "dev"], default="pipeline")
    ap.add_argument("--modes", default="keyword,vector,hybrid")
    ap.add_argument("--grid", action="store_true")
    ap.add_argument("--reuse", action="store_true", help="evaluate the existing index as it is (no indexing run)")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = Path(args.work) / args.loader
    work.mkdir(parents=True, exist_ok=True)
    src = unpack(Path(args.work))
    cfg_path = write_config(work, src)
    t0 = time.time()
    if args.reuse:
        info = {"reused": str(work / "data")}
    else:
        info = dev_index(work, src, cfg_path) if args.loader == "dev" else pipeline_index(cfg_path)
    print(f"index: {info} ({time.time() - t0:.0f}s)", flush=True)
    run_eval(cfg_path, args.modes.split(","), args.grid, work / f"results-{args.loader}.json")


if __name__ == "__main__":
    main()
