"""HNSW build time and server CPU by max_parallel_maintenance_workers (issue 14: is the build already parallel?).

    python bench/hnsw_parallel_probe.py /tmp/hnsw_probe_pg 20000 0,2,4,0,2

Starts (or reuses) a pgserver cluster in the given folder, loads N uniform random unit 384-d vectors (the
stand-in embedder's kind: HNSW's worst case), and builds the cosine HNSW index once per listed worker count with
maintenance_work_mem = 1GB (as spaces.ensure_vector_index). Server CPU is that cluster's: its postmaster's
utime+stime+cutime+cstime (it reaps the backends and parallel workers) plus its live children's.
"""
import math
import os
import random
import sys
import time

import pgserver
import psycopg


def postgres_cpu_seconds(data_dir: str) -> float:
    """CPU seconds of one cluster: its postmaster (with the children it reaped: backends, parallel workers) and
    its live children. Other clusters on the machine (other agents' pgservers) are not counted."""
    with open(os.path.join(data_dir, "postmaster.pid")) as f:
        postmaster = f.readline().strip()
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if pid == postmaster:
            total += sum(int(x) for x in fields[11:15]) / tick        # utime stime cutime cstime
        elif fields[1] == postmaster:
            total += sum(int(x) for x in fields[11:13]) / tick        # a live child: utime stime
    return total


def main() -> None:
    folder, n, workers = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
    server = pgserver.get_server(folder, cleanup_mode="stop")
    with psycopg.connect(server.get_uri(), autocommit=True) as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS vector")
        for s in ("max_parallel_maintenance_workers", "max_worker_processes", "maintenance_work_mem"):
            print(s, c.execute(f"SHOW {s}").fetchone()[0])
        c.execute("DROP TABLE IF EXISTS hnsw_probe")
        c.execute("CREATE TABLE hnsw_probe (id int, embedding vector(384))")
        rng = random.Random(1)
        with c.cursor().copy("COPY hnsw_probe FROM STDIN") as copy:
            for i in range(n):
                v = [rng.gauss(0, 1) for _ in range(384)]
                norm = math.sqrt(sum(x * x for x in v))
                copy.write_row((i, "[" + ",".join(f"{x / norm:.6f}" for x in v) + "]"))
        c.execute("VACUUM ANALYZE hnsw_probe")
        for w in workers:
            c.execute("DROP INDEX IF EXISTS hnsw_probe_idx")
            c.execute("SET maintenance_work_mem = '1GB'")
            c.execute(f"SET max_parallel_maintenance_workers = {int(w)}")
            t0, cpu0 = time.perf_counter(), postgres_cpu_seconds(folder)
            c.execute("CREATE INDEX hnsw_probe_idx ON hnsw_probe USING hnsw (embedding vector_cosine_ops)")
            print(f"workers={w} build {time.perf_counter() - t0:.1f} s, server CPU {postgres_cpu_seconds(folder) - cpu0:.1f} s,"
                  f" load {os.getloadavg()[0]:.2f}", flush=True)
        c.execute("DROP TABLE hnsw_probe")


if __name__ == "__main__":
    main()
