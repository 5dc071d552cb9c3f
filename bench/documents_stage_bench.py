"""Documents stage wall time on the Rust RFC corpus, a fresh database per round: (full s, unchanged re-run s,
new, unchanged) per round. Compare two code versions with PYTHONPATH=<checkout>:

    PYTHONPATH=. .venv/bin/python bench/documents_stage_bench.py 3
"""
import sys, tempfile, time, uuid, tarfile, glob
from pathlib import Path
import psycopg
from kb_assets.store.db import embedded_url, connect, migrate
from kb_assets.config import parse_config
from kb_assets.pipeline.documents import sync_documents
import psycopg.conninfo as ci

root = Path(tempfile.gettempdir()) / "kb-bench-rfcs"
if not root.exists():
    with tarfile.open(glob.glob("/work/shared/corpora/rust-rfcs-*.tar.gz")[0]) as t:
        t.extractall(root, filter="data")
base = Path(tempfile.mkdtemp(prefix="kbpg-", dir="/tmp"))
url = embedded_url(base)
out = []
for r in range(int(sys.argv[1])):
    name = "b_" + uuid.uuid4().hex[:8]
    with psycopg.connect(url, autocommit=True) as a:
        a.execute(f'CREATE DATABASE "{name}"')
    p = ci.conninfo_to_dict(url); p["dbname"] = name; u = ci.make_conninfo(**p)
    with connect(u, register=False) as c:
        migrate(c)
    cfg = parse_config({"database_url": u, "sources": [{"key": "rfcs", "kind": "doc", "root": str(root),
                        "include": ["**/text/*.md"]}]}, path=str(root / "kb.yaml"), base_dir=str(root))
    with connect(u) as c:
        t0 = time.perf_counter(); s = sync_documents(c, cfg, cfg.sources[0]); full = time.perf_counter() - t0
        t0 = time.perf_counter(); s2 = sync_documents(c, cfg, cfg.sources[0]); again = time.perf_counter() - t0
    out.append((round(full, 2), round(again, 3), s.new, s2.unchanged))
print(out)
