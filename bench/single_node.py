"""Where one node's limits are: the largest shared corpus (the 751 PEPs) indexed from nothing in one process,
with the fixed-cost stand-in embedder (2 ms per text; the local model's tokenizer and window, no torch) and
extractive signposts, into a fresh embedded PostgreSQL. Run it under /usr/bin/time -v for wall time and
peak RSS (docs/DEPLOYMENT.md, "Single-node limits"):

    /usr/bin/time -v .venv/bin/python bench/single_node.py [--cost 0.002]
"""
from __future__ import annotations

import argparse
import json
import tarfile
import tempfile
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default=str(SHARED / "corpora" / "python-peps-ba4deeb79695.tar.gz"))
    ap.add_argument("--cost", type=float, default=0.002)
    args = ap.parse_args()

    from kb_assets.config import parse_config
    from kb_assets.embedding.fixed import FixedCostEmbedder
    from kb_assets.pipeline import index_sources
    from kb_assets.signposts.extractive import ExtractiveSignposter
    from kb_assets.store.db import connect, embedded_url, migrate

    work = Path(tempfile.mkdtemp(prefix="kb-single-", dir="/tmp"))
    with tarfile.open(args.corpus) as tar:
        tar.extractall(work, filter="data")
    root = next(work.iterdir())
    cfg = parse_config({"sources": [{"key": "peps", "kind": "doc", "root": str(root),
                                     "include": ["peps/pep-*.rst"], "content": "worktree"}]},
                       path="<bench>", base_dir=str(work))
    url = embedded_url(work / "db")
    started = time.perf_counter()
    with connect(url, register=False) as c:
        migrate(c)
    with connect(url) as conn:
        runs = index_sources(cfg, conn, embedder=FixedCostEmbedder(args.cost), signposter=ExtractiveSignposter())
        docs, chunks = conn.execute("SELECT (SELECT count(*) FROM documents WHERE status = 'active'),"
                                    " (SELECT count(*) FROM chunks)").fetchone()
    wall = time.perf_counter() - started
    print(json.dumps({"documents": docs, "chunks": chunks, "seconds": round(wall, 1),
                      "stand_in_seconds": round(chunks * args.cost, 1),
                      "stages": {k: str(v)[:200] for k, v in runs.items()}}, indent=1))


if __name__ == "__main__":
    main()
