"""Documents stage (sync_documents) alone on a folder of markdown (e.g. peerbench's synthetic corpus), a fresh
database per round: wall and CPU seconds of this process. Compare two checkouts in one session by alternating
PYTHONPATH (the script imports kb_assets from there):

    for t in /work/main . /work/main .; do PYTHONPATH=$t .venv/bin/python bench/documents_synth_bench.py \\
        /tmp/pb/work/synth /tmp/kbdocs 1; done
"""
import sys
import time
import uuid
from pathlib import Path

import psycopg
import psycopg.conninfo as ci

import kb_assets
from kb_assets.config import parse_config
from kb_assets.pipeline.documents import sync_documents
from kb_assets.store.db import connect, embedded_url, migrate

corpus, work, rounds = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
work.mkdir(parents=True, exist_ok=True)
url = embedded_url(work)
for _ in range(rounds):
    name = "d_" + uuid.uuid4().hex[:8]
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    params = ci.conninfo_to_dict(url)
    params["dbname"] = name
    u = ci.make_conninfo(**params)
    cfg = parse_config({"data_dir": str(work / "data"), "database_url": u,
                        "sources": [{"key": "synth", "kind": "doc", "root": corpus}]},
                       path=str(work / "kb.yaml"), base_dir=str(work))
    with connect(u) as conn:
        migrate(conn)
        t, c = time.perf_counter(), time.process_time()
        stats = sync_documents(conn, cfg, cfg.sources[0])
        wall, cpu = time.perf_counter() - t, time.process_time() - c
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    print(f"{Path(kb_assets.__file__).parents[1]}: documents stage {wall:.2f} s wall, {cpu:.2f} s CPU here,"
          f" {stats.new} new, {stats.skipped} skipped", flush=True)
