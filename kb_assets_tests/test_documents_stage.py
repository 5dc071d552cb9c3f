"""The documents stage's batched writes: one upsert statement per batch (arrays in binary) on a writer thread.

The batched statement is compared with the former per-row statements (kept here as the reference) on two
databases fed by the same runs: every column of every row, whether `updated_at` moved, and which chunks
survived, after first runs and after every kind of change (new, changed, unchanged, skipped both ways,
work items removed from an export, files deleted), in worktree and HEAD mode.
"""
from __future__ import annotations

import json
import os
import subprocess
import threading
import uuid
from pathlib import Path

import pytest

from kb_assets.config import parse_config
from kb_assets.embedding import FixedCostEmbedder
from kb_assets.pipeline import chunk_source
from kb_assets.pipeline import documents as D
from kb_assets.store.db import connect, migrate

PARA = ("The ingestion service keeps a queue of work in PostgreSQL and takes batches with skip locked so that "
        "two workers never embed the same chunk twice; the retry delay grows after each failure. ")


# --- the former per-row writes (reference) ----------------------------------------------------------

def reference_write_batch(conn, source_key: str, commit: str | None, batch) -> None:
    """What sync_documents did before the batched statement: the deletions, then one INSERT ... ON CONFLICT
    per row (and, for a skip, a DELETE of its chunks), in one transaction."""
    if not batch.rows and not batch.gone:
        return
    with conn.transaction():
        if batch.gone:
            conn.execute("DELETE FROM documents WHERE source_key = %s AND path = ANY(%s)", (source_key, batch.gone))
        for path, kind, title, status, skip_reason, skip_detail, sig, content_hash, meta, text, *_blocks in batch.rows:
            if status == "skipped":
                conn.execute(
                    """INSERT INTO documents (source_key, path, kind, title, status, skip_reason, skip_detail,
                                              file_sig, content_hash, chunked_hash, text, indexed_commit)
                       VALUES (%s, %s, '', '', 'skipped', %s, %s, %s, NULL, NULL, NULL, %s)
                       ON CONFLICT (source_key, path) DO UPDATE SET
                         status = 'skipped', skip_reason = EXCLUDED.skip_reason,
                         skip_detail = EXCLUDED.skip_detail, file_sig = EXCLUDED.file_sig, content_hash = NULL,
                         chunked_hash = NULL, text = NULL, indexed_commit = EXCLUDED.indexed_commit,
                         updated_at = now()""",
                    (source_key, path, skip_reason, skip_detail, sig, commit))
                conn.execute("DELETE FROM chunks WHERE document_id = (SELECT id FROM documents"
                             " WHERE source_key = %s AND path = %s)", (source_key, path))
                continue
            conn.execute(
                """INSERT INTO documents (source_key, path, kind, title, status, file_sig, content_hash, meta,
                                          text, indexed_commit)
                   VALUES (%s, %s, %s, %s, 'active', %s, %s, %s, %s, %s)
                   ON CONFLICT (source_key, path) DO UPDATE SET
                     kind = EXCLUDED.kind, title = EXCLUDED.title, status = 'active', skip_reason = NULL,
                     skip_detail = NULL, file_sig = EXCLUDED.file_sig, content_hash = EXCLUDED.content_hash,
                     meta = EXCLUDED.meta, text = EXCLUDED.text, indexed_commit = EXCLUDED.indexed_commit,
                     updated_at = CASE WHEN documents.content_hash IS DISTINCT FROM EXCLUDED.content_hash
                                       THEN now() ELSE documents.updated_at END""",
                (source_key, path, kind, title, sig, content_hash, meta, text, commit))


# --- fixtures ----------------------------------------------------------------------------------------

@pytest.fixture
def two_dbs(pg_server_url):
    """Two fresh migrated databases (batched writer, reference writer)."""
    import psycopg
    import psycopg.conninfo as ci

    names = ["t_" + uuid.uuid4().hex[:12] for _ in range(2)]
    urls = []
    with psycopg.connect(pg_server_url, autocommit=True) as admin:
        for name in names:
            admin.execute(f'CREATE DATABASE "{name}"')
            params = ci.conninfo_to_dict(pg_server_url)
            params["dbname"] = name
            urls.append(ci.make_conninfo(**params))
    conns = [connect(u) for u in urls]
    for c in conns:
        migrate(c)
    yield urls, conns
    for c in conns:
        c.close()
    with psycopg.connect(pg_server_url, autocommit=True) as admin:
        for name in names:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _write(root: Path, rel: str, data: str | bytes) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), "-c", "user.email=t@e", "-c", "user.name=t", *args], check=True,
                   capture_output=True)


def _items(*ids: str) -> str:
    return "\n".join(json.dumps({"id": i, "title": f"Item {i}", "body": PARA * 2, "state": "open"})
                     for i in ids) + "\n"


def _cfgs(root: Path, url: str, content: str):
    data = {"database_url": url, "sources": [
        {"key": "tree", "kind": "code", "root": str(root), "auto_kind": True, "content": content,
         "include": ["docs/**", "src/**"]},
        {"key": "items", "kind": "work_item", "root": str(root), "content": content, "include": ["tracker/*.jsonl"]},
    ]}
    return parse_config(data, path=str(root / "kb.yaml"), base_dir=str(root))


def _state(conn) -> dict:
    rows = conn.execute(
        "SELECT source_key, path, kind, title, status, skip_reason, skip_detail, file_sig, content_hash,"
        " chunked_hash, meta::text, text, indexed_commit, updated_at,"
        " (SELECT count(*) FROM chunks c WHERE c.document_id = d.id) FROM documents d ORDER BY 1, 2").fetchall()
    return {(r[0], r[1]): r for r in rows}


def _compare(states: list[dict], before: list[dict] | None) -> None:
    new, ref = states
    assert new.keys() == ref.keys()
    for key in new:
        assert new[key][:13] == ref[key][:13], key
        assert new[key][14] == ref[key][14], (key, "chunks")
        if before is not None:
            moved = [key not in b or s[key][13] != b[key][13] for s, b in zip(states, before)]
            assert moved[0] == moved[1], (key, "updated_at moved", moved)


def _run_both(cfg_pair, conns, monkeypatch) -> list:
    stats = []
    for i, (cfg, conn) in enumerate(zip(cfg_pair, conns)):
        with monkeypatch.context() as m:
            if i == 1:
                m.setattr(D, "write_batch", reference_write_batch)
            stats.append([D.sync_documents(conn, cfg, s).as_metadata() for s in cfg.sources])
    for a, b in zip(*stats):
        a.pop("seconds"), b.pop("seconds")
        assert a == b
    return stats[0]


@pytest.mark.parametrize("content", ["worktree", "HEAD"])
def test_batched_writes_equal_the_former_row_by_row_writes(tmp_path, two_dbs, monkeypatch, content):
    monkeypatch.setattr(D, "WRITE_BATCH", 3)          # several batches, deletions and upserts in each
    root = tmp_path / "repo"
    for i in range(5):
        _write(root, f"docs/note-{i}.md", f"# Note {i}\n\n" + "\n\n".join(f"## Part {j}\n\n{PARA}" for j in range(3)))
    _write(root, "docs/tiny.md", "# tiny\n")
    _write(root, "docs/blob.md", b"PK\x03\x04\x00\x00binary\x00data" * 20)
    _write(root, "docs/becomes-small.md", "# Will shrink\n\n" + PARA * 3)
    _write(root, "src/app.py", "def handler(event):\n    '''Handle one event.'''\n    return event\n" * 8)
    _write(root, "src/gen.py", "# Code generated by protoc. DO NOT EDIT.\n" + "x = 1\n" * 60)
    _write(root, "tracker/items.jsonl", _items("T-1", "T-2", "T-3"))
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-qm", "one")
    urls, conns = two_dbs
    cfg_pair = [_cfgs(root, u, content) for u in urls]

    first = _run_both(cfg_pair, conns, monkeypatch)
    assert first[0]["new"] == 7 and first[0]["skipped"] == 3 and first[1]["new"] == 3
    emb = FixedCostEmbedder(cost_per_text=0.0)
    for conn in conns:     # chunks exist, so that a document turning into a skip must lose them
        for key in ("tree", "items"):
            chunk_source(conn, key, max_tokens=emb.max_tokens, count_tokens=emb.count_tokens)
    before = [_state(c) for c in conns]
    _compare(before, None)
    assert before[0][("tree", "docs/becomes-small.md")][14] > 0

    # every kind of change at once
    _write(root, "docs/note-0.md", "# Note 0\n\nRewritten. " + PARA * 2)              # changed
    _write(root, "docs/becomes-small.md", "# Shrunk\n")                               # active -> skipped
    _write(root, "docs/blob.md", "# Was binary\n\n" + PARA * 2)                       # skipped -> active
    _write(root, "docs/note-1.md", (root / "docs/note-1.md").read_text() + "\n")     # new sig, changed
    os.utime(root / "docs/note-2.md", ns=(1_000_000_000, 1_000_000_000))              # new sig, same content
    (root / "docs/note-3.md").unlink()                                                # deleted
    _write(root, "docs/new.md", "# New\n\n" + PARA * 2)                               # new
    _write(root, "tracker/items.jsonl", _items("T-1", "T-3", "T-4"))                  # T-2 gone, T-4 new
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "two")
    second = _run_both(cfg_pair, conns, monkeypatch)
    after = [_state(c) for c in conns]
    _compare(after, before)
    assert second[0]["changed"] >= 2 and second[0]["deleted"] == 1 and second[1]["deleted"] == 1
    shrunk = after[0][("tree", "docs/becomes-small.md")]
    assert shrunk[4] == "skipped" and shrunk[14] == 0 and shrunk[2] == "doc"     # kind kept, chunks gone
    assert after[0][("tree", "docs/blob.md")][4] == "active"

    # unchanged re-run: nothing written, nothing moved
    third = _run_both(cfg_pair, conns, monkeypatch)
    assert third[0]["new"] == third[0]["changed"] == 0
    _compare([_state(c) for c in conns], after)


def test_a_path_twice_in_a_batch_is_written_in_two_statements(conn):
    conn.execute("INSERT INTO sources (key, kind, root) VALUES ('s', 'doc', '/x')")
    writer = D._BatchWriter(conn, "s", "c1")
    batch = D._Batch()
    batch = writer.add(batch, ("a.md", "doc", "A", "active", None, None, "1", "h1", "{}", "one", None, None))
    batch = writer.add(batch, ("b.md", "doc", "B", "active", None, None, "1", "h2", "{}", "two", None, None))
    batch = writer.add(batch, ("a.md", "doc", "A2", "active", None, None, "2", "h3", "{}", "three", None, None))
    assert [r[0] for r in batch.rows] == ["a.md"]        # the second a.md started a new batch
    writer.submit(batch)
    writer.close()
    rows = conn.execute("SELECT path, title, text FROM documents ORDER BY path").fetchall()
    assert rows == [("a.md", "A2", "three"), ("b.md", "B", "two")]


def test_batches_are_bounded_by_text_size_too(tmp_path, db_url, conn, monkeypatch):
    cfg = _small_tree(tmp_path, db_url)
    monkeypatch.setattr(D, "WRITE_BATCH_CHARS", 1000)     # each text: ~480 characters
    sizes = []
    real = D.write_batch
    monkeypatch.setattr(D, "write_batch", lambda c, k, m, b: (sizes.append(len(b.rows)), real(c, k, m, b)))
    stats = D.sync_documents(conn, cfg, cfg.sources[0])
    assert stats.new == 7 and sum(sizes) == 7 and len(sizes) >= 3     # not one batch of 7 (WRITE_BATCH 200)
    assert conn.execute("SELECT count(*) FROM documents WHERE status = 'active'").fetchone()[0] == 7


def _small_tree(tmp_path: Path, url: str, n: int = 7):
    root = tmp_path / "t"
    for i in range(n):
        _write(root, f"docs/d{i}.md", f"# D{i}\n\n" + PARA * 2)
    data = {"database_url": url, "sources": [{"key": "docs", "kind": "doc", "root": str(root)}]}
    return parse_config(data, path=str(root / "kb.yaml"), base_dir=str(root))


def _writer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("kb-documents-writer")]


def test_a_failed_batch_stops_the_run_and_keeps_the_batches_before_it(tmp_path, db_url, conn, monkeypatch):
    cfg = _small_tree(tmp_path, db_url)
    monkeypatch.setattr(D, "WRITE_BATCH", 2)
    real = D.write_batch
    calls = []

    def flaky(*args):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("disk full")
        real(*args)

    monkeypatch.setattr(D, "write_batch", flaky)
    with pytest.raises(RuntimeError, match="disk full"):
        D.sync_documents(conn, cfg, cfg.sources[0])
    assert not _writer_threads()
    assert conn.execute("SELECT count(*) FROM documents").fetchone()[0] == 2     # the first batch only
    assert conn.execute("SELECT indexed_commit, listed_at FROM sources").fetchone() == (None, None)
    monkeypatch.setattr(D, "write_batch", real)
    rerun = D.sync_documents(conn, cfg, cfg.sources[0])
    assert rerun.new == 5 and rerun.unchanged == 2


def test_an_interrupt_while_reading_writes_the_batches_handed_over_and_stops(tmp_path, db_url, conn, monkeypatch):
    cfg = _small_tree(tmp_path, db_url)
    monkeypatch.setattr(D, "WRITE_BATCH", 2)
    from kb_assets.sources import readers

    real = readers.read_entry
    seen = []

    def interrupted(*args, **kw):
        seen.append(1)
        if len(seen) == 6:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(readers, "read_entry", interrupted)
    with pytest.raises(KeyboardInterrupt):
        D.sync_documents(conn, cfg, cfg.sources[0])
    assert not _writer_threads()
    # two full batches were handed over before the sixth file: both committed, the fifth file's row lost
    assert conn.execute("SELECT count(*) FROM documents").fetchone()[0] == 4


def test_a_reader_bug_is_recorded_and_the_run_goes_on(tmp_path, db_url, conn, monkeypatch):
    cfg = _small_tree(tmp_path, db_url)
    from kb_assets.sources import readers

    real = readers.read_entry

    def buggy(root, entry, source, **kw):
        if entry.path == "docs/d3.md":
            raise ValueError("reader bug")
        return real(root, entry, source, **kw)

    monkeypatch.setattr(readers, "read_entry", buggy)
    stats = D.sync_documents(conn, cfg, cfg.sources[0])
    assert stats.read_errors == 1 and stats.new == 6 and stats.skip_reasons == {"read-error": 1}
    assert conn.execute("SELECT skip_detail FROM documents WHERE path = 'docs/d3.md'").fetchone()[0] \
        == "ValueError: reader bug"
