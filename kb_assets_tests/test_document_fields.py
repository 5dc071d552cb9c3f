"""Parse once (issue 13 §1): the documents stage stores each document's normalised fields as columns (status
beside its own word, created / updated as DATE with their provenance, tags), every document has a date, old
rows are filled without re-reading or re-embedding, and the date filters run in SQL over the whole index."""
from __future__ import annotations

import datetime as dt
import os
import subprocess
from pathlib import Path

import pytest

from kb_assets.config import parse_config
from kb_assets.pipeline import chunk_source, sync_documents
from kb_assets.query import Tuning, recall
from kb_assets.sources.dates import normalize_date, parse_date
from kb_assets_tests.test_query_support import Corpus, ToyEmbedder

BODY = "The ingestion service keeps a queue of work in PostgreSQL and takes batches with skip locked. " * 3


@pytest.mark.parametrize("text, iso", [
    ("2017-07-14", "2017-07-14"), ("14.07.2017", "2017-07-14"), ("14/07/2017", "2017-07-14"),
    ("20260131", "2026-01-31"), ("05-Jul-2001", "2001-07-05"), ("July 5, 2001", "2001-07-05"),
    ("2017-07-14 (revised)", "2017-07-14"), ("2024/07/17", "2024-07-17"), ("1.2.2020", "2020-02-01"),
    ("2026-02-30", None), ("3", None), ("July", None), ("last tuesday", None), ("", None)])
def test_one_date_parser_reads_every_spelling_the_same_everywhere(text, iso):
    from kb_assets.query.engine import parse_date as query_parse_date
    from kb_assets.sources.textutil import normalize_date as reader_normalize_date

    assert normalize_date(text) == iso
    assert reader_normalize_date(text) == iso          # the readers' name for it is the same function
    assert (query_parse_date(text) or None) == (dt.date.fromisoformat(iso) if iso else None)
    assert parse_date(dt.datetime(2020, 1, 2, 3, 4)) == dt.date(2020, 1, 2)


def _tree(root: Path) -> None:
    files = {
        "docs/adr/0001-use-queues.md": "# 1. Use queues\n\nDate: 14.07.2017\n\n## Status\n\nDone\n\n## Context\n\n"
                                       + BODY,
        "docs/adr/0002-drop-cron.md": "# 2. Drop cron\n\n## Status\n\nNot implemented\n\n## Context\n\n" + BODY,
        "docs/notes/plan.md": "---\ntitle: The plan\ndate: 20260131\nstatus: done\ntags: [Ops, queues]\n---\n\n"
                              "# Plan\n\n" + BODY,
        "docs/notes/undated.md": "# Undated\n\n" + BODY,
    }
    for rel, text in files.items():
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    os.utime(root / "docs/notes/undated.md", (1_600_000_000, 1_600_000_000))   # 2020-09-13


def _cfg(root: Path, url: str, content: str = "worktree"):
    data = {"database_url": url, "sources": [
        {"key": "adrs", "kind": "adr", "root": str(root), "content": content, "include": ["docs/adr/*.md"]},
        {"key": "notes", "kind": "doc", "root": str(root), "content": content, "include": ["docs/notes/*.md"]}]}
    return parse_config(data, path=str(root / "kb.yaml"), base_dir=str(root))


def _fields(conn) -> dict:
    return {r[0]: r[1:] for r in conn.execute(
        "SELECT path, doc_status, doc_status_raw, created::text, updated::text, date_source, tags"
        " FROM documents WHERE status = 'active' ORDER BY path")}


def test_documents_stage_stores_the_parse_as_columns_and_every_document_has_a_date(tmp_path, db_url, conn):
    _tree(tmp_path)
    cfg = _cfg(tmp_path, db_url)
    for s in cfg.sources:
        sync_documents(conn, cfg, s)
    f = _fields(conn)
    assert f["docs/adr/0001-use-queues.md"] == ("Implemented", "Done", "2017-07-14", None, "document", [])
    assert f["docs/adr/0002-drop-cron.md"][:2] == ("Not Implemented", "Not implemented")
    assert f["docs/notes/plan.md"] == ("Implemented", "done", "2026-01-31", None, "front_matter", ["ops", "queues"])
    # no date of its own: the file's mtime, and it says so
    assert f["docs/notes/undated.md"] == (None, None, "2020-09-13", "2020-09-13", "mtime", [])
    assert f["docs/adr/0002-drop-cron.md"][4] == "mtime"


def test_head_mode_undated_documents_take_the_commit_date(tmp_path, db_url, conn):
    _tree(tmp_path)
    env = dict(os.environ, GIT_AUTHOR_DATE="2021-03-04T05:06:07Z", GIT_COMMITTER_DATE="2021-03-04T05:06:07Z")
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, env=env)
    cfg = _cfg(tmp_path, db_url, content="HEAD")
    for s in cfg.sources:
        sync_documents(conn, cfg, s)
    f = _fields(conn)
    assert f["docs/notes/undated.md"][2:5] == ("2021-03-04", "2021-03-04", "commit")
    assert f["docs/notes/plan.md"][2] == "2026-01-31"          # its own date wins


def test_rows_stored_before_the_columns_are_filled_without_rereading_or_rechunking(tmp_path, db_url, conn):
    _tree(tmp_path)
    cfg = _cfg(tmp_path, db_url)
    for s in cfg.sources:
        sync_documents(conn, cfg, s)
        chunk_source(conn, s.key, max_tokens=254, count_tokens=None)
    before = conn.execute("SELECT path, chunked_hash, updated_at FROM documents ORDER BY path").fetchall()
    chunk_ids = conn.execute("SELECT array_agg(id ORDER BY id) FROM chunks").fetchone()[0]
    # an index from before migration 007: the columns are empty
    conn.execute("UPDATE documents SET doc_status = NULL, doc_status_raw = NULL, created = NULL, updated = NULL,"
                 " date_source = NULL, tags = '{}', fields_version = NULL")
    for s in cfg.sources:
        stats = sync_documents(conn, cfg, s)
        assert stats.unchanged == stats.listed and stats.changed == stats.new == 0   # nothing read again
        assert chunk_source(conn, s.key, max_tokens=254, count_tokens=None).documents_chunked == 0
    assert _fields(conn)["docs/adr/0001-use-queues.md"][2] == "2017-07-14"
    assert conn.execute("SELECT path, chunked_hash, updated_at FROM documents ORDER BY path").fetchall() == before
    assert conn.execute("SELECT array_agg(id ORDER BY id) FROM chunks").fetchone()[0] == chunk_ids


def test_a_narrow_date_range_over_a_larger_index_returns_every_matching_document(conn):
    """The date filter restricts candidates inside every channel's SQL: with 300 equally relevant documents (and 600 others),
    the 12 dated inside the range all come back (a filter after a ~200-candidate window found a few)."""
    c = Corpus(conn)
    inside = set()
    for i in range(300):
        day = dt.date(2020, 1, 1) + dt.timedelta(days=i * 3)
        c.doc(f"notes/{i:03d}.md", [f"celery worker restart runbook number {i}"], source="notes",
              meta={"date": day.isoformat()})
        if dt.date(2021, 6, 1) <= day <= dt.date(2021, 7, 3):
            inside.add(f"kb:notes/notes/{i:03d}.md")
    c.doc("notes/undated.md", ["celery worker restart runbook without a date"], source="notes")
    for i in range(600):      # other topics, so the query's words are selective enough for the keyword channel
        c.doc(f"misc/{i:03d}.md", [f"gardening tomato seedlings watering schedule {i}"], source="misc",
              meta={"date": "2019-06-15"})
    c.refresh()
    assert len(inside) == 11
    for mode in ("hybrid", "keyword", "vector"):
        r = recall("celery worker restart runbook", conn=conn, embedder=ToyEmbedder(), mode=mode, limit=50,
                   since="2021-06-01", until="2021-07-03", tuning=Tuning(gate=False))
        got = {d.id for d in r.documents}
        assert got == inside, (mode, len(got))
    # an undated document (no date at all: not re-indexed since migration 007) matches no range, and the
    # empty answer says it is the filters
    r = recall("celery", conn=conn, embedder=ToyEmbedder(), since="1990-01-01", until="1990-12-31")
    assert r.documents == [] and r.notice and "since=1990-01-01" in r.notice


@pytest.mark.parametrize("raw", ["done", "Accepted", "approved", "Superseded", "rejected", "Draft", "proposed",
                                 "deprecated", "completed", "Not implemented", "declined", "on hold"])
def test_the_signpost_status_and_the_column_use_one_normaliser_and_keep_the_documents_word(raw):
    from kb_assets.pipeline.document_fields import document_fields
    from kb_assets.signposts.extractive import normalise_status

    column, column_raw = document_fields("adr", {"status": raw}, None)[:2]
    shown = normalise_status(raw)
    assert column_raw == raw
    assert shown.split(" (")[0].lower() == column.lower()          # the same canonical word
    if column.lower() != raw.lower():
        assert raw.lower() in shown.lower()                          # the document's own word beside it


def test_the_t0_index_shows_the_normalised_status_of_front_matter_documents(tmp_path, db_url, conn):
    """T0 reads the documents stage's doc_status: a note whose front matter says `status: done` is listed as
    Implemented, like an ADR that says Done (T0 used to print the raw front-matter word)."""
    from kb_assets.pipeline.projections import build_projections

    _tree(tmp_path)
    cfg = _cfg(tmp_path, db_url)
    for s in cfg.sources:
        sync_documents(conn, cfg, s)
    build_projections(conn, cfg, measure_tokens=False)
    index = (cfg.projections_path() / "index.dsl").read_text()
    plan = next(line for line in index.splitlines() if "plan.md" in line)
    adr = next(line for line in index.splitlines() if "0001-use-queues" in line)
    assert plan.rstrip().endswith("| Implemented") and adr.rstrip().endswith("| Implemented"), (plan, adr)


def test_recall_and_show_read_the_dates_and_status_from_the_columns(conn):
    """A record's created / updated / status are the documents stage's columns (the one normalised status, the
    date the filters use), the stored meta's only for a row whose columns are not filled yet."""
    from kb_assets.query import show

    c = Corpus(conn)
    c.doc("notes/plan.md", ["celery worker restart runbook plan"], source="notes",
          meta={"date": "14.07.2017", "status": "done"})
    c.doc("notes/old.md", ["celery worker restart runbook old"], source="notes",
          meta={"date": "2019-03-02", "status": "proposed"})
    c.refresh()
    # the stage's columns win over meta: a date the filters see, stated nowhere in meta
    conn.execute("UPDATE documents SET updated = '2024-05-06' WHERE path = 'notes/plan.md'")
    # a row from before migration 007: nothing in the columns, meta is all there is
    conn.execute("UPDATE documents SET doc_status = NULL, created = NULL, updated = NULL WHERE path = 'notes/old.md'")
    r = recall("celery worker restart runbook", conn=conn, embedder=ToyEmbedder(), tuning=Tuning(gate=False))
    got = {d.id: d.to_dict() for d in r.documents}
    plan, old = got["kb:notes/notes/plan.md"], got["kb:notes/notes/old.md"]
    assert (plan["status"], plan["created"], plan["updated"]) == ("Implemented", "2017-07-14", "2024-05-06")
    assert (old["status"], old["created"], old["updated"]) == ("proposed", "2019-03-02", None)
    shown = show("kb:notes/notes/plan.md", conn=conn)
    assert (shown["status"], shown["created"], shown["updated"]) == ("Implemented", "2017-07-14", "2024-05-06")
    r = recall("celery", conn=conn, embedder=ToyEmbedder(), since="2024-05-01", until="2024-05-31",
               tuning=Tuning(gate=False))
    assert [(d.id, d.updated) for d in r.documents] == [("kb:notes/notes/plan.md", "2024-05-06")]
