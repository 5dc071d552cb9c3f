"""The chunk stage on a real embedded PostgreSQL: it stores exactly the chunks `chunk_document` cuts (odd
characters included), cuts batch N+1 while batch N is swapped in, swaps only documents still at the version
that was cut, records chunking errors, and keeps every committed batch when a batch fails."""
from __future__ import annotations

import threading

import pytest

import kb_assets.pipeline.chunks as chunks_mod
from kb_assets.chunking import chunk_document
from kb_assets.embedding import FixedCostEmbedder
from kb_assets.models import SourceDocument, sha256_hex
from kb_assets.pipeline import chunk_source
from kb_assets.store.db import connect

WORDS = ("queue worker batch retry timeout index vector chunk heading budget overlap swap transaction commit "
         "lexeme keyword cache tokenizer").split()


def _prose(i: int, n: int) -> str:
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(n)) + "."


def _texts() -> dict[str, str]:
    docs = {}
    for i in range(14):
        sections = "\n\n".join(f"## Part {j}\n\n{_prose(i + j, 30 + 40 * j)}\n\n{_prose(i * j, 25)}" for j in range(4))
        docs[f"docs/note-{i:02d}.md"] = f"# Note {i}\n\n{sections}\n"
    # what COPY's text format must escape, and more: backslashes, tabs, CR, backspace, vertical tab, form feed
    docs["docs/odd.md"] = ("# Odd \\ heading\twith tab\n\nback\\slash \\N \\\\ C:\\path\\n tab\there cr\r\nvt\x0b ff\x0c"
                           " bs\x08 del\x7f snow\u2603 emoji\U0001f642 " + _prose(3, 200) + "\n\n## Next\r\n\r\n"
                           + _prose(4, 20) + "\rlone cr\n")
    docs["src/tool.py"] = "\n\n".join(
        f"def f{i}(x):\n    \"\"\"{_prose(i, 12)}\"\"\"\n    return x + {i}  # \\t not a tab\n" for i in range(40))
    docs["docs/empty.md"] = "   \n\n"
    return docs


def _add(conn, docs: dict[str, str]) -> None:
    conn.execute("INSERT INTO sources (key, kind, root) VALUES ('s', 'doc', '/nowhere')")
    for path, text in docs.items():
        conn.execute("INSERT INTO documents (source_key, path, kind, status, content_hash, text)"
                     " VALUES ('s', %s, %s, 'active', %s, %s)",
                     (path, "code" if path.endswith(".py") else "doc", sha256_hex(text), text))


def _stored(conn) -> dict[str, list[tuple]]:
    out: dict[str, list[tuple]] = {}
    for row in conn.execute("SELECT d.path, c.ordinal, c.heading, c.start_line, c.end_line, c.token_count,"
                            " c.chunk_hash, c.text FROM chunks c JOIN documents d ON d.id = c.document_id"
                            " ORDER BY d.path, c.ordinal"):
        out.setdefault(row[0], []).append(row[1:])
    return out


@pytest.fixture
def emb():
    return FixedCostEmbedder(cost_per_text=0.0)


def _run(conn, emb):
    return chunk_source(conn, "s", max_tokens=emb.max_tokens, count_tokens=emb.count_tokens)


def test_stored_chunks_are_exactly_chunk_documents(conn, emb, monkeypatch):
    import sys

    monkeypatch.setattr(chunks_mod, "READ_BATCH", 3)       # several batches: cut and swap overlap
    docs = _texts()
    _add(conn, docs)
    switch = sys.getswitchinterval()
    stats = _run(conn, emb)
    assert sys.getswitchinterval() == switch                 # lowered while chunking only
    want = {}
    for path, text in docs.items():
        doc = SourceDocument(path=path, kind="code" if path.endswith(".py") else "doc", title="", text=text)
        cut = chunk_document(doc, max_tokens=emb.max_tokens, count_tokens=emb.count_tokens)
        if cut:
            want[path] = [(c.ordinal, c.heading, c.start_line, c.end_line, c.token_count, c.chunk_hash, c.text)
                          for c in cut]
    assert _stored(conn) == want
    assert any("\\" in c[6] and "\t" in c[6] and "\r" in c[6] and "\x0b" in c[6] for c in want["docs/odd.md"])
    assert all(h == sha256_hex(c[1] + "\0" + c[6]) for cs in want.values() for c in cs for h in [c[5]])
    assert stats.documents_chunked == len(docs) and stats.errors == 0
    assert stats.chunks_written == stats.chunks_total == sum(map(len, want.values()))
    assert conn.execute("SELECT count(*) FROM documents WHERE chunked_hash = content_hash").fetchone()[0] == len(docs)
    again = _run(conn, emb)                                   # nothing changed: nothing to cut
    assert again.documents_chunked == 0 and again.chunks_total == stats.chunks_total


def test_cutting_overlaps_the_swaps(conn, emb, monkeypatch):
    """Batch N+1 is cut in a worker thread while this thread swaps batch N in."""
    import time

    monkeypatch.setattr(chunks_mod, "READ_BATCH", 2)
    _add(conn, _texts())
    cutting = threading.Event()
    threads = set()
    swaps_during_cut = []
    real_cut, real_swap = chunks_mod._cut_batch, chunks_mod._swap

    def cut(*args, **kwargs):
        threads.add(threading.current_thread().name)
        cutting.set()
        try:
            time.sleep(0.05)
            return real_cut(*args, **kwargs)
        finally:
            cutting.clear()

    def swap(*args, **kwargs):
        # the next batch may take a moment to start in its thread; a sequential loop would never start it
        swaps_during_cut.append(cutting.wait(timeout=1.0))
        return real_swap(*args, **kwargs)

    monkeypatch.setattr(chunks_mod, "_cut_batch", cut)
    monkeypatch.setattr(chunks_mod, "_swap", swap)
    stats = _run(conn, emb)
    assert stats.documents_chunked == len(_texts())
    assert threading.current_thread().name not in threads
    assert len(swaps_during_cut) == 9 and all(swaps_during_cut[:-1])   # the last swap has nothing to overlap


def test_a_document_edited_while_being_cut_is_not_swapped(conn, db_url, emb, monkeypatch):
    monkeypatch.setattr(chunks_mod, "READ_BATCH", 4)
    docs = _texts()
    _add(conn, docs)
    real_cut = chunks_mod._cut_batch
    edited = []

    def cut(rows, **kwargs):
        doc_id, path = rows[-1][0], rows[-1][1]
        out = real_cut(rows, **kwargs)
        if not edited and len(rows) > 1:                      # another run moves this document on meanwhile
            with connect(db_url) as other:
                other.execute("UPDATE documents SET text = 'new text', content_hash = 'h2' WHERE id = %s", (doc_id,))
            edited.append(path)
        return out

    monkeypatch.setattr(chunks_mod, "_cut_batch", cut)
    stats = _run(conn, emb)
    assert stats.documents_chunked == len(docs) - 1
    stored = _stored(conn)
    assert edited[0] not in stored and len(stored) == len(docs) - 2      # docs/empty.md has no chunks
    assert conn.execute("SELECT chunked_hash FROM documents WHERE path = %s", (edited[0],)).fetchone()[0] is None
    monkeypatch.setattr(chunks_mod, "_cut_batch", real_cut)
    rerun = _run(conn, emb)                                   # the next run cuts the new version
    assert rerun.documents_chunked == 1 and [c[6] for c in _stored(conn)[edited[0]]] == ["new text"]


def test_chunking_error_is_recorded_and_the_rest_is_swapped(conn, emb, monkeypatch):
    import kb_assets.chunking as chunking

    monkeypatch.setattr(chunks_mod, "READ_BATCH", 5)
    docs = _texts()
    _add(conn, docs)
    real = chunking.chunk_document

    def flaky(doc, **kwargs):
        if doc.path == "docs/note-03.md":
            raise ValueError("cannot cut this")
        return real(doc, **kwargs)

    monkeypatch.setattr(chunking, "chunk_document", flaky)
    stats = _run(conn, emb)
    assert stats.errors == 1 and stats.documents_chunked == len(docs) - 1
    meta, chunked = conn.execute("SELECT meta, chunked_hash FROM documents WHERE path = 'docs/note-03.md'").fetchone()
    assert meta["chunk_error"] == "ValueError: cannot cut this" and chunked is None
    assert "docs/note-03.md" not in _stored(conn) and "docs/note-04.md" in _stored(conn)


def test_a_failing_batch_keeps_the_committed_batches(conn, emb, monkeypatch):
    monkeypatch.setattr(chunks_mod, "READ_BATCH", 10)      # batches of 1, 10 and 6 documents
    docs = _texts()
    _add(conn, docs)
    real_cut = chunks_mod._cut_batch
    calls = []

    def cut(rows, **kwargs):
        calls.append(len(rows))
        if len(calls) == 3:
            raise MemoryError("worker died")
        return real_cut(rows, **kwargs)

    monkeypatch.setattr(chunks_mod, "_cut_batch", cut)
    with pytest.raises(MemoryError):
        _run(conn, emb)
    # the first two batches are in, whole; nothing of the failed one; a re-run finishes the work
    done = {r[0] for r in conn.execute("SELECT path FROM documents WHERE chunked_hash = content_hash")}
    assert calls == [1, 10, 6] and len(done) == 11 and set(_stored(conn)) <= done
    monkeypatch.setattr(chunks_mod, "_cut_batch", real_cut)
    rerun = _run(conn, emb)
    assert rerun.documents_chunked == len(docs) - 11 and rerun.errors == 0


def test_copy_fields_are_escaped_like_psycopg():
    from psycopg._copy_base import _dump_re, _dump_sub

    value = "a\\b\tc\nd\re\x08f\x0bg\x0ch\x00i\\N ☃"
    assert chunks_mod._copy_field(value).encode() == _dump_re.sub(_dump_sub, value.replace("\x00", "").encode())


def test_first_load_ahead_only_when_most_of_a_large_source_was_never_chunked(conn, emb, monkeypatch):
    """The model warm-up's trigger: a first run of a large source, not a re-run that changed a few files."""
    monkeypatch.setattr(chunks_mod, "WARM_UP_MIN_DOCUMENTS", 10)
    _add(conn, _texts())                                   # 18 documents, none chunked
    assert chunks_mod.first_load_ahead(conn, "s")
    _run(conn, emb)
    assert not chunks_mod.first_load_ahead(conn, "s")      # all chunked
    for i in range(9):                                     # a rename of half of them: new rows, not chunked
        conn.execute("INSERT INTO documents (source_key, path, kind, status, content_hash, text)"
                     " SELECT source_key, path || '-moved', kind, status, content_hash, text FROM documents"
                     " WHERE path = %s", (f"docs/note-{i:02d}.md",))
    assert not chunks_mod.first_load_ahead(conn, "s")      # 9 new of 27: under half, and under the minimum
    monkeypatch.setattr(chunks_mod, "WARM_UP_MIN_DOCUMENTS", 5)
    assert not chunks_mod.first_load_ahead(conn, "s")      # under half of the source
