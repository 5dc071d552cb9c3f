"""HNSW build time by (m, ef_construction) on N uniform random unit 384-d vectors (the stand-in embedder's kind),
server CPU of the probe's own pgserver cluster (bench/hnsw_parallel_probe.postgres_cpu_seconds).

    .venv/bin/python bench/hnsw_settings_probe.py 20000 16/64,16/40,16/32,12/40 [/tmp/hnsw_settings_pg]
"""
import sys, time, random, math, os
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hnsw_parallel_probe import postgres_cpu_seconds
import pgserver, psycopg
d = sys.argv[3] if len(sys.argv) > 3 else "/tmp/hnsw_settings_pg"; n = int(sys.argv[1]); combos = [tuple(map(int, c.split("/"))) for c in sys.argv[2].split(",")]
srv = pgserver.get_server(d, cleanup_mode="stop")
with psycopg.connect(srv.get_uri(), autocommit=True) as conn:
    conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    have = conn.execute("SELECT to_regclass('v')").fetchone()[0]
    if not have:
        conn.execute("CREATE TABLE v (id int, embedding vector(384))")
        rnd = random.Random(1)
        with conn.cursor().copy("COPY v FROM STDIN") as cp:
            for i in range(n):
                x = [rnd.gauss(0, 1) for _ in range(384)]; s = math.sqrt(sum(a * a for a in x))
                cp.write_row((i, "[" + ",".join(f"{a / s:.6f}" for a in x) + "]"))
    print("rows", conn.execute("SELECT count(*) FROM v").fetchone()[0], flush=True)
    for m, efc in combos:
        conn.execute("DROP INDEX IF EXISTS v_hnsw")
        conn.execute("SET maintenance_work_mem = '1GB'")
        c0 = postgres_cpu_seconds(os.path.join(d, "pgdata") if os.path.isdir(os.path.join(d, "pgdata")) else d); t = time.perf_counter()
        conn.execute(f"CREATE INDEX v_hnsw ON v USING hnsw (embedding vector_cosine_ops) WITH (m = {m}, ef_construction = {efc})")
        w = time.perf_counter() - t
        c1 = postgres_cpu_seconds(os.path.join(d, "pgdata") if os.path.isdir(os.path.join(d, "pgdata")) else d)
        print(f"m={m} ef_construction={efc}: {w:.1f} s wall, {c1 - c0:.1f} s server CPU, load {os.getloadavg()[0]:.1f}", flush=True)
