"""A small pass without Dagster (pipeline/direct_run.py) runs the signposts and then the projections beside the
vector stages and the checks; what depends on an order still has it: the checks that read signposts (failure
rate, tags) start only once the signposts stage has finished, the chunk checks only after the search-index
stage, and the projections' figures are recorded last, as the job's last step records them. Real embedded
PostgreSQL; the fixed-cost stand-in embedder; a signposter slowed down so the vector side finishes first."""
from __future__ import annotations

import threading
import time
from pathlib import Path

PARA = "The queue keeps its work in PostgreSQL and takes batches with skip locked; retries back off. "


def test_checks_wait_for_what_they_read_and_projections_record_last(tmp_path: Path, db_url, monkeypatch):
    from kb_assets import signposts as signposts_pkg
    from kb_assets.config import parse_config
    from kb_assets.pipeline import direct_run, stages
    from kb_assets.signposts.extractive import ExtractiveSignposter
    from kb_assets.store import checks
    from kb_assets.store.db import connect, open_database

    monkeypatch.setenv("KB_STANDIN_EMBEDDER", "0")
    root = tmp_path / "notes"
    root.mkdir()
    for n in range(4):
        (root / f"note-{n}.md").write_text(f"# Note {n}\n\nTags: queue\n\n" + PARA * 3, encoding="utf-8")
    cfg = parse_config({"database_url": db_url, "data_dir": str(tmp_path / "data"), "sources": [
        {"key": "notes", "kind": "doc", "root": str(root), "include": ["*.md"]}]},
        path=str(tmp_path / "kb.yaml"), base_dir=str(tmp_path))
    open_database(cfg)
    direct_run.run_source(cfg, "notes")          # the first load, every stage in this process

    events: list[str] = []
    lock = threading.Lock()

    def mark(what: str) -> None:
        with lock:
            events.append(what)

    class SlowSignposter(ExtractiveSignposter):
        def generate(self, doc):
            time.sleep(0.5)                       # the vector side (no model) is done long before
            return super().generate(doc)

    monkeypatch.setattr(signposts_pkg, "make_signposter", lambda _cfg: SlowSignposter())

    def wrap(module, name, before=None, after=None):
        real = getattr(module, name)

        def wrapped(*a, **k):
            if before:
                mark(before)
            try:
                return real(*a, **k)
            finally:
                if after:
                    mark(after)
        monkeypatch.setattr(module, name, wrapped)

    wrap(stages, "signposts", after="signposts done")
    wrap(stages, "search_index", after="search index done")
    wrap(stages, "projections", before="projections start")
    wrap(checks, "signpost_failure_rate", before="signpost check")
    wrap(checks, "tags_in_vocabulary", before="tags check")
    wrap(checks, "every_chunk_embedded", before="chunk check")

    for n in (1, 2):
        (root / f"note-{n}.md").write_text(f"# Note {n}, revised\n\nTags: queue\n\n" + PARA * 4, encoding="utf-8")
    run = direct_run.run_source(cfg, "notes")

    at = {e: i for i, e in enumerate(events)}
    assert at["signposts done"] < at["signpost check"] and at["signposts done"] < at["tags check"], events
    assert at["search index done"] < at["chunk check"], events
    assert at["signposts done"] < at["projections start"], events
    assert {c.name: c.passed for c in run.checks}["signpost_failure_rate"] is True
    assert run.assets["kb_signposts"]["generated"] == 2
    with connect(open_database(cfg)) as conn:
        status, stats = conn.execute("SELECT last_run_status, last_run_stats FROM sources WHERE key = 'notes'"
                                     ).fetchone()
    assert status == "projections" and stats["projections"]["entries"] == 4

    # the other way round (slow vectors, quick signposts): the projections do not wait for the search index
    monkeypatch.setattr(signposts_pkg, "make_signposter", lambda _cfg: ExtractiveSignposter())
    monkeypatch.setenv("KB_STANDIN_EMBEDDER", "0.3")
    events.clear()
    (root / "note-3.md").write_text("# Note 3, revised\n\nTags: queue\n\n" + PARA * 5, encoding="utf-8")
    direct_run.run_source(cfg, "notes")
    at = {e: i for i, e in enumerate(events)}
    assert at["signposts done"] < at["projections start"] < at["search index done"] < at["chunk check"], events
    with connect(open_database(cfg)) as conn:
        assert conn.execute("SELECT last_run_status FROM sources WHERE key = 'notes'").fetchone()[0] == "projections"
