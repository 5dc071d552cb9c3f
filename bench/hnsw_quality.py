"""HNSW build settings (m, ef_construction) against recall quality, on copies of the quality harness's indexes.

    .venv/bin/python bench/hnsw_quality.py --work /tmp/hq --sets regression,code_history,rust_rfcs,peps_whatsnew \
        --variants 16/64,16/40,16/32

For each set: copies its newest cached index folder (bench/quality.py's cache, $KB_QUALITY_CACHE or
/work/cache/quality; the copy is what gets changed, never the cache), then per variant rebuilds the active space's
chunk-vector HNSW index `WITH (m, ef_construction)` (maintenance_work_mem 1GB, as spaces.ensure_vector_index),
times the build (wall and this backend's server CPU) and scores kb's recall() exactly as bench/quality.py does
(hybrid / vector / keyword with the relevance gate off, hybrid with it on; nDCG@10 and Recall@100). The first
variant should be pgvector's default (16/64): the reference, measured in the same run on the same copy.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def _backend_cpu(conn) -> float:
    fields = Path(f"/proc/{conn.info.backend_pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def newest_index(cache: Path, name: str) -> Path:
    dirs = sorted((cache / "index").glob(f"{name}-*/built.json"), key=lambda p: p.stat().st_mtime)
    if not dirs:
        sys.exit(f"hnsw_quality: no built index of {name} under {cache}")
    return dirs[-1].parent


def rebuild(conn, table: str, m: int, efc: int) -> dict:
    from psycopg import sql

    from kb_assets.store.spaces import vector_index_name

    conn.execute(sql.SQL("DROP INDEX IF EXISTS {i}").format(i=sql.Identifier(vector_index_name(table))))
    conn.commit()
    cpu0, t0 = _backend_cpu(conn), time.perf_counter()
    with conn.transaction():
        conn.execute("SET LOCAL maintenance_work_mem = '1GB'")
        conn.execute(sql.SQL("CREATE INDEX {i} ON {t} USING hnsw (embedding vector_cosine_ops)"
                             " WITH (m = {m}, ef_construction = {e})").format(
            i=sql.Identifier(vector_index_name(table)), t=sql.Identifier(table), m=sql.Literal(m),
            e=sql.Literal(efc)))
    # parallel workers' CPU is not this backend's: the wall time is the figure, CPU a lower bound
    return {"build_s": round(time.perf_counter() - t0, 2), "backend_cpu_s": round(_backend_cpu(conn) - cpu0, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True, help="short folder for the copies (socket path limit)")
    ap.add_argument("--sets", default="regression,code_history,rust_rfcs,peps_whatsnew")
    ap.add_argument("--variants", default="16/64,16/40,16/32", help="m/ef_construction, the reference first")
    ap.add_argument("--cache", default=os.environ.get("KB_QUALITY_CACHE", "/work/cache/quality"))
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import quality as q

    from kb_assets.config import load_config
    from kb_assets.store import spaces
    from kb_assets.store.db import connect, open_database

    cache, work = Path(args.cache), Path(args.work)
    q.OUT = work                       # corpora and baseline are read through it: link them
    work.mkdir(parents=True, exist_ok=True)
    for sub in ("corpora", "baseline"):
        if not (work / sub).exists():
            (work / sub).symlink_to(cache / sub)
    variants = [tuple(map(int, v.split("/"))) for v in args.variants.split(",")]
    sets = q.make_sets()
    out: dict = {"command": " ".join(sys.argv), "load_start": q.load_avg(), "sets": {}}
    for name in args.sets.split(","):
        es = sets[name]
        src = newest_index(cache, name)
        dst = work / "index" / src.name
        if not dst.exists():
            # a server may be running on the cache's copy (another checkout evaluating): not its socket or pid file
            shutil.copytree(src, dst, symlinks=True,
                            ignore=shutil.ignore_patterns(".s.PGSQL.*", "postmaster.pid", "postmaster.opts"))
            owner = (src / "data" / "pg").owner()      # run as root, pgserver owns its clusters (user pgserver)
            subprocess.run(["chown", "-R", owner, str(dst / "data" / "pg")], check=True)
        cfg = load_config(dst / "kb.yaml")
        conn = connect(open_database(cfg), register=False)
        table = spaces.active_space(conn)[2]
        vectors = conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
        emb = q.MemoEmbedder(cfg)
        queries, qrels = es.queries(), es.qrels()
        res = {"index": src.name, "vectors": vectors, "queries": len(queries), "variants": {}}
        for m, efc in variants:
            row = {"load_before": q.load_avg(), **rebuild(conn, table, m, efc)}
            kb = q.kb_runs(es, cfg, conn, emb, queries, gate=False)
            row["gate_off"] = {mode: q.score(run, qrels) for mode, run in kb.items()}
            g = q.kb_runs(es, cfg, conn, emb, queries, modes=("hybrid",), gate=True)
            row["gate_on_hybrid"] = q.score(g["hybrid"], qrels)
            res["variants"][f"{m}/{efc}"] = row
            h, v = row["gate_off"]["hybrid"], row["gate_off"]["vector"]
            print(f"{name:14} m={m:<3} ef_construction={efc:<4} build {row['build_s']:6.2f} s  "
                  f"hybrid nDCG@10 {h['ndcg@10']:.4f} R@100 {h['recall@100']:.4f}  vector nDCG@10 "
                  f"{v['ndcg@10']:.4f} R@100 {v['recall@100']:.4f}  gate on R@100 "
                  f"{row['gate_on_hybrid']['recall@100']:.4f}  (load {row['load_before']})", flush=True)
        conn.close()
        q._stop_server(dst / "data")
        out["sets"][name] = res
    out["load_end"] = q.load_avg()
    (work / "hnsw_quality.json").write_text(json.dumps(out, indent=1))
    print(f"results: {work / 'hnsw_quality.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
