"""Checks a data engineer reads (drift, vector/keyword parity, per-source tables) and no silent success
(a glob that matches nothing, an unknown --kind / --source, filters that match no document). Real embedded
PostgreSQL, the real local model, a real git repository."""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import dagster as dg
import pytest
from kb_assets_tests.git_support import git as _git

ADR = ("# 1. Use PostgreSQL with pgvector\n\nDate: 2025-03-01\n\n## Status\n\nAccepted\n\n## Context\n\n"
       "We need one database for documents, chunks and vectors so that deletes and swaps are transactional.\n\n"
       "## Decision\n\nWe will use PostgreSQL with the pgvector extension because it keeps vectors beside the "
       "rows they describe.\n\n## Consequences\n\nOperators run one database; HNSW indexes need memory.\n")




@pytest.fixture
def project(tmp_path, db_url, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "docs" / "adr").mkdir(parents=True)
    (repo / "docs" / "adr" / "0001-use-postgres.md").write_text(ADR)
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "init")
    cfg = tmp_path / "kb.yaml"
    cfg.write_text(json.dumps({"database_url": db_url, "sources": [
        # the second glob is a typo (adrs): it matches nothing, and must say so
        {"key": "decisions", "kind": "adr", "root": str(repo), "include": ["docs/adr/*.md", "docs/adrs/*.md"],
         "content": "HEAD"}]}))
    monkeypatch.setenv("KB_CONFIG", str(cfg))
    for mod in [m for m in sys.modules if m.startswith("kb_assets.defs") or m == "kb_assets.definitions"]:
        del sys.modules[mod]
    return repo, cfg


def _defs():
    d = importlib.import_module("kb_assets.definitions").defs
    return d() if callable(d) else d


def test_checks_tables_and_no_silent_success(project, db_url, capsys):
    from kb_assets.cli import main
    from kb_assets.config import load_config
    from kb_assets.store.db import connect
    from kb_assets.store.health import drift, parity

    repo, cfg_path = project
    defs = _defs()
    # what generates the signposts is the asset's kind (extractive here), not always "gemini"
    sp = defs.resolve_assets_def("kb_signposts")
    assert set(sp.specs_by_key[dg.AssetKey("kb_signposts")].kinds) == {"python", "extractive"}

    result = defs.resolve_job_def("kb_index").execute_in_process(
        partition_key="decisions", instance=dg.DagsterInstance.ephemeral())
    assert result.success
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert checks["indexed_commit_matches_tip"].passed
    assert checks["vector_keyword_parity"].passed
    assert "decisions" in checks["vector_keyword_parity"].metadata["sources"].value
    assert "| decisions |" in checks["every_chunk_embedded"].metadata["sources"].value
    mats = {m.asset_key.to_user_string(): m.metadata
            for m in (e.event_specific_data.materialization for e in result.get_asset_materialization_events())}
    docs = mats["kb_documents"]
    assert docs["unmatched_include_globs"].value == ["docs/adrs/*.md"]
    assert "docs/adrs/*.md" in docs["warnings"].value and " new " in docs["counts"].value.splitlines()[0]

    # kb status: the glob warning, in text and in JSON
    assert main(["status", "--config", str(cfg_path), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert len(status["warnings"]) == 1 and "'docs/adrs/*.md'" in status["warnings"][0]
    assert main(["status", "--config", str(cfg_path)]) == 0
    out = capsys.readouterr().out
    assert "warning:" in out and "docs/adrs/*.md matched" not in out and "'docs/adrs/*.md' matched no file" in out
    # kb index: the run summary warns too (JSON key, and a warning line beside the text table)
    assert main(["index", "--config", str(cfg_path), "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert len(summary["warnings"]) == 1 and "'docs/adrs/*.md' matched no file" in summary["warnings"][0]
    assert "warning:" in captured.err and "'docs/adrs/*.md' matched no file" in captured.err

    # an unknown --kind or --source is an error that lists the valid values (exit 2)
    assert main(["recall", "why postgres", "--config", str(cfg_path), "--kind", "adrs"]) == 2
    err = capsys.readouterr().err
    assert "unknown kind 'adrs'" in err and "adr," in err and "code" in err
    assert main(["recall", "why postgres", "--config", str(cfg_path), "--source", "decision"]) == 2
    assert "use one of: decisions" in capsys.readouterr().err

    # filters that match no document say so (text and JSON), while a matching filter has no notice
    assert main(["recall", "why postgres", "--config", str(cfg_path), "--kind", "code", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["documents"] == [] and "kind=['code']" in answer["notice"]
    assert main(["recall", "why postgres", "--config", str(cfg_path), "--kind", "code"]) == 0
    text = capsys.readouterr().out
    assert "notice: no indexed document matches the filters" in text
    assert main(["recall", "why postgres", "--config", str(cfg_path), "--kind", "adr", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["documents"] and "notice" not in answer

    # drift: a new commit puts the index behind its tip; parity: a lost vector is seen
    cfg = load_config(cfg_path)
    (repo / "docs" / "adr" / "0002-more.md").write_text(ADR.replace("1. Use", "2. Keep"))
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "second")
    with connect(db_url) as conn:
        d = drift(conn, cfg, cfg.source("decisions"))
        assert d["drifted"] is True and d["commits_behind"] == 1
        p = parity(conn, "decisions")
        assert p["chunks"] >= 1 and p["without_vector"] == 0 and p["without_keywords"] == 0
        table = conn.execute("SELECT table_name FROM embedding_spaces WHERE activated_at IS NOT NULL").fetchone()[0]
        conn.execute(f'DELETE FROM "{table}" WHERE chunk_hash = (SELECT chunk_hash FROM chunks LIMIT 1)')
        assert parity(conn, "decisions")["without_vector"] == 1
