"""Hybrid ranking (gate off) of one quality set under several Tuning settings, on its cached index: a quick
look before a full bench/quality.py run (no baseline, no gate). KB_QUALITY_CACHE as for quality.py.

    python bench/variant_check.py peps_whatsnew '{"off": {"impute_rank": "off"}, "window": {"impute_rank": "window"}}'
"""
import sys, json, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent)); sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import quality as Q
from kb_assets.config import load_config
from kb_assets.store.db import connect, open_database
from kb_assets.query import Tuning
s = sys.argv[1]; variants = json.loads(sys.argv[2])
es = Q.make_sets()[s]
work = Q.OUT/'index'/f"{s}-{Q.set_key(es)}"
cfg = load_config(work/'kb.yaml'); conn = connect(open_database(cfg), register=False)
emb = Q.MemoEmbedder(cfg); qs = es.queries(); qrels = es.qrels()
for name, tf in variants.items():
    if "impute_channels" in tf: tf["impute_channels"] = tuple(tf["impute_channels"])
    t0 = time.time()
    runs = Q.kb_runs(es, cfg, conn, emb, qs, modes=("hybrid",), tuning=Tuning(**tf), gate=False)
    m = Q.score(runs["hybrid"], qrels)
    print(f"{s} {name:14} nDCG@10 {m['ndcg@10']:.4f} R@10 {m['recall@10']:.4f} R@100 {m['recall@100']:.4f} MRR {m['mrr@10']:.4f} ({time.time()-t0:.0f}s)", flush=True)
