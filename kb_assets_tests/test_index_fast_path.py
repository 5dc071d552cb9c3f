"""Nothing changed costs (almost) nothing: `kb index` reports a source unchanged without a Dagster run when
its fingerprint (kb_assets/pipeline/source_state.py) equals the one its last complete, successful run
recorded; anything that could change the index leads to a real run. Whole `kb index` processes (the CLI runs
the Dagster job), real git repositories and folders, the embedded PostgreSQL, the real local model."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from kb_assets_tests.git_support import git as _git

_RUN = (
    "import json, sys\n"
    "from kb_assets.cli import main\n"
    "rc = main(sys.argv[1:])\n"
    "print('DAGSTER=' + json.dumps('dagster' in sys.modules), file=sys.stderr)\n"
    "print('HEAVY=' + json.dumps(sorted(m for m in ('numpy', 'tokenizers', 'torch', 'onnxruntime', 'detect_secrets',"
    " 'dateutil', 'concurrent.futures.process', 'kb_assets.chunking.code', 'rich.progress') if m in sys.modules)),"
    " file=sys.stderr)\n"
    "sys.exit(rc)\n")




def _age(*paths: Path, seconds: float = 120) -> None:
    """Files written seconds ago: a listing right after a write is racy and never recorded (by design)."""
    t = time.time() - seconds
    for p in paths:
        os.utime(p, (t, t))


def _kb_index(cfg: Path | str, *extra: str, expect_rc: int = 0, cwd: Path | None = None) -> tuple[dict, bool, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "KB_DB_LINGER": "0"}
    env.pop("KB_CONFIG", None)
    proc = subprocess.run([sys.executable, "-c", _RUN, "index", "--config", str(cfg), "--json", *extra],
                          capture_output=True, text=True, env=env, timeout=900, cwd=cwd)
    assert proc.returncode == expect_rc, proc.stdout[-3000:] + proc.stderr[-3000:]
    dagster = json.loads(next(line for line in proc.stderr.splitlines() if line.startswith("DAGSTER="))[8:])
    out = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return out, dagster, proc.stderr


def _ran(out: dict) -> dict[str, bool]:
    """source -> True when it was run (False: reported unchanged without a run)."""
    return {s["source"]: not s["skipped_run"] for s in out["sources"]}


def _runners(out: dict) -> dict[str, str | None]:
    """source -> "dagster" (the job) | "direct" (a small change without a Dagster run) | None (not run)."""
    return {s["source"]: s["runner"] for s in out["sources"]}


def _write_config(cfg: Path, tmp: Path, db_url: str, notes_include: list[str], **notes_extra) -> None:
    cfg.write_text(json.dumps({
        "data_dir": str(tmp / "data"), "database_url": db_url,
        "sources": [
            {"key": "notes", "kind": "doc", "root": str(tmp / "notes"), "include": notes_include, **notes_extra},
            {"key": "adrs", "kind": "adr", "root": str(tmp / "repo"), "include": ["docs/*.md"], "content": "HEAD"},
            {"key": "wt", "kind": "doc", "root": str(tmp / "wt"), "include": ["*.md"]},
        ]}))


def _doc(title: str, body: str) -> str:
    return f"# {title}\n\n## Context\n\n{body} because the team asked for it.\n\n## Decision\n\nWe do {body}.\n"


def test_unchanged_sources_are_not_run_and_every_change_is(tmp_path, db_url):
    notes, repo, wt = tmp_path / "notes", tmp_path / "repo", tmp_path / "wt"
    notes.mkdir()
    for name in ("a", "b"):
        (notes / f"{name}.md").write_text(_doc(f"Note {name}", f"note {name} keeps streams for {name} days"))
    (notes / "c.txt").write_text(_doc("Plain text note", "plain text notes are indexed too"))
    _age(*notes.iterdir())
    (repo / "docs").mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "docs" / "ADR-1.md").write_text(_doc("ADR 1: retention", "retention of thirty days"))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "first")
    wt.mkdir()
    _git(wt, "init", "-q")
    (wt / "guide.md").write_text(_doc("Guide", "the guide explains the consumer API"))
    _git(wt, "add", "-A")
    _git(wt, "commit", "-q", "-m", "first")
    _age(wt / "guide.md")
    cfg = tmp_path / "kb.yaml"
    _write_config(cfg, tmp_path, db_url, ["*.md"])

    first, dagster, _ = _kb_index(cfg)
    assert _ran(first) == {"notes": True, "adrs": True, "wt": True} and dagster

    # nothing changed: no run, no Dagster import; the JSON keeps its shape (documents all unchanged)
    out, dagster, err = _kb_index(cfg)
    assert _ran(out) == {"notes": False, "adrs": False, "wt": False}
    assert not dagster, "a nothing-changed kb index imported dagster"
    assert "nothing changed since its last complete run" in err
    by_key = {s["source"]: s for s in out["sources"]}
    assert by_key["notes"]["this_run"]["documents"]["unchanged"] == 2 == by_key["notes"]["documents"]
    assert all(s["this_run"]["embeddings"]["chunks_embedded"] == 0 == s["this_run"]["signposts"]["llm_calls"]
               for s in out["sources"])

    # a modified file of a folder source: that source runs, the others do not
    (notes / "a.md").write_text(_doc("Note a", "note a keeps streams for ninety days, revised"))
    _age(notes / "a.md", seconds=60)
    # (a small change of a source indexed completely before: no Dagster run, not even its import)
    out, dagster, _ = _kb_index(cfg)
    assert _ran(out) == {"notes": True, "adrs": False, "wt": False} and not dagster
    assert _runners(out) == {"notes": "direct", "adrs": None, "wt": None}
    assert {s["source"]: s for s in out["sources"]}["notes"]["this_run"]["documents"]["changed"] == 1

    # a new untracked file in a working-tree git source
    (wt / "new.md").write_text(_doc("New page", "the new page covers replays"))
    _age(wt / "new.md")
    out, _, _ = _kb_index(cfg)
    assert _ran(out) == {"notes": False, "adrs": False, "wt": True} and _runners(out)["wt"] == "direct"
    assert {s["source"]: s for s in out["sources"]}["wt"]["this_run"]["documents"]["new"] == 1

    # an untracked file in a source that indexes commits changes nothing; a new commit does
    (repo / "docs" / "ADR-2.md").write_text(_doc("ADR 2: replicas", "three replicas per stream"))
    out, _, _ = _kb_index(cfg)
    assert _ran(out) == {"notes": False, "adrs": False, "wt": False}
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "second")
    out, _, _ = _kb_index(cfg)
    assert _ran(out) == {"notes": False, "adrs": True, "wt": False} and _runners(out)["adrs"] == "direct"
    assert {s["source"]: s for s in out["sources"]}["adrs"]["this_run"]["documents"]["new"] == 1

    # a changed include glob
    _write_config(cfg, tmp_path, db_url, ["*.md", "*.txt"])
    out, dagster, _ = _kb_index(cfg)
    assert _ran(out) == {"notes": True, "adrs": False, "wt": False}
    assert _runners(out)["notes"] == "dagster" and dagster     # a changed setting: the whole job
    assert {s["source"]: s for s in out["sources"]}["notes"]["documents"] == 3

    # --force runs everything
    out, _, _ = _kb_index(cfg, "--force")
    assert _ran(out) == {"notes": True, "adrs": True, "wt": True}
    assert set(_runners(out).values()) == {"dagster"}
    out, _, _ = _kb_index(cfg, "--source", "wt")
    assert _ran(out) == {"wt": False}

    # a run that started and did not finish (killed mid-embedding, or started from the UI and still going):
    # the documents stage forgets the record at its start, so the next kb index runs the source
    from kb_assets.config import load_config
    from kb_assets.pipeline.documents import sync_documents
    from kb_assets.store.db import connect, open_database

    loaded = load_config(str(cfg))
    with connect(open_database(loaded)) as conn:
        sync_documents(conn, loaded, loaded.source("notes"))
    out, _, _ = _kb_index(cfg)
    assert _ran(out) == {"notes": True, "adrs": False, "wt": False}
    assert _runners(out)["notes"] == "dagster"      # no complete run recorded: the whole job

    # a stage that failed (the listing is refused past max_files: exit 2): with the settings put back as
    # they were recorded, the source still runs, since that failed run started
    _write_config(cfg, tmp_path, db_url, ["*.md", "*.txt"], max_files=1)
    _kb_index(cfg, "--source", "notes", expect_rc=2)
    _write_config(cfg, tmp_path, db_url, ["*.md", "*.txt"])
    out, _, _ = _kb_index(cfg)
    assert _ran(out) == {"notes": True, "adrs": False, "wt": False}
    out, dagster, _ = _kb_index(cfg)
    assert _ran(out) == {"notes": False, "adrs": False, "wt": False} and not dagster


def test_pending_work_is_never_recorded(tmp_path, db_url):
    """A source with work left (a document not chunked) is not recorded: the next kb index runs it."""
    from kb_assets.config import load_config
    from kb_assets.pipeline import source_state
    from kb_assets.pipeline.documents import sync_documents
    from kb_assets.store.db import connect, open_database

    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.md").write_text(_doc("Note a", "note a keeps streams for seven days"))
    cfg = tmp_path / "kb.yaml"
    cfg.write_text(json.dumps({"data_dir": str(tmp_path / "data"), "database_url": db_url,
                               "sources": [{"key": "notes", "kind": "doc", "root": str(notes),
                                            "include": ["*.md"]}]}))
    loaded = load_config(str(cfg))
    source = loaded.source("notes")
    fresh = source_state.source_fingerprint(loaded, source)
    _age(notes / "a.md")
    state = source_state.source_fingerprint(loaded, source)
    assert state.fingerprint and state.fingerprint != fresh.fingerprint   # the mtime is part of the listing
    with connect(open_database(loaded)) as conn:
        assert sync_documents(conn, loaded, source).new == 1     # stored, not chunked yet
        assert source_state.record_if_complete(conn, state) == "1 documents not chunked"
        assert source_state.stored_fingerprint(conn, "notes") is None
    out, dagster, _ = _kb_index(cfg)
    assert _ran(out) == {"notes": True} and dagster and _runners(out) == {"notes": "dagster"}
    out, dagster, _ = _kb_index(cfg)
    assert _ran(out) == {"notes": False} and not dagster
    # deleting the projections' tier files makes the next run rebuild them
    (loaded.projections_path() / "index.dsl").unlink()
    out, _, _ = _kb_index(cfg)
    assert _ran(out) == {"notes": True} and (loaded.projections_path() / "index.dsl").is_file()


def test_the_same_config_named_another_way_is_still_unchanged(tmp_path, db_url):
    """One kb.yaml, named by its absolute path (a cron line), from its folder (a person) and through a symlink:
    the same settings, so nothing changed is nothing changed. (Each name used to record itself, so alternating
    them ran the whole Dagster job every time.)"""
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.md").write_text(_doc("Note a", "note a keeps streams for thirty days"))
    (notes / "b.md").write_text(_doc("Note b", "note b keeps replicas in three zones"))
    _age(notes / "a.md", notes / "b.md")
    cfg = tmp_path / "kb.yaml"
    cfg.write_text(json.dumps({"data_dir": "data", "database_url": db_url, "sources": [
        {"key": "notes", "kind": "doc", "root": "notes", "include": ["*.md"]}]}))
    (tmp_path / "elsewhere").mkdir()
    link = tmp_path / "elsewhere" / "kb-link.yaml"
    link.symlink_to(cfg)

    first, dagster, _ = _kb_index(cfg)
    assert _ran(first) == {"notes": True} and dagster
    for named, cwd in (("kb.yaml", tmp_path), (cfg, None), (link, None), ("../kb.yaml", tmp_path / "elsewhere")):
        out, dagster, err = _kb_index(named, cwd=cwd)
        assert _ran(out) == {"notes": False}, (named, cwd, err[-2000:])
        assert not dagster

    # a change is still a change, whichever name runs it (a small one: without a Dagster run)
    (notes / "a.md").write_text(_doc("Note a", "note a keeps streams for ninety days"))
    _age(notes / "a.md", seconds=60)
    out, dagster, _ = _kb_index("kb.yaml", cwd=tmp_path)
    assert _runners(out) == {"notes": "direct"} and not dagster
    out, _, _ = _kb_index(link)
    assert _ran(out) == {"notes": False}

    # a delete handles no text and no vector: no model, no tokenizer, not even numpy is imported; nor what only
    # reading dates, cutting chunks, a process pool or progress bars need (each a few ms of every such pass)
    (notes / "b.md").unlink()
    out, dagster, err = _kb_index(cfg)
    assert _runners(out) == {"notes": "direct"} and not dagster
    assert {s["source"]: s for s in out["sources"]}["notes"]["this_run"]["documents"]["deleted"] == 1
    heavy = json.loads(next(line for line in err.splitlines() if line.startswith("HEAVY="))[6:])
    assert heavy == [], heavy
