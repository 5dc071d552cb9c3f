"""Query-embedding cost of kb serve's encoder (onnxruntime, embedding/numpy_bert.py) with 1 and 2 intra-op
threads, asked in turn in one process so both see the same load: wall p50/p95 and CPU ms per query.

    python bench/serve_embed_threads.py

(The torch figures of the "kb serve: query embedding threads" section came from this script's earlier,
torch version: torch's spinning OpenMP threads cost 14x the CPU on a busy machine. onnxruntime's spinning is
off in kb's session options, so a second thread costs ~5% more CPU and returns the answer sooner.)
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from kb_assets.embedding import numpy_bert  # noqa: E402
from kb_assets.embedding.local import packaged_model_dir  # noqa: E402


def main() -> None:
    path = packaged_model_dir()
    encoders = {t: numpy_bert.OnnxBertEncoder(path, threads=t) for t in (1, 2)}
    words = ("the retry policy honours retry-after and backs off with jitter when the upstream service "
             "answers slowly").split()
    paragraphs = [" ".join(words[(i + j) % len(words)] for j in range(85)) + f" {i}" for i in range(40)]
    short = [f"how do we restart the celery workers after change {i}" for i in range(40)]
    for e in encoders.values():
        e.encode(["warm up"])
    for label, items in (("short (10 words)", short), ("paragraph (~85 words)", paragraphs)):
        wall: dict[int, list[float]] = {1: [], 2: []}
        cpu = {1: 0.0, 2: 0.0}
        for k, q in enumerate(items):
            for t in ((1, 2) if k % 2 else (2, 1)):
                c0, w0 = time.process_time(), time.perf_counter()
                encoders[t].encode([q])
                wall[t].append((time.perf_counter() - w0) * 1000)
                cpu[t] += (time.process_time() - c0) * 1000
        for t in (1, 2):
            v = sorted(wall[t])
            print(f"{label}, threads={t}: wall p50 {v[len(v) // 2]:.1f} ms, p95 {v[int(len(v) * 0.95)]:.1f} ms, "
                  f"cpu {cpu[t] / len(v):.1f} ms/query, load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
