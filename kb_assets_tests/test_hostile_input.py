"""Hostile input (issue 12 §1): one bad file or transcript line never fails its source — it is indexed under
an escaped name or skipped with a reason `kb status` shows, and the rest of the source is indexed."""
from __future__ import annotations

import json
import os
from pathlib import Path

import psycopg
import pytest

from kb_assets.config import parse_config
from kb_assets.embedding import FixedCostEmbedder
from kb_assets.models import SourceDocument
from kb_assets.pipeline import chunk_source, index_sources, sync_documents
from kb_assets.pipeline import chunks as chunks_mod
from kb_assets.pipeline import documents as documents_mod
from kb_assets.signposts.extractive import ExtractiveSignposter
from kb_assets.sources.safe_names import assign_names, clean_text, escape_surrogates, printable

PROSE = ("The ingestion service keeps its work queue in PostgreSQL and takes batches with skip locked, so two "
         "workers never embed the same chunk twice; the retry delay grows after each failure.\n")


def _cfg(db_url: str, root: Path, **source) -> object:
    src = {"key": "notes", "kind": "doc", "root": str(root), "include": ["**/*.md"], **source}
    return parse_config({"database_url": db_url, "sources": [src]}, path="kb.yaml", base_dir=str(root))


def _emb():
    return FixedCostEmbedder(0.0, dimension=8)


def _docs(conn, key="notes") -> dict[str, tuple]:
    return {r[0]: r[1:] for r in conn.execute(
        "SELECT path, status, skip_reason, skip_detail, text FROM documents WHERE source_key = %s", (key,))}


def test_non_utf8_file_name_is_indexed_under_an_escaped_name(tmp_path, db_url, conn):
    root = tmp_path / "repo"
    root.mkdir()
    (root / "good.md").write_text("# Good\n\n" + PROSE * 2)
    bad = os.path.join(os.fsencode(root), b"caf\xe9.md")
    with open(bad, "wb") as fh:
        fh.write(("# Cafe notes\n\n" + PROSE * 2).encode())
    cfg = _cfg(db_url, root)
    runs = index_sources(cfg, conn, embedder=_emb(), signposter=ExtractiveSignposter())
    docs = _docs(conn)
    assert set(docs) == {"good.md", "caf\\xe9.md"}, docs
    assert docs["caf\\xe9.md"][0] == "active" and "skip locked" in docs["caf\\xe9.md"][3]
    assert runs["notes"].documents.new == 2 and runs["notes"].embeddings.missing_after == 0
    signposted = conn.execute("SELECT count(*) FROM signpost_state").fetchone()[0]
    assert signposted == 2
    # a second run finds it unchanged (the escaped name maps back to the same listed file)
    again = sync_documents(conn, cfg, cfg.sources[0])
    assert again.unchanged == 2 and again.new == again.changed == again.deleted == 0
    # its freshness is judged on the real file (not "gone" because the stored name differs)
    from kb_assets.query.freshness import Freshness

    sig = conn.execute("SELECT file_sig FROM documents WHERE path = %s", ("caf\\xe9.md",)).fetchone()[0]
    assert Freshness().is_stale(root=str(root), source_commit=None, path="caf\\xe9.md", file_sig=sig) is False
    with open(bad, "ab") as fh:
        fh.write(b"One more line.\n")
    assert Freshness().is_stale(root=str(root), source_commit=None, path="caf\\xe9.md", file_sig=sig) is True
    # and once it is gone, it is pruned under its escaped name
    os.unlink(bad)
    gone = sync_documents(conn, cfg, cfg.sources[0])
    assert gone.deleted == 1 and set(_docs(conn)) == {"good.md"}


def test_non_utf8_name_in_git_head_mode(tmp_path, db_url, conn):
    import subprocess

    root = tmp_path / "repo"
    root.mkdir()
    (root / "good.md").write_text("# Good\n\n" + PROSE * 2)
    with open(os.path.join(os.fsencode(root), b"na\xefve.md"), "wb") as fh:
        fh.write(("# Naive\n\n" + PROSE * 2).encode())
    git = ["git", "-c", "user.email=t@e", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "."], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "one"], cwd=root, check=True)
    cfg = _cfg(db_url, root, content="HEAD")
    stats = sync_documents(conn, cfg, cfg.sources[0])
    assert stats.new == 2 and set(_docs(conn)) == {"good.md", "na\\xefve.md"}
    # a commit that deletes it: the git-diff listing prunes it under its stored name
    subprocess.run([*git, "rm", "-q", "--", os.fsdecode(b"na\xefve.md")], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "two"], cwd=root, check=True)
    stats = sync_documents(conn, cfg, cfg.sources[0])
    assert stats.listing_mode == "git-diff" and stats.deleted == 1 and set(_docs(conn)) == {"good.md"}


def test_colliding_redacted_names_stay_apart_across_git_diff_runs(tmp_path, db_url, conn):
    """Two files whose names hold different tokens both redact to one name: they are kept apart (~2), and a
    commit that changes only one of them updates that one (the diff alone cannot number them: full listing)."""
    import subprocess

    root = tmp_path / "repo"
    root.mkdir()
    tok_a = "gh" + "p_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    tok_b = "gh" + "p_" + "Z9y8X7w6V5u4T3s2R1q0P9o8N7m6L5k4J3i2"
    (root / f"{tok_a}.md").write_text("# Alpha\n\nalpha content " + PROSE * 2)
    (root / f"{tok_b}.md").write_text("# Beta\n\nbeta content " + PROSE * 2)
    git = ["git", "-c", "user.email=t@e", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "."], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "one"], cwd=root, check=True)
    cfg = _cfg(db_url, root, content="HEAD")
    sync_documents(conn, cfg, cfg.sources[0])
    names = {"[REDACTED:github-token].md": "alpha", "[REDACTED:github-token].md~2": "beta"}
    assert {p: d[3].split("\n\n")[1].split()[0] for p, d in _docs(conn).items()} == names
    (root / f"{tok_b}.md").write_text("# Beta\n\nbeta changed " + PROSE * 2)
    subprocess.run([*git, "commit", "-qam", "two"], cwd=root, check=True)
    stats = sync_documents(conn, cfg, cfg.sources[0])
    assert stats.changed == 1 and stats.listing_mode == "full"
    docs = _docs(conn)
    assert docs["[REDACTED:github-token].md"][3].startswith("# Alpha\n\nalpha content")
    assert docs["[REDACTED:github-token].md~2"][3].startswith("# Beta\n\nbeta changed")
    assert tok_a not in str(docs) and tok_b not in str(docs)


def test_names_the_index_holds_are_not_scanned_again_and_new_ones_are(tmp_path, db_url, conn, monkeypatch):
    """A full listing after a complete run with the same code scans only the names the index does not hold yet
    (a delete or rename: no detect-secrets import): a new file whose name holds a token is still redacted, and
    kept apart from a clean file whose literal name is that redacted name."""
    from kb_assets.pipeline import index_sources, source_state
    from kb_assets.signposts.extractive import ExtractiveSignposter
    from kb_assets.sources import safe_names

    root = tmp_path / "notes"
    root.mkdir()
    for n in range(4):
        (root / f"note-{n}.md").write_text(f"# Note {n}\n\n" + PROSE * 2)
    (root / "[REDACTED:github-token].md").write_text("# Literal\n\nliteral name " + PROSE)
    cfg = _cfg(db_url, root)
    src = cfg.sources[0]
    index_sources(cfg, conn, embedder=_emb(), signposter=ExtractiveSignposter())
    scanned: list[list[str]] = []
    real = safe_names.safe_paths
    monkeypatch.setattr(safe_names, "safe_paths", lambda paths: scanned.append(list(paths)) or real(paths))

    # no complete run recorded: every name is scanned
    (root / "note-0.md").unlink()
    index_sources(cfg, conn, embedder=_emb(), signposter=ExtractiveSignposter())
    assert len(scanned[-1]) == 4
    with conn.transaction():
        assert source_state.record_if_complete(conn, source_state.source_fingerprint(cfg, src)) is None

    # recorded, same code: only the new names; the token in one is redacted, apart from the literal name
    tok = "gh" + "p_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    (root / "note-1.md").rename(root / f"{tok}.md")
    (root / "note-9.md").write_text("# Note 9\n\n" + PROSE)
    index_sources(cfg, conn, embedder=_emb(), signposter=ExtractiveSignposter())
    assert sorted(scanned[-1]) == sorted([f"{tok}.md", "note-9.md"])
    docs = _docs(conn)
    assert docs["[REDACTED:github-token].md"][3].startswith("# Literal")
    assert docs["[REDACTED:github-token].md~2"][3].startswith("# Note 1")
    assert tok not in str(docs) and "note-9.md" in docs
    # the same names as a scan of every path gives
    listed = [p.name for p in root.iterdir()]
    assert safe_names.assign_names(listed) == safe_names.assign_names(listed, clean={"note-2.md", "note-3.md"})

    # a recorded run of other code: every name is scanned again
    with conn.transaction():
        assert source_state.record_if_complete(conn, source_state.source_fingerprint(cfg, src)) is None
        conn.execute("UPDATE source_state SET details = details || '{\"code\": \"older\"}'::jsonb")
    (root / "note-2.md").unlink()
    index_sources(cfg, conn, embedder=_emb(), signposter=ExtractiveSignposter())
    assert sorted(scanned[-1]) == sorted(p.name for p in root.iterdir())


def _transcript_line(role: str, text: str, n: int) -> str:
    return json.dumps({"type": role, "sessionId": "s1", "timestamp": f"2026-01-01T00:00:0{n}Z",
                       "message": {"role": role, "content": text}})


def test_lone_surrogate_in_a_transcript_line_does_not_fail_the_source(tmp_path, db_url, conn):
    root = tmp_path / "sessions"
    root.mkdir()
    lines = [_transcript_line("user", "How do the workers take batches from the queue?", 1),
             # json.dumps writes the lone surrogate as the escape "\ud800", exactly as a broken client does
             _transcript_line("assistant", "They use skip locked \ud800 so that no chunk is embedded twice. "
                              + PROSE, 2)]
    assert "\\ud800" in lines[1]
    (root / "s1.jsonl").write_text("\n".join(lines) + "\n")
    (root / "s2.jsonl").write_text("\n".join([_transcript_line("user", "What grows after each failure?", 1),
                                              _transcript_line("assistant", PROSE * 2, 2)]) + "\n")
    cfg = parse_config({"database_url": db_url, "sources": [
        {"key": "sessions", "kind": "transcript", "root": str(root), "include": ["*.jsonl"]}]},
        path="kb.yaml", base_dir=str(root))
    runs = index_sources(cfg, conn, embedder=_emb(), signposter=ExtractiveSignposter())
    docs = _docs(conn, "sessions")
    assert {p: d[0] for p, d in docs.items()} == {"s1.jsonl": "active", "s2.jsonl": "active"}
    assert "skip locked \ufffd so that" in docs["s1.jsonl"][3]
    assert runs["sessions"].embeddings.missing_after == 0


def test_a_row_the_database_refuses_is_skipped_and_the_batch_is_written(tmp_path, db_url, conn, monkeypatch):
    """A document whose row the server refuses (here: meta that jsonb cannot hold) costs only itself."""
    root = tmp_path / "repo"
    root.mkdir()
    for i in range(5):
        (root / f"note-{i}.md").write_text(f"# Note {i}\n\n" + PROSE * 2)
    real = documents_mod._doc_row

    def bad_meta(doc, content_hash, sig):
        row = real(doc, content_hash, sig)
        if doc.path == "note-2.md":       # a JSON escape PostgreSQL rejects (a bug upstream would do this)
            row = row[:8] + ('{"x": "\\ud800"}',) + row[9:]
        return row

    monkeypatch.setattr(documents_mod, "_doc_row", bad_meta)
    cfg = _cfg(db_url, root)
    sync_documents(conn, cfg, cfg.sources[0])
    docs = _docs(conn)
    assert sorted(p for p, d in docs.items() if d[0] == "active") == [f"note-{i}.md" for i in (0, 1, 3, 4)]
    assert docs["note-2.md"][:2] == ("skipped", "write-error") and "cannot be stored" in docs["note-2.md"][2]


def test_a_document_whose_chunks_cannot_be_stored_is_skipped(tmp_path, db_url, conn, monkeypatch):
    root = tmp_path / "repo"
    root.mkdir()
    for i in range(4):
        (root / f"note-{i}.md").write_text(f"# Note {i}\n\n" + PROSE * 2)
    cfg = _cfg(db_url, root)
    sync_documents(conn, cfg, cfg.sources[0])
    real = chunks_mod._cut_batch

    def poisoned(rows, **kw):
        out = real(rows, **kw)
        # note-1's COPY data carries a byte sequence the server refuses (invalid UTF-8)
        bad_id = conn.execute("SELECT id FROM documents WHERE path = 'note-1.md'").fetchone()[0]
        out.cut = [c if c[0] != bad_id else (c[0], c[1], c[2] + b"\xff\xfe\n", c[3]) for c in out.cut]
        return out

    monkeypatch.setattr(chunks_mod, "_cut_batch", poisoned)
    emb = _emb()
    stats = chunk_source(conn, "notes", max_tokens=emb.max_tokens, count_tokens=emb.count_tokens)
    assert stats.errors == 1 and stats.documents_chunked == 3
    docs = _docs(conn)
    assert docs["note-1.md"][:2] == ("skipped", "chunk-error")
    n = conn.execute("SELECT count(DISTINCT document_id) FROM chunks").fetchone()[0]
    assert n == 3


def test_names_are_escaped_redacted_and_kept_apart():
    tok = "ghp_" + "aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE3fG5"
    raw = ["caf\udce9.md", f"keys/{tok}.md", f"keys/other-{tok}.md", "plain.md", "odd\ud800.md"]
    names = assign_names(raw)
    assert names["caf\udce9.md"] == "caf\\xe9.md" and names["odd\ud800.md"] == "odd\\ud800.md"
    assert names[f"keys/{tok}.md"] == "keys/[REDACTED:github-token].md"
    assert names[f"keys/other-{tok}.md"] == "keys/other-[REDACTED:github-token].md"
    assert "plain.md" not in names
    # two files whose stored names coincide are kept apart
    tok2 = "ghp_" + "Zy9Xw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0Fe9Dc8B"
    both = assign_names([f"{tok}.md", f"{tok2}.md"])
    assert sorted(both.values()) == ["[REDACTED:github-token].md", "[REDACTED:github-token].md~2"]
    assert escape_surrogates("x") == "x" and clean_text("a\ud800b\x00") == "a\ufffdb"
    assert printable("a\nb\tc\x1b") == "a\\nb\\tc\\x1b"


def test_reader_and_plan_skip_a_file_whose_read_fails(tmp_path, conn, monkeypatch):
    """read() failing (kb plan died on OSError: [Errno 22] from a /sys file) is a skip, not a crash. The
    failing read is a real one: /proc/self/mem read at offset 0 answers EIO; the listed file's open is
    pointed at it (/proc itself is never read: see test_roots.py)."""
    from kb_assets.plan import plan
    from kb_assets.sources import readers

    root = tmp_path / "repo"
    root.mkdir()
    for name in ("a.md", "b.md", "c.md"):
        (root / name).write_text(f"# {name}\n\n" + PROSE * 2)
    real_open = readers._open_worktree

    def open_b_as_mem(r, path):
        return open("/proc/self/mem", "rb") if path == "b.md" else real_open(r, path)

    monkeypatch.setattr(readers, "_open_worktree", open_b_as_mem)
    cfg = _cfg("postgresql://unused", root)
    src = cfg.sources[0]
    from kb_assets.sources.discovery import list_source

    out = {e.path: readers.read_entry(root, e, src) for e in list_source(root, src).files}
    assert out["b.md"].reason == "unreadable" and "cannot read" in out["b.md"].detail
    assert isinstance(out["a.md"], list) and isinstance(out["c.md"], list)
    report = plan(cfg, conn=conn)
    row = report["sources"][0]
    assert row["files"] == 3 and row["skipped"] == 1 and row["documents"] == 2


def test_proc_files_are_never_read_even_through_the_reader():
    from kb_assets.config import SourceConfig
    from kb_assets.sources.discovery import FileEntry
    from kb_assets.sources.readers import read_entry

    src = SourceConfig(key="p", kind="doc", root="/proc/self")
    out = read_entry(Path("/proc/self"), FileEntry("environ", "0:0"), src)
    assert out.reason == "system-file"


def test_kb_index_end_to_end_with_hostile_files():
    """As the issue ran it: `kb index` over a folder with a non-UTF-8 name, a \\ud800 transcript line, a token in
    a name and a binary file — exit 0, every readable file indexed, the skip shown by `kb status`."""
    import subprocess
    import sys
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="kbhi-", dir="/tmp"))     # short: the embedded server's socket
    notes, sessions = base / "notes", base / "sessions"
    notes.mkdir()
    sessions.mkdir()
    (notes / "good.md").write_text("# Good\n\n" + PROSE * 2)
    with open(os.path.join(os.fsencode(notes), b"caf\xe9.md"), "wb") as fh:
        fh.write(("# Cafe\n\n" + PROSE * 2).encode())
    tok = "gh" + "p_" + "Q1w2E3r4T5y6U7i8O9p0A1s2D3f4G5h6J7k8"
    (notes / f"rotate-{tok}.md").write_text("# Rotation\n\n" + PROSE * 2)
    (notes / "blob.md").write_bytes(b"\x00\x01\x02binary" * 50)
    (sessions / "s1.jsonl").write_text("\n".join([
        _transcript_line("user", "How do the workers take batches?", 1),
        _transcript_line("assistant", "With skip locked \ud800 — " + PROSE, 2)]) + "\n")
    (base / "kb.yaml").write_text(
        f"data_dir: {base}/.kb\nsources:\n  - {{key: notes, kind: doc, root: {notes}}}\n"
        f"  - {{key: sessions, kind: transcript, root: {sessions}, include: ['*.jsonl'], min_chars: 20}}\n")
    (base / "dagster").mkdir()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", DAGSTER_HOME=str(base / "dagster"))
    env.pop("KB_CONFIG", None)
    env.pop("KB_DATABASE_URL", None)

    def kb(*args):
        return subprocess.run([sys.executable, "-m", "kb_assets.cli", *args, "--config", str(base / "kb.yaml")],
                              cwd=base, env=env, capture_output=True, text=True, timeout=900)

    proc = kb("index", "--json", "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["failures"] == []
    by = {s["source"]: s for s in summary["sources"]}
    assert by["notes"]["documents"] == 3 and by["sessions"]["documents"] == 1, by
    status = json.loads(kb("status", "--json").stdout)
    notes_row = [s for s in status["sources"] if s["source"] == "notes"][0]
    assert notes_row["skip_reasons"] == {"binary": 1}, notes_row["skip_reasons"]
    assert tok not in proc.stdout + json.dumps(status)
