"""Chunks inserted with the tsvector GIN index in place, against without it and CREATE INDEX after (issue 14).

    python bench/gin_defer_probe.py "user=postgres dbname=x host=/tmp/pg options='-c search_path=kb,public'" /tmp/pg during,after

Copies the `chunks` (heading, text) of a database kb already filled into a scratch table shaped like `chunks`
(the same generated tsvector), in statements of 1,900 rows (a 100-document batch of the chunk stage), each its
own transaction; prints wall and the cluster's server CPU (bench/hnsw_parallel_probe.py's count; the second argument is its data folder). Drops the scratch table.
"""
import os
import sys
import time

import psycopg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hnsw_parallel_probe import postgres_cpu_seconds  # noqa: E402

BATCH = 1900


def run(url: str, data_dir: str, mode: str) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS gin_probe")
        c.execute("CREATE TABLE gin_probe (id bigserial PRIMARY KEY, heading text, text text, tsv tsvector"
                  " GENERATED ALWAYS AS (setweight(to_tsvector('english', heading), 'A') || to_tsvector('english', text))"
                  " STORED)")
        if mode == "during":
            c.execute("CREATE INDEX gin_probe_tsv ON gin_probe USING gin (tsv)")
        ids = [r[0] for r in c.execute("SELECT id FROM chunks ORDER BY id")]
        t0, cpu0 = time.perf_counter(), postgres_cpu_seconds(data_dir)
        for i in range(0, len(ids), BATCH):
            c.execute("INSERT INTO gin_probe (heading, text) SELECT heading, text FROM chunks"
                      " WHERE id BETWEEN %s AND %s ORDER BY id", (ids[i], ids[min(i + BATCH, len(ids)) - 1]))
        loaded = time.perf_counter() - t0
        if mode == "after":
            c.execute("SET maintenance_work_mem = '1GB'")
            c.execute("CREATE INDEX gin_probe_tsv ON gin_probe USING gin (tsv)")
        print(f"{mode:6s} rows {len(ids)}: load {loaded:.1f} s, total {time.perf_counter() - t0:.1f} s,"
              f" server CPU {postgres_cpu_seconds(data_dir) - cpu0:.1f} s, load {os.getloadavg()[0]:.1f}", flush=True)
        c.execute("DROP TABLE gin_probe")


if __name__ == "__main__":
    for m in sys.argv[3].split(","):
        run(sys.argv[1], sys.argv[2], m)
