"""The regression check's query-vector cache (pipeline/regression_check.py) never uses its connection from the
thread recall() embeds queries in: recall() searches on that connection meanwhile, and psycopg connections are not
for two threads at once (the check used to fail its first try with "cannot enter pipeline mode, connection not
idle" and be retried). Real PostgreSQL; a stand-in embedder."""
from __future__ import annotations

import threading

from kb_assets.pipeline.regression_check import CachedQueryEmbedder


class _Embedder:
    model, dimension = "stand-in", 3

    def embed_query(self, text: str) -> list[float]:
        return [1.0, float(len(text)), 0.5]


class _Watched:
    """The connection, noting the thread of every use."""

    def __init__(self, conn, seen: list[int]):
        self._conn, self._seen = conn, seen

    def __getattr__(self, name):
        self._seen.append(threading.get_ident())
        return getattr(self._conn, name)


def test_vectors_embedded_in_another_thread_are_written_by_save_in_the_connection_thread(conn):
    seen: list[int] = []
    cached = CachedQueryEmbedder(_Watched(conn, seen), _Embedder())
    out = {}
    worker = threading.Thread(target=lambda: out.update(a=cached.embed_query("first"), b=cached.embed_query("second")))
    worker.start()
    worker.join()
    assert out == {"a": [1.0, 5.0, 0.5], "b": [1.0, 6.0, 0.5]}
    assert seen == [], "embed_query touched the connection from the embedding thread"
    assert cached.embedded == 2

    assert cached.save() == 2
    assert seen and set(seen) == {threading.get_ident()}
    assert cached.save() == 0                        # nothing new since

    again = CachedQueryEmbedder(conn, _Embedder())
    assert again.preload(["first", "second", "third"]) == 2
    assert again.embed_query("first") == [1.0, 5.0, 0.5] and again.embedded == 0
