"""Query-embedding cost of the local model with N torch threads: wall and CPU ms per query (why `kb serve`
embeds with one thread by default, serve.embed_threads).

    python bench/serve_embed_threads.py 1 ; python bench/serve_embed_threads.py 2

One process per thread count (torch fixes its pool at the first pass). CPU time (process_time) is the figure a
busy machine does not inflate; wall time shows the contention.
"""
from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from kb_assets.embedding import LocalEmbedder  # noqa: E402


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    torch.set_num_threads(n)
    e = LocalEmbedder()
    e.embed_query("warm up")
    short = [f"how do we restart the celery workers after change {i}" for i in range(60)]
    para = " ".join(["the retry policy honours retry-after and backs off with jitter"] * 8)
    for label, items in (("short (10 words)", short), ("paragraph (~90 words)", [para + str(i) for i in range(20)])):
        c0, w0 = time.process_time(), time.perf_counter()
        for q in items:
            e.embed_query(q)
        c1, w1 = time.process_time(), time.perf_counter()
        print(f"threads={n} {label}: wall {1000 * (w1 - w0) / len(items):.1f} ms/query, "
              f"cpu {1000 * (c1 - c0) / len(items):.1f} ms/query, load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
