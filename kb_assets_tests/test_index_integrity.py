"""An index built through the Dagster job, with its asset checks (the regression set among them), is exactly
the index a full recompute gives: the checks never write into it. Real embedded PostgreSQL, real local model.

The bug this guards against: the regression check's schema sat in front of the real index on its search_path,
so its statistics refresh found the real index's document-vector table and replaced every row with the
regression corpus' vectors (under ids that belong to other documents)."""
from __future__ import annotations

import importlib
import json
import sys
import uuid
from pathlib import Path

import dagster as dg
import psycopg
import pytest

from conftest import _with_db  # pytest puts the tests folder on sys.path


def _write_corpus(repo: Path) -> None:
    (repo / "docs" / "adr").mkdir(parents=True)
    (repo / "src").mkdir()
    for n, (title, body) in enumerate([
        ("Use PostgreSQL with pgvector", "We keep vectors beside the rows they describe, so deletes are "
                                         "transactional and one database serves documents and chunks."),
        ("Retry API calls with jittered backoff", "Rate limits answer 429 with Retry-After; we honour it and "
                                                  "back off exponentially with full jitter."),
        ("Signposts instead of chunk text", "Agents get a short ranked list of documents with decisions and "
                                            "rationale, never raw chunks, to keep their context small."),
    ], 1):
        (repo / "docs" / "adr" / f"000{n}-{title.lower().replace(' ', '-')}.md").write_text(
            f"# {n}. {title}\n\nDate: 2025-03-0{n}\n\n## Status\n\nAccepted\n\n## Context\n\n{body}\n\n"
            f"## Decision\n\n{body} This is decision {n}.\n\n## Consequences\n\nOperators read ADR {n}.\n")
    (repo / "src" / "retry.py").write_text(
        '"""Retry helpers for API calls."""\n\nimport random\n\n\n'
        "def backoff(attempt: int, base: float = 0.5) -> float:\n"
        '    """Exponential backoff with full jitter."""\n'
        "    return random.uniform(0, base * 2 ** attempt)\n")


def _sources(repo: Path) -> list[dict]:
    return [{"key": "decisions", "kind": "adr", "root": str(repo), "include": ["docs/adr/*.md"]},
            {"key": "code", "kind": "code", "root": str(repo), "include": ["src/**/*.py"]}]


@pytest.fixture
def second_db(pg_server_url):
    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(pg_server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield _with_db(pg_server_url, name)
    with psycopg.connect(pg_server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _snapshot(conn) -> dict:
    """Every table recall() reads, keyed by content (not by ids, which differ between databases), plus the
    id-level rows within one database."""
    from kb_assets.store.spaces import doc_vector_table
    from kb_assets.store.spaces import active_space

    space = active_space(conn)
    assert space is not None
    table = space[2]
    docs_table = doc_vector_table(table)
    snap = {
        "documents": conn.execute(
            "SELECT source_key, path, kind, content_hash, status, chunked_hash FROM documents ORDER BY 1, 2"
        ).fetchall(),
        "chunks": conn.execute(
            "SELECT d.source_key, d.path, c.ordinal, c.chunk_hash, c.token_count, c.tsv::text FROM chunks c"
            " JOIN documents d ON d.id = c.document_id ORDER BY 1, 2, 3").fetchall(),
        "vectors": conn.execute(f'SELECT chunk_hash, embedding::text FROM "{table}" ORDER BY 1').fetchall(),
        "document_vectors": conn.execute(
            f'SELECT d.source_key, d.path, x.content_hash, x.n_chunks, x.embedding::text FROM "{docs_table}" x'
            " LEFT JOIN documents d ON d.id = x.document_id ORDER BY 1, 2").fetchall(),
        "lexeme_stats": conn.execute("SELECT lexeme, ndoc FROM lexeme_stats ORDER BY 1").fetchall(),
        "query_stats": conn.execute("SELECT n_chunks, n_lexemes FROM query_stats").fetchall(),
        "chunk_texts": conn.execute(
            "SELECT d.path, t.text_md5::text, t.n FROM chunk_texts t JOIN documents d ON d.id = t.document_id"
            " ORDER BY 1, 2").fetchall(),
        "common_texts": conn.execute("SELECT text_md5::text, ndocs FROM common_texts ORDER BY 1").fetchall(),
        "document_terms": conn.execute(
            "SELECT d.source_key, d.path, t.lexeme, (SELECT array_agg(c.ordinal ORDER BY c.ordinal) FROM chunks c"
            " WHERE c.id = ANY(t.chunk_ids)), cardinality(t.chunk_ids) FROM document_terms t"
            " LEFT JOIN documents d ON d.id = t.document_id ORDER BY 1, 2, 3").fetchall(),
        "document_terms_kept": conn.execute("SELECT document_terms FROM query_stats").fetchall(),
    }
    ids = {
        "document_vectors": conn.execute(
            f'SELECT document_id, content_hash, n_chunks, embedding::text FROM "{docs_table}" ORDER BY 1').fetchall(),
        "documents": conn.execute("SELECT id, path FROM documents ORDER BY 1").fetchall(),
        "document_terms": conn.execute(
            "SELECT document_id, lexeme, (SELECT array_agg(x ORDER BY x) FROM unnest(chunk_ids) x) FROM document_terms"
            " ORDER BY 1, 2").fetchall(),
    }
    return {"content": snap, "ids": ids}


def _assert_same(a: dict, b: dict, what: str) -> None:
    for name in a:
        assert a[name] == b[name], f"{what}: table {name} differs"


def _assert_equivalent(a: dict, b: dict, what: str) -> None:
    """Two databases embedded separately: every table identical, except that a vector may differ in float
    rounding — the local embedder encodes a small job with its torch-free encoder or with torch, whichever is
    loaded at that instant (embedding/local.py `document_encoder`: same weights, vectors within ~1e-6)."""
    import numpy as np

    for name in a:
        if name not in ("vectors", "document_vectors"):
            assert a[name] == b[name], f"{what}: table {name} differs"
            continue
        assert [r[:-1] for r in a[name]] == [r[:-1] for r in b[name]], f"{what}: table {name}: rows differ"
        for ra, rb in zip(a[name], b[name]):
            va, vb = (np.array(json.loads(r[-1]), dtype=np.float64) for r in (ra, rb))
            assert va.shape == vb.shape and np.abs(va - vb).max() <= 1e-5, f"{what}: table {name}: {ra[:-1]} differs"


def test_index_built_by_dagster_with_checks_equals_full_recompute(tmp_path, db_url, second_db, monkeypatch):
    from kb_assets.config import load_config
    from kb_assets.embedding import make_embedder
    from kb_assets.pipeline import index_sources
    from kb_assets.pipeline.query_stats import refresh_query_stats
    from kb_assets.store.db import connect, open_database

    repo = tmp_path / "repo"
    _write_corpus(repo)
    cfg_path = tmp_path / "kb.yaml"
    cfg_path.write_text(json.dumps({"database_url": db_url, "sources": _sources(repo)}))
    monkeypatch.setenv("KB_CONFIG", str(cfg_path))
    for mod in [m for m in sys.modules if m.startswith("kb_assets.defs") or m == "kb_assets.definitions"]:
        del sys.modules[mod]
    definitions = importlib.import_module("kb_assets.definitions").defs
    defs = definitions() if callable(definitions) else definitions
    job = defs.resolve_job_def("kb_index")
    instance = dg.DagsterInstance.ephemeral()
    cfg = load_config(str(cfg_path))
    # after each partition's run (the first run of the regression check is the one that rebuilt its own
    # statistics from scratch, and used to overwrite the real index's document vectors doing so)
    for key in ("decisions", "code"):
        result = job.execute_in_process(partition_key=key, instance=instance)
        assert result.success
        checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
        assert checks.get("recall_regression_set") is True, checks
        with connect(open_database(cfg)) as conn:
            # the regression corpus lives in its own schema, never in the real index
            assert conn.execute("SELECT count(*) FROM documents WHERE source_key = 'regression'").fetchone()[0] == 0
            built = _snapshot(conn)
            refresh_query_stats(conn, full=True)
            recomputed = _snapshot(conn)
        _assert_same(built["content"], recomputed["content"], f"after {key}: Dagster-built index vs full recompute")
        _assert_same(built["ids"], recomputed["ids"], f"after {key}: Dagster-built vs full recompute (by id)")
        assert built["content"]["document_vectors"] and all(r[1] for r in built["content"]["document_vectors"])

    # and it equals the same sources indexed by the plain pipeline (no Dagster, no checks) elsewhere
    cfg2_path = tmp_path / "kb2.yaml"
    cfg2_path.write_text(json.dumps({"database_url": second_db, "sources": _sources(repo)}))
    cfg2 = load_config(str(cfg2_path))
    with connect(open_database(cfg2)) as conn2:
        index_sources(cfg2, conn2, embedder=make_embedder(cfg2))
        refresh_query_stats(conn2, full=True)
        plain = _snapshot(conn2)
    _assert_equivalent(recomputed["content"], plain["content"], "Dagster-built index vs the plain pipeline's")
