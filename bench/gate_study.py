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


def capture(set_name: str, out: Path, tuning_fields: dict | None = None, modes=("hybrid", "keyword")) -> None:
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
    extra: list = []
    real_gate = engine._gate

    def spy(ranked, channels, floor, settings, *rest):
        tun, null, n_docs = (list(rest) + [None, None, 0])[:3]
        extra.append(dict(null=null, n_docs=n_docs, channels=list(channels),
                          margin=settings.similarity_margin, min_cov=settings.min_keyword_coverage))
        captured.append((floor, [dict(doc=h.doc_id, kind=h.kind, sim=h.similarity, cov=h.coverage,
                                      vec=[s for s, _ in h.vec], kw=[s for s, _ in h.kw], d_sim=h.d_sim,
                                      score=h.score, v_rank=h.v_rank, k_rank=h.k_rank, d_rank=h.d_rank,
                                      k_score=h.k_score, v_score=h.v_score)
                             for h in ranked]))
        return real_gate(ranked, channels, floor, settings, *rest)

    engine._gate = spy
    t = replace(Tuning(**(tuning_fields or {})), gate=True)
    rows = {"queries": [], "off_topic": []}
    src_one = es.sources[0].key if len(es.sources) == 1 else None
    try:
        for mode in modes:
            for q in es.queries():
                captured.clear()
                extra.clear()
                r = recall(q["query"], config=cfg, conn=conn, embedder=emb, mode=mode, tuning=t, limit=100,
                           code_limit=100, source=q.get("source"), ranked_ids=True)
                rows["queries"].append(dict(mode=mode, id=q["id"], section=q["section"], query=q["query"],
                                            source=q.get("source"), floor=captured[0][0], hits=captured[0][1],
                                            candidates=r.candidates.get("per_query"), **extra[0]))
            for text in es.off_topic:
                captured.clear()
                extra.clear()
                r = recall(text, config=cfg, conn=conn, embedder=emb, mode=mode, tuning=t, source=src_one)
                rows["off_topic"].append(dict(mode=mode, query=text, floor=captured[0][0], hits=captured[0][1],
                                              returned=len(r.documents) + len(r.code), **extra[0]))
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


# ------------------------------------------------------------------------------------------------ simulate
def sim_gate(hits: list[dict], row: dict, **p) -> list[dict]:
    """query/gate.py's _gate over captured hits, with its constants as parameters (p); the defaults reproduce
    the shipped gate (checked against the captured result counts by --simulate)."""
    from kb_assets.query import Tuning
    from kb_assets.query import gate as G
    on = p.get("on_topic", G.ON_TOPIC_ABOVE_NULL)
    clear = p.get("clearly", G.CLEARLY_ON_TOPIC_ABOVE_NULL)
    sure = p.get("sure", G.SURE_SIMILARITY_ABOVE_FLOOR)
    strong_rel = p.get("strong_relative", False)     # the strong floor when best >= null + clear (not floor + sure)
    weak_margin = p.get("weak_margin")               # a query below null + clear keeps sim >= best - weak_margin
    kw_top = p.get("keyword_top", G.KEYWORD_TOP_KEPT)
    # Tuning.gate_null_floor: a result's similarity must also reach null + null_floor (shipped: the tuning's
    # margin, ON_TOPIC_ABOVE_NULL, for a query below null + clear only), or the null level itself with BM25's
    # rank <= witness_top (shipped: KEYWORD_WITNESS_TOP; 0: no witness); {"null_floor": null} is the gate before
    # the null floor, {"null_floor": 0} the seventh pass
    shipped_nf = Tuning().gate_null_floor
    null_floor = p.get("null_floor", G.null_floor_margin(Tuning()) if shipped_nf else None)
    witness_top = p.get("witness_top", G.KEYWORD_WITNESS_TOP)
    t_witness = None
    null_floor_weak = p.get("null_floor_weak_only", shipped_nf)   # ... only for a query below null + clear
    if not hits:
        return hits
    floor, null, chans = row["floor"], row["null"], row["channels"]
    vec_on, kw_on = "vector" in chans, "keyword" in chans
    t_sim = t_cov = float("inf")
    best = 0.0
    if vec_on:
        best = max(h["sim"] for h in hits)
        t_sim = max(floor, min(best - row["margin"], floor + sure))
        strong = (best >= max(floor + sure, null + clear)) if (strong_rel and null is not None) \
            else (best >= floor + sure)
        if strong:
            t_sim = floor
        elif weak_margin is not None and null is not None:
            t_sim = max(floor, best - weak_margin)
    if vec_on and null_floor is not None and null is not None and (not null_floor_weak or best < null + clear):
        t_witness = max(t_sim, null)
        t_sim = max(t_sim, null + null_floor)
    if kw_on:
        best_cov = max(h["cov"] for h in hits)
        t_cov = max(row["min_cov"], best_cov - G.COVERAGE_MARGIN) if vec_on else \
            max(0.1, min(best_cov - G.COVERAGE_MARGIN, row["min_cov"]))
    k_top = 0
    if vec_on and null is not None:
        agree = any(h["k_rank"] == 1 and (h["v_rank"] == 1 or h["d_rank"] == 1) for h in hits)
        if best < null + on and not (agree and p.get("agree", True)):
            t_sim = float("inf")
            t_witness = None
        elif best >= null + clear:
            k_top = min(kw_top, row["n_docs"] // 10)
        elif (weak_margin is not None or null_floor_weak) and (best >= null + on or not p.get("weak_top_on_topic_only")):
            k_top = p.get("weak_keyword_top", 0)     # BM25's first documents of a weak query
    agreed = p.get("null_floor_keeps_agreed", False) and null_floor is not None
    return [h for h in hits
            if (vec_on and (h["vec"] or h["d_sim"] is not None)
                and (h["sim"] >= t_sim or (t_witness is not None and h["sim"] >= t_witness
                                           and h["k_rank"] is not None and h["k_rank"] <= witness_top)))
            or (agreed and t_sim < float("inf") and h["k_rank"] == 1 and (h["v_rank"] == 1 or h["d_rank"] == 1))
            or (kw_on and h["kw"] and (h["cov"] >= t_cov or (h["k_rank"] is not None and h["k_rank"] <= k_top)))]


def simulate(out: Path, sets: list[str], designs: dict[str, dict], limits=(20, 10)) -> dict:
    """Per design and set: hybrid Recall@100 with the gate (against gate off) and the off-topic result counts."""
    from kb_assets.query.metrics import evaluate
    res: dict = {}
    for s in sets:
        f = out / f"{s}.pkl"
        if not f.exists():
            continue
        rows = pickle.loads(f.read_bytes())
        names, qrels = rows["names"], rows["qrels"]

        def path(doc):
            return names[doc][0].split("/", 1)[1]

        for dname, p in designs.items():
            run_off, run_on = {}, {}
            for q in rows["queries"]:
                if q["mode"] != "hybrid":
                    continue
                want_code = q["section"] == "code"
                ranked = sorted(q["hits"], key=lambda h: (-h["score"], h["doc"]))
                kept = sim_gate(ranked, q, **p)
                run_off[q["id"]] = [path(h["doc"]) for h in ranked if (h["kind"] == "code") == want_code][:100]
                run_on[q["id"]] = [path(h["doc"]) for h in kept if (h["kind"] == "code") == want_code][:100]
            m_off, m_on = evaluate(run_off, qrels), evaluate(run_on, qrels)
            counts, shipped = [], []
            for o in rows["off_topic"]:
                if o["mode"] != "hybrid":
                    continue
                kept = sim_gate(o["hits"], o, **p)
                counts.append(min(limits[0], sum(h["kind"] != "code" for h in kept))
                              + min(limits[1], sum(h["kind"] == "code" for h in kept)))
                shipped.append(o.get("returned"))
            res.setdefault(dname, {})[s] = dict(
                r100_off=round(m_off["recall@100"], 4), r100_on=round(m_on["recall@100"], 4),
                ndcg_on=round(m_on["ndcg@10"], 4), off_topic=counts, shipped=shipped)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "out" / "gate_study"))
    ap.add_argument("--tuning", default="{}", help="Tuning fields (JSON) the captured queries run with")
    ap.add_argument("--hybrid-only", action="store_true")
    ap.add_argument("--simulate", default=None, help="JSON {design: {param: value}} (see sim_gate); no capture")
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if a.simulate is not None:
        designs = {"shipped": {}, **json.loads(a.simulate)}
        print(json.dumps(simulate(Path(a.out), a.sets.split(","), designs), indent=1))
        return
    tf = json.loads(a.tuning)
    if "impute_channels" in tf:
        tf["impute_channels"] = tuple(tf["impute_channels"])
    for s in a.sets.split(","):
        t0 = time.time()
        capture(s, Path(a.out), tf, ("hybrid",) if a.hybrid_only else ("hybrid", "keyword"))
        print(f"{s}: {time.time() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
