"""What-if (bench only): the extractive signposts stage beside the embedding stage in one process, against one
after the other, on a database the pipeline already filled (documents and chunks present).

`kb index` runs the Dagster steps one after another, so kb_signposts (CPU in Python) and kb_embeddings (a
worker thread waiting on the model; with the 2 ms/text stand-in, sleeping) never overlap, although the asset
graph allows it. This measures what overlapping them would save, without Dagster: each round first deletes
the stand-in's vectors and every signpost, then runs the two stages serially or in two threads (each its own
connection). Rounds alternate the order of the modes.

    python bench/overlap_whatif.py "host=/tmp/pg dbname=x user=postgres" --source corpus --rounds 2
"""
from __future__ import annotations

import argparse
import os
import threading
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--source", default="corpus")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cost", type=float, default=0.002)
    args = ap.parse_args()
    from psycopg import sql

    from kb_assets.embedding import FixedCostEmbedder
    from kb_assets.pipeline.embeddings import embed_source
    from kb_assets.pipeline.signposts import run_signposts
    from kb_assets.signposts.extractive import ExtractiveSignposter
    from kb_assets.store import spaces
    from kb_assets.store.db import connect

    conn, other = connect(args.url), connect(args.url)
    embedder = FixedCostEmbedder(args.cost)
    table = spaces.ensure_space(conn, embedder.model, embedder.dimension)
    spaces.drop_vector_index(conn, table)

    def reset() -> None:
        with conn.transaction():
            conn.execute(sql.SQL("DELETE FROM {t}").format(t=sql.Identifier(table)))
            conn.execute("DELETE FROM signpost_state")
            conn.execute("DELETE FROM signposts")
        conn.execute("CHECKPOINT")

    def embeddings() -> float:
        t0 = time.perf_counter()
        s = embed_source(conn, embedder, source_key=args.source)
        assert s.missing_after == 0, s
        return time.perf_counter() - t0

    def signposts(c) -> float:
        t0 = time.perf_counter()
        run_signposts(c, args.source, ExtractiveSignposter())
        return time.perf_counter() - t0

    for rnd in range(args.rounds):
        for mode in (("serial", "overlap") if rnd % 2 == 0 else ("overlap", "serial")):
            reset()
            cpu0, t0 = os.times(), time.perf_counter()
            if mode == "serial":
                e = embeddings()
                s = signposts(conn)
            else:
                out = {}
                th = threading.Thread(target=lambda: out.setdefault("s", signposts(other)))
                th.start()
                e = embeddings()
                th.join()
                s = out["s"]
            wall = time.perf_counter() - t0
            cpu = sum(os.times()[:2]) - sum(cpu0[:2])
            n = embedder.texts_embedded
            print(f"round {rnd} {mode:7s} wall {wall:6.1f} s (embeddings {e:5.1f}, signposts {s:5.1f}) cpu {cpu:5.1f} s"
                  f" texts so far {n} load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
