"""Helpers for the query tests (no tests here): a deterministic toy embedder and direct table inserts."""
from __future__ import annotations

import hashlib
import json
import math
import re

TOY_MODEL = "toy-bag-of-words"
TOY_DIM = 64
_STOP = {"the", "a", "an", "of", "and", "or", "to", "in", "on", "for", "is", "we", "it", "with", "by", "be",
         "this", "that", "as", "at", "are", "was", "from"}


class ToyEmbedder:
    """Signed feature hashing of 5-letter word prefixes into 64 dims, L2-normalised: similar words, similar
    vectors; deterministic, no model. Counts its calls."""

    model = TOY_MODEL
    dimension = TOY_DIM

    def __init__(self):
        self.calls = 0

    def vec(self, text: str) -> list[float]:
        v = [0.0] * TOY_DIM
        for w in re.findall(r"[a-z0-9]+", text.lower()):
            if w in _STOP:
                continue
            h = int.from_bytes(hashlib.md5(w[:5].encode()).digest()[:4], "little")
            v[h % TOY_DIM] += 1.0 if (h >> 8) & 1 else -1.0
        n = math.sqrt(sum(x * x for x in v))
        if n == 0:
            v[0], n = 1.0, 1.0
        return [x / n for x in v]

    def embed_query(self, text: str) -> list[float]:
        self.calls += 1
        return self.vec(text)


def chunk_hash(heading: str, text: str) -> str:
    return hashlib.sha256((heading + "\0" + text).encode()).hexdigest()


class Corpus:
    """Inserts sources, documents, chunks, vectors and signposts straight into a migrated database."""

    def __init__(self, conn, embedder: ToyEmbedder | None = None):
        from kb_assets.store.spaces import activate_space, ensure_space

        self.conn = conn
        self.emb = embedder or ToyEmbedder()
        self.table = ensure_space(conn, self.emb.model, self.emb.dimension)
        activate_space(conn, self.emb.model, self.emb.dimension)
        self.sources: set[str] = set()

    def source(self, key: str, root: str = "/nonexistent", commit: str | None = None, kind: str = "doc"):
        self.conn.execute(
            "INSERT INTO sources (key, kind, root, indexed_commit) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (key) DO UPDATE SET root = EXCLUDED.root, indexed_commit = EXCLUDED.indexed_commit",
            (key, kind, root, commit))
        self.sources.add(key)

    def doc(self, path: str, chunks: list[str] | list[tuple[str, str]], *, source: str = "docs", kind: str = "doc",
            title: str | None = None, meta: dict | None = None, text: str | None = None,
            signpost: dict | None = None, file_sig: str | None = None, commit: str | None = None) -> int:
        if source not in self.sources:
            self.source(source)
        pairs = [(c, "") if isinstance(c, str) else (c[1], c[0]) for c in chunks]   # (text, heading)
        body = text if text is not None else "\n\n".join(t for t, _ in pairs)
        chash = hashlib.sha256(body.encode()).hexdigest()
        did = self.conn.execute(
            "INSERT INTO documents (source_key, path, kind, title, status, content_hash, meta, text, file_sig,"
            " indexed_commit) VALUES (%s, %s, %s, %s, 'active', %s, %s, %s, %s, %s) RETURNING id",
            (source, path, kind, title or path.rsplit("/", 1)[-1], chash, json.dumps(meta or {}), body, file_sig,
             commit)).fetchone()[0]
        # the documents stage's normalised columns (dates, status, tags), as sync_documents writes them
        from kb_assets.pipeline.document_fields import write_fields
        write_fields(self.conn, source, [(path, kind, meta or {}, file_sig)])
        line = 1
        for n, (t, heading) in enumerate(pairs):
            h = chunk_hash(heading, t)
            lines = t.count("\n") + 1
            self.conn.execute(
                "INSERT INTO chunks (document_id, ordinal, heading, start_line, end_line, token_count, chunk_hash, text)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                (did, n, heading, line, line + lines - 1, len(t.split()), h, t))
            line += lines + 1
            vec = self.emb.vec(f"{heading}\n{t}" if heading else t)
            self.conn.execute(
                f"INSERT INTO {self.table} (chunk_hash, embedding) VALUES (%s, %s::vector) ON CONFLICT DO NOTHING",
                (h, "[" + ",".join(repr(x) for x in vec) + "]"))
        if signpost is not None:
            gen = signpost.pop("_generator", "extractive")
            self.conn.execute(
                "INSERT INTO signposts (content_hash, generator, model, prompt_version, schema_version, payload)"
                " VALUES (%s, %s, '', 'test', 1, %s) ON CONFLICT DO NOTHING", (chash, gen, json.dumps(signpost)))
            self.conn.execute(
                "INSERT INTO signpost_state (document_id, content_hash, generator, model, prompt_version)"
                " VALUES (%s, %s, %s, '', 'test')", (did, chash, gen))
        return did

    def refresh(self):
        from kb_assets.pipeline.query_stats import refresh_query_stats
        return refresh_query_stats(self.conn)
