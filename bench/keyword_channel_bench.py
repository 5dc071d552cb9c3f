"""The keyword channel's SQL, an older commit's against this checkout's, interleaved per query on one connection.

    python bench/recall_latency.py --work /tmp/kb-bench-recall     # builds the 50,000-chunk synthetic index once
    python bench/keyword_channel_bench.py /tmp/kb-bench-recall [--ref a3f4ea0] [--tuning '{"title_weight": 0.5}']

Both queries get the same parameters (this checkout's Tuning); only the SQL text differs. Prints p50 / p95 per
query kind (150 short, 50 paragraph-long: recall_latency.make_queries) from the second of two passes, and checks
that both return the same rows (document, best chunk, score) when the title weight is 0.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def pct(v: list[float], q: float) -> float:
    v = sorted(v)
    return v[min(len(v) - 1, int(round(q / 100 * (len(v) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work")
    ap.add_argument("--ref", default="a3f4ea0", help="the commit whose keyword SQL is the 'before'")
    ap.add_argument("--tuning", default="{}")
    args = ap.parse_args()
    import recall_latency as rl

    from kb_assets.config import QuerySettings
    from kb_assets.query.engine import Tuning, _Filters, _Searcher
    from kb_assets.store.db import connect, embedded_url

    old_src = subprocess.run(["git", "-C", str(ROOT), "show", f"{args.ref}:kb_assets/query/engine.py"],
                             capture_output=True, text=True, check=True).stdout
    ns: dict = {}
    exec(old_src[old_src.index("_KEYWORD_TAIL = ("):old_src.index("_KEYWORD_SQL_NOSTATS")], ns)
    old_sql = ns["_KEYWORD_SQL"].replace(ns["_KEYWORD_TAIL"], ns["_KEYWORD_BM25_TAIL"]).replace("{filter}", "")
    conn = connect(embedded_url(Path(args.work)), register=False)
    queries = rl.make_queries(conn, 150, 50)
    tuning = Tuning(**json.loads(args.tuning))
    s = _Searcher(conn, QuerySettings(), tuning, _Filters())
    s.prepare(False)
    new_sql = s.keyword_sql()
    res = {"before": {"short": [], "paragraph": []}, "after": {"short": [], "paragraph": []}}
    differing = 0
    for rnd in range(2):
        for i, (text, _v, _d) in enumerate(queries):
            kind = "short" if i < 150 else "paragraph"
            p = s.keyword_params(text)
            order = (("before", old_sql), ("after", new_sql)) if (i + rnd) % 2 else (("after", new_sql), ("before", old_sql))
            rows = {}
            for name, sql in order:
                with conn.transaction():
                    conn.execute("SET LOCAL jit = off")
                    conn.execute("SET LOCAL max_parallel_workers_per_gather = 0")
                    t0 = time.perf_counter()
                    rows[name] = conn.execute(sql, p).fetchall()
                    if rnd:
                        res[name][kind].append((time.perf_counter() - t0) * 1000)
            if rnd and tuning.title_weight == 0:
                key = lambda rs: [(r[0], r[1], round(r[3], 9), r[4]) for r in rs]   # noqa: E731
                differing += key(rows["before"]) != key(rows["after"])
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; before = {args.ref}, tuning {args.tuning}")
    for name in res:
        for kind, v in res[name].items():
            print(f"{name:6} {kind:9} p50 {pct(v, 50):6.1f} ms  p95 {pct(v, 95):6.1f} ms  (n={len(v)})")
    if tuning.title_weight == 0:
        print(f"queries whose rows differ: {differing} of {len(queries)}")


if __name__ == "__main__":
    main()
