"""Per-row HNSW insert cost while a table grows, against a bulk build after the load (issue 14).

    python bench/hnsw_insert_probe.py "postgresql://postgres@/postgres?host=/tmp/pg" 10000 during|after

Uses a table `probe` in the given database (dropped and recreated). Results: docs/BENCHMARKS.md, issue 14 section.
"""
import sys, time, numpy as np, psycopg
from pgvector.psycopg import register_vector
url = sys.argv[1]; n = int(sys.argv[2]); mode = sys.argv[3]
rng = np.random.default_rng(1)
with psycopg.connect(url, autocommit=True) as c:
    c.execute("CREATE EXTENSION IF NOT EXISTS vector"); register_vector(c)
    c.execute("DROP TABLE IF EXISTS probe"); c.execute("CREATE TABLE probe (h text primary key, embedding vector(384))")
    if mode == "during":
        c.execute("CREATE INDEX ON probe USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 40)")
    c.execute("SET synchronous_commit = off")
    t0 = time.perf_counter(); marks = []
    for b in range(n // 500):
        v = rng.standard_normal((500, 384)).astype(np.float32); v /= np.linalg.norm(v, axis=1, keepdims=True)
        tb = time.perf_counter()
        with c.transaction():
            with c.cursor().copy("COPY probe (h, embedding) FROM STDIN WITH (FORMAT BINARY)") as cp:
                cp.set_types(["text", "vector"])
                for i in range(500): cp.write_row((f"{b}-{i}", v[i]))
        marks.append(time.perf_counter() - tb)
    load = time.perf_counter() - t0
    if mode == "after":
        tb = time.perf_counter()
        with c.transaction():
            c.execute("SET LOCAL maintenance_work_mem = '1GB'")
            c.execute("CREATE INDEX ON probe USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 40)")
        print("build", round(time.perf_counter() - tb, 2))
    print(mode, n, "load", round(load, 2), "per-batch first/last ms per row", round(marks[0] * 2, 2), round(marks[-1] * 2, 2))
