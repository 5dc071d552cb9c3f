"""Racy files, done as git does (kb_assets/pipeline/source_state.py): a file read within its mtime's tick is
stored with a smudged signature, read again by the next run, and settled by the fast path only once its tick
is over and its content is what was indexed. Real folders, the embedded PostgreSQL, whole `kb index`
processes for the end-to-end case."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from kb_assets_tests.test_index_fast_path import _doc, _kb_index, _ran


def _setup(tmp_path: Path, db_url: str):
    from kb_assets.config import load_config

    notes = tmp_path / "notes"
    notes.mkdir()
    cfg = tmp_path / "kb.yaml"
    cfg.write_text(json.dumps({"data_dir": str(tmp_path / "data"), "database_url": db_url,
                               "sources": [{"key": "notes", "kind": "doc", "root": str(notes),
                                            "include": ["*.md"]}]}))
    return notes, cfg, load_config(str(cfg))


def _rewrite_same_tick(path: Path, text: str) -> None:
    """A second write within the first one's timestamp tick: same size, same mtime_ns."""
    st = path.stat()
    assert len(text.encode()) == st.st_size
    path.write_text(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns


def _rows(conn) -> dict[str, tuple[str, str]]:
    return {p: (sig, text) for p, sig, text in
            conn.execute("SELECT path, file_sig, text FROM documents WHERE source_key = 'notes'")}


def test_a_same_tick_rewrite_is_read_again_and_settled_only_when_true(tmp_path, db_url, monkeypatch):
    from kb_assets.pipeline import source_state
    from kb_assets.pipeline.documents import sync_documents
    from kb_assets.store.db import connect, open_database

    notes, _, loaded = _setup(tmp_path, db_url)
    source = loaded.source("notes")
    a_old, a_new = _doc("Note a", "streams keep seven days"), _doc("Note a", "streams keep eleven day")
    (notes / "a.md").write_text(a_old)
    (notes / "b.md").write_text(_doc("Note b", "replicas are three"))
    monkeypatch.setattr(source_state, "RACY_SECONDS", 30.0)
    with connect(open_database(loaded)) as conn:
        assert sync_documents(conn, loaded, source).new == 2
        rows = _rows(conn)
        assert all(sig.startswith(source_state.RACY_PREFIX) for sig, _ in rows.values()), rows
        # rewritten after the read, within the same tick: the listing's signature is the stored one's
        _rewrite_same_tick(notes / "a.md", a_new)
        assert source_state.settle_racy(conn, loaded, source) == "a.md was modified within 30 s"
        stats = sync_documents(conn, loaded, source)      # the smudged rows are read again
        assert (stats.changed, stats.unchanged) == (1, 1)
        assert "eleven" in _rows(conn)["a.md"][1]

        # the tick is over: a file whose content is what was indexed settles to its plain signature...
        monkeypatch.setattr(source_state, "RACY_SECONDS", 0.05)
        time.sleep(0.1)
        _rewrite_same_tick(notes / "a.md", a_old)         # ...one rewritten after the read does not
        assert source_state.settle_racy(conn, loaded, source) == "a.md differs from what was indexed"
        assert all(sig.startswith(source_state.RACY_PREFIX) for sig, _ in _rows(conn).values())
        _rewrite_same_tick(notes / "a.md", a_new)          # back to what the index holds
        assert source_state.settle_racy(conn, loaded, source) is None
        plain = {p: f"{(notes / p).stat().st_size}:{(notes / p).stat().st_mtime_ns}" for p in ("a.md", "b.md")}
        assert {p: sig for p, (sig, _) in _rows(conn).items()} == plain
        # a file changed since it was read (new mtime) is never settled
        sync_documents(conn, loaded, source)
        monkeypatch.setattr(source_state, "RACY_SECONDS", 30.0)
        (notes / "b.md").write_text(_doc("Note b", "replicas are three, now five"))
        assert sync_documents(conn, loaded, source).changed == 1
        monkeypatch.setattr(source_state, "RACY_SECONDS", 0.05)
        time.sleep(0.1)
        os.utime(notes / "b.md")
        assert source_state.settle_racy(conn, loaded, source) == "b.md changed since it was read"


def test_the_documents_stage_uses_the_listing_of_the_fingerprint(tmp_path, db_url, monkeypatch):
    from kb_assets.pipeline import source_state
    from kb_assets.pipeline.documents import sync_documents
    from kb_assets.sources import discovery
    from kb_assets.store.db import connect, open_database

    notes, _, loaded = _setup(tmp_path, db_url)
    source = loaded.source("notes")
    (notes / "a.md").write_text(_doc("Note a", "streams keep seven days"))
    state = source_state.source_fingerprint(loaded, source)
    listed = []
    real = discovery.list_source
    monkeypatch.setattr(discovery, "list_source", lambda *a, **k: listed.append(a) or real(*a, **k))
    with connect(open_database(loaded)) as conn:
        source_state.offer_listing(state)
        assert sync_documents(conn, loaded, source).new == 1 and listed == []   # listed once, by the fingerprint
        (notes / "b.md").write_text(_doc("Note b", "replicas are three"))
        assert sync_documents(conn, loaded, source).new == 1 and len(listed) == 1   # taken once only
        other = loaded.model_copy(update={"sources": [source.model_copy(update={"include": ["a.md"]})]})
        source_state.offer_listing(source_state.source_fingerprint(loaded, source))
        assert source_state.take_listing(other, other.source("notes")) is None   # other settings: not this one
        source_state.offer_listing(None)


def test_nothing_changed_right_after_a_run_on_a_freshly_written_corpus_is_skipped(tmp_path, db_url):
    """The harness's case: files written, `kb index` at once (the fingerprint is taken within their tick),
    then `kb index` again: skipped, no Dagster. Then a same-tick rewrite of a file read within its tick
    (an mtime ahead of the clock keeps it in the window) is found by the next run."""
    notes, cfg, _ = _setup(tmp_path, db_url)
    for n in range(5):
        (notes / f"n{n}.md").write_text(_doc(f"Note {n}", f"note {n} keeps streams for {n} days"))
    first, dagster, _ = _kb_index(cfg)
    assert _ran(first) == {"notes": True} and dagster
    out, dagster, err = _kb_index(cfg)
    assert _ran(out) == {"notes": False} and not dagster, err[-2000:]

    ahead = time.time() + 600          # read "within its tick" for the next ten minutes
    old, new = _doc("Note x", "streams keep seven days"), _doc("Note x", "streams keep eleven day")
    (notes / "x.md").write_text(old)
    os.utime(notes / "x.md", (ahead, ahead))
    out, _, _ = _kb_index(cfg)
    assert _ran(out) == {"notes": True}
    _rewrite_same_tick(notes / "x.md", new)
    out, _, _ = _kb_index(cfg)
    assert _ran(out) == {"notes": True}
    assert out["sources"][0]["this_run"]["documents"]["changed"] == 1
