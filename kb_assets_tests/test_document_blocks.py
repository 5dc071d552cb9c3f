"""documents.blocks (migration 008): the documents stage's one block scan of a markdown document, read by the
chunker and the extractive signposter instead of scanning the stored text again. Reading it gives exactly
what scanning gives (front matter, CRLF, lone CRs, fences, HTML blocks, setext headings), the readers really
do not scan (the scanner broken, they still cut the same chunks), the stage writes it with the document
from the scan its readers made (one scan per document), and
a row written before the migration is refilled by the next documents run from its stored text, nothing
re-chunked."""
from __future__ import annotations

import json

import pytest

import kb_assets.chunking.markdown as md
from kb_assets.chunking import chunk_document, document_blocks
from kb_assets.config import parse_config
from kb_assets.models import SourceDocument
from kb_assets.pipeline import chunk_source
from kb_assets.pipeline.documents import sync_documents
from kb_assets.signposts.extractive import parse_document
from kb_assets.store.db import migrate

PARA = ("The ingestion service keeps a queue of work in PostgreSQL and takes batches with skip locked so that "
        "two workers never embed the same chunk twice; the retry delay grows after each failure. ")

TEXTS = {
    "plain.md": "# Title\n\nIntro " + PARA + "\n\n## Part A\n\n" + PARA * 3 + "\n\n### Deep\n\n" + PARA,
    "front.md": "---\ntitle: x\nstatus: done\n---\n# After front matter\n\n" + PARA + "\n\n## Two\n\n" + PARA,
    "crlf.md": "# Windows\r\n\r\n" + PARA + "\r\n\r\nSetext title\r\n============\r\n\r\n" + PARA + "\r\n",
    "lonecr.md": "# Old Mac\r\rtext " + PARA + "\r\n\n## Next\n\nmore\rlone cr " + PARA + "\n",
    "fence.md": ("# Code\n\n```python\n# not a heading\nx = 1\n```\n\n    # indented code\n\n<div>\n# html\n</div>\n"
                 "\n<!-- BEGIN marker -->\n\n## Real\n\n" + PARA + "\n\nSub\n---\n\n- item\n---\n" + PARA),
}


def _docs() -> list[SourceDocument]:
    return [SourceDocument(path=p, kind="agents_md" if p == "fence.md" else "doc", title="", text=t, meta={})
            for p, t in TEXTS.items()]


def _stored(doc: SourceDocument) -> dict:
    return json.loads(json.dumps(document_blocks(doc)))      # as it comes back from the jsonb column


def _chunks(doc, blocks=None):
    return [(c.ordinal, c.heading, c.start_line, c.end_line, c.text)
            for c in chunk_document(doc, max_tokens=64, blocks=blocks)]


def test_stored_blocks_give_what_a_scan_gives():
    for doc in _docs():
        stored = _stored(doc)
        assert stored["md"], doc.path
        assert _chunks(doc, stored) == _chunks(doc), doc.path
        assert parse_document(doc.text, markdown=True, blocks=stored) == parse_document(doc.text, markdown=True)
    assert _stored(_docs()[1])["fm"] == 4 and _stored(_docs()[3])["cr"] is True
    # a non-markdown document stores nothing
    assert document_blocks(SourceDocument(path="a.py", kind="code", title="", text="def f():\n  pass\n")) is None


def test_readers_of_stored_blocks_do_not_scan(monkeypatch):
    docs = _docs()
    stored = {d.path: _stored(d) for d in docs}
    want = {d.path: _chunks(d) for d in docs}
    heads = {d.path: parse_document(d.text, markdown=True).sections for d in docs}

    def broken(text):
        raise AssertionError("scanned again")

    monkeypatch.setattr(md, "block_structure", broken)
    for d in docs:
        assert _chunks(d, stored[d.path]) == want[d.path], d.path
    # the signposter uses the stored scan where it is its own scan exactly (nothing blanked in the chunker's view)
    for p in ("plain.md", "crlf.md", "fence.md"):
        d = next(x for x in docs if x.path == p)
        assert parse_document(d.text, markdown=True, blocks=stored[p]).sections == heads[p]
    # a row without blocks (written before migration 008) is scanned: here the broken scanner shows it was
    assert _chunks(docs[0]) != want["plain.md"]
    # an older version of the stored form is not trusted
    assert md.blocks_from_stored(dict(stored["plain.md"], v=0)) is None


def _cfg(db_url, root):
    src = {"key": "notes", "kind": "doc", "root": str(root), "include": ["**/*.md", "**/*.txt"]}
    return parse_config({"database_url": db_url, "sources": [src]}, path="kb.yaml", base_dir=str(root))


def test_documents_stage_stores_blocks_and_refills_older_rows(tmp_path, db_url, conn, monkeypatch):
    root = tmp_path / "notes"
    root.mkdir()
    for name, text in TEXTS.items():
        (root / name).write_bytes(text.encode())
    (root / "notes.txt").write_text("plain text, no markdown. " + PARA)
    (root / "bad-yaml.md").write_text("---\ntitle: [not closed\n---\n# Heading\n\n" + PARA)
    cfg = _cfg(db_url, root)
    migrate(conn)
    scans = []
    real_scan = md._block_scan

    def counted(text):
        scans.append(text)
        return real_scan(text)

    monkeypatch.setattr(md, "_block_scan", counted)
    sync_documents(conn, cfg, cfg.sources[0])
    monkeypatch.setattr(md, "_block_scan", real_scan)
    # one scan per document in the whole stage: the readers' (title, sections) serves documents.blocks too, also
    # for front matter left in the text (bad YAML): the readers scan the chunker's view (markdown.view_blocks)
    assert len(scans) == len(set(scans)) == len(TEXTS) + 2, [s[:20] for s in scans]   # + notes.txt, bad-yaml.md
    rows = {p: (b, v, t) for p, b, v, t in conn.execute(
        "SELECT path, blocks, blocks_version, text FROM documents WHERE status = 'active'")}
    assert set(rows) >= set(TEXTS)
    for name in TEXTS:
        blocks, version, text = rows[name]
        assert version == md.BLOCKS_VERSION and blocks == md.stored_blocks(text), name
    assert rows["notes.txt"][0] is None and rows["notes.txt"][1] == md.BLOCKS_VERSION

    chunk_source(conn, cfg.sources[0].key, max_tokens=64, count_tokens=None)
    before = conn.execute("SELECT d.path, c.ordinal, c.heading, c.start_line, c.end_line, c.text FROM chunks c"
                          " JOIN documents d ON d.id = c.document_id ORDER BY 1, 2").fetchall()
    assert before
    # rows as written before migration 008: the next run refills them from the stored text, re-chunking nothing
    conn.execute("UPDATE documents SET blocks = NULL, blocks_version = NULL")
    hashes = dict(conn.execute("SELECT path, chunked_hash FROM documents").fetchall())
    sync_documents(conn, cfg, cfg.sources[0])
    assert dict(conn.execute("SELECT path, chunked_hash FROM documents").fetchall()) == hashes
    for name, blocks, version, text in conn.execute(
            "SELECT path, blocks, blocks_version, text FROM documents WHERE path = ANY(%s)", (list(TEXTS),)):
        assert version == md.BLOCKS_VERSION and blocks == md.stored_blocks(text), name

    # the chunks stage reads the stored scan: with the scanner broken it cuts the same chunks
    conn.execute("UPDATE documents SET chunked_hash = NULL")
    monkeypatch.setattr(md, "block_structure", lambda text: (_ for _ in ()).throw(AssertionError("scanned")))
    chunk_source(conn, cfg.sources[0].key, max_tokens=64, count_tokens=None)
    after = conn.execute("SELECT d.path, c.ordinal, c.heading, c.start_line, c.end_line, c.text FROM chunks c"
                         " JOIN documents d ON d.id = c.document_id ORDER BY 1, 2").fetchall()
    assert after == before


PEP = ("PEP: 9999\nTitle: A stored parse\nAuthor: A. Person <a@example.org>,\n        B. Person\nStatus: Draft\n"
       "Type: Standards Track\nCreated: 01-Dec-2026\n\n\nAbstract\n========\n\n" + PARA + "\n\nRationale\n"
       "=========\n\nBecause " + PARA + "\n\nDetails\n-------\nsub\n^^^\n\n" + PARA + "\n\n# not a title\n")
RST = "Notes\n=====\n\nIntro " + PARA + "\n\nPart\n----\n\n" + PARA + "\n"


def _rst_docs() -> list[SourceDocument]:
    return [SourceDocument(path="pep-9999.rst", kind="adr", title="", text=PEP, meta={}),
            SourceDocument(path="notes.rst", kind="doc", title="", text=RST, meta={})]


def test_stored_rst_structure_gives_what_parsing_gives_and_is_read_not_reparsed(monkeypatch):
    import kb_assets.chunking.rst as rst
    import kb_assets.sources.textutil as textutil

    docs = _rst_docs()
    stored = {d.path: _stored(d) for d in docs}
    assert stored["pep-9999.rst"]["rst"]["hdr"][:2] == [7, "PEP 9999: A stored parse"]
    assert [t[3] for t in stored["pep-9999.rst"]["rst"]["titles"]] == ["Abstract", "Rationale", "Details", "sub"]
    want = {d.path: (_chunks(d), parse_document(d.text)) for d in docs}
    for d in docs:
        assert (_chunks(d, stored[d.path]), parse_document(d.text, blocks=stored[d.path])) == want[d.path]
    assert parse_document(PEP).header["status"] == "Draft"
    # a '#' line is no reST title (docutils: a paragraph): the signposter, told the shape, sees the chunker's titles
    assert [x.title for x in parse_document(PEP, rst=True).sections] == ["Abstract", "Rationale", "Details", "sub"]
    assert "not a title" in [x.title for x in parse_document(PEP).sections]       # shape unknown: ATX lines too

    def broken(*_a, **_k):
        raise AssertionError("parsed again")

    monkeypatch.setattr(rst, "rst_titles", broken)
    monkeypatch.setattr(textutil, "rfc822_header", broken)
    for d in docs:   # the chunker and the signposter read the stored parse: no title or header parser runs
        assert (_chunks(d, stored[d.path]), parse_document(d.text, blocks=stored[d.path])) == want[d.path], d.path
    with pytest.raises(AssertionError):
        _chunks(docs[0])                                       # without it they parse (here: broken)
    # a stored value of an older version (markdown blocks only, v=1) is not trusted: the text is parsed again
    assert rst.rst_from_stored(dict(stored["notes.rst"], v=1)) is None
    assert rst.rst_from_stored({"v": md.BLOCKS_VERSION, "fm": 0, "cr": False, "md": []}) is None


def test_one_header_parser_for_reader_chunker_and_signposter(monkeypatch):
    """The PEP reader, the reST chunker and the signposter read the header through textutil.rfc822_header."""
    import kb_assets.sources.textutil as textutil
    from kb_assets.sources.decisions import parse_pep

    meta = parse_pep(PEP, "pep-9999.rst")
    assert meta["status_raw"] == "Draft" and meta["authors"] == ["A. Person", "B. Person"]
    first = chunk_document(_rst_docs()[0], max_tokens=64)[0]
    assert first.heading == "PEP 9999: A stored parse" and first.start_line == 1
    calls = []
    real = textutil.rfc822_header
    import kb_assets.sources.decisions as decisions

    counted = lambda *a, **k: calls.append(1) or real(*a, **k)      # noqa: E731
    monkeypatch.setattr(textutil, "rfc822_header", counted)
    monkeypatch.setattr(decisions, "rfc822_header", counted)          # imported by name there
    parse_pep(PEP, "pep-9999.rst")
    chunk_document(_rst_docs()[0], max_tokens=64)
    parse_document(PEP)
    assert len(calls) == 3
    # a line that is neither a field nor a continuation: no header for any of them
    bad = "PEP: 1\nTitle: x\nnot a field\n\nBody\n"
    assert real(bad.split("\n")) is None and parse_document(bad).header == {}
    assert parse_pep(bad, "pep-0001.rst").get("status") is None


def test_documents_stage_stores_the_rst_parse(tmp_path, db_url, conn):
    root = tmp_path / "notes"
    root.mkdir()
    (root / "pep-9999.rst").write_text(PEP)
    (root / "notes.rst").write_text(RST)
    src = {"key": "notes", "kind": "doc", "root": str(root), "include": ["**/*.rst"]}
    cfg = parse_config({"database_url": db_url, "sources": [src]}, path="kb.yaml", base_dir=str(root))
    migrate(conn)
    sync_documents(conn, cfg, cfg.sources[0])
    rows = dict(conn.execute("SELECT path, blocks FROM documents WHERE status = 'active'").fetchall())
    assert set(rows) == {"pep-9999.rst", "notes.rst"}
    for doc in _rst_docs():
        assert rows[doc.path] == _stored(doc), doc.path
    # rows of the previous version (markdown scans only) are re-parsed by the next run, nothing re-chunked
    conn.execute("UPDATE documents SET blocks = NULL, blocks_version = 1")
    sync_documents(conn, cfg, cfg.sources[0])
    assert dict(conn.execute("SELECT path, blocks FROM documents WHERE status = 'active'").fetchall()) == rows


def test_signposter_reads_the_stored_scan_wherever_the_chunker_does(monkeypatch):
    """One shape decision (chunking.detect_shape): a work item ("file.json#12") and a session note without a
    markdown extension are markdown to the signposter too, so it reads their stored scan instead of parsing."""
    from kb_assets.signposts.base import SignpostInput
    from kb_assets.signposts.extractive import ExtractiveSignposter

    item = ("# Queue stalls under load\n\nkind: issue · status: open\n\n## Body\n\nWe decided to use skip locked "
            "because two workers took the same batch.\n\n```\n# not a heading\n```\n\n## Comment by ann\n\n" + PARA)
    note = "Session notes\n=============\n\n- item one\n- item two\n\n## Outcome\n\n" + PARA
    docs = [SourceDocument(path="issues.json#12", kind="work_item", title="", text=item, meta={}),
            SourceDocument(path="sessions/2026-12-01", kind="session", title="", text=note, meta={})]
    sp = ExtractiveSignposter()

    def signpost(d, blocks):
        return sp.generate(SignpostInput(title=d.title, kind=d.kind, path=d.path, text=d.text, meta={},
                                         blocks=blocks)).payload

    from kb_assets.signposts.extractive import _is_markdown

    assert all(_is_markdown(SignpostInput(title="", kind=d.kind, path=d.path, text=d.text)) for d in docs)
    assert not _is_markdown(SignpostInput(title="", kind="doc", path="notes.txt", text="plain words only"))
    assert not _is_markdown(SignpostInput(title="", kind="adr", path="pep-9999.rst", text=PEP))
    stored = [_stored(d) for d in docs]
    assert all(s and s.get("md") for s in stored)
    want = [signpost(d, None) for d in docs]
    monkeypatch.setattr(md, "block_structure", lambda text: (_ for _ in ()).throw(AssertionError("scanned")))
    assert [signpost(d, s) for d, s in zip(docs, stored)] == want


if __name__ == "__main__":
    pytest.main([__file__])
