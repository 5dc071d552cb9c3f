"""kb's tables live in their own schema (`schema` in kb.yaml, default `kb`; KB_SCHEMA overrides): never beside
Dagster's (which has a table `runs` too) or anyone's. An install made before that (kb's tables in `public`)
moves in place and keeps answering the same. Real embedded PostgreSQL, real local model."""
from __future__ import annotations

import json
import uuid

import psycopg
import pytest

from conftest import _with_db  # pytest puts the tests folder on sys.path


@pytest.fixture
def bare_db(pg_server_url):
    """A database nothing has migrated yet."""
    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(pg_server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield _with_db(pg_server_url, name)
    with psycopg.connect(pg_server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _tables(conn, schema: str) -> set[str]:
    return {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,))}


def _config(tmp_path, url, **extra):
    from kb_assets.config import load_config
    from kb_assets.query.regression import source_config

    path = tmp_path / f"kb-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(json.dumps({"data_dir": str(tmp_path / "data"), "database_url": url,
                                "sources": [source_config()], **extra}))
    return load_config(path)


def test_public_schema_install_moves_in_place_and_answers_the_same(tmp_path, bare_db):
    from kb_assets.embedding import make_embedder
    from kb_assets.pipeline import index_sources
    from kb_assets.query.regression import run_regression
    from kb_assets.store.db import connect, migrate, open_database
    from kb_assets.store.status import source_status

    cfg = _config(tmp_path, bare_db)
    embedder = make_embedder(cfg)
    # the old layout: migrations 001-004 applied into public (what every install before this change has),
    # beside someone else's table
    old = psycopg.connect(bare_db, autocommit=True, options="-c search_path=public")
    migrate(old, schema="public")
    old.execute("CREATE TABLE public.event_logs (id serial PRIMARY KEY, event text)")
    from pgvector.psycopg import register_vector

    register_vector(old)
    index_sources(cfg, old, embedder=embedder)
    before = run_regression(old, "regression", embedder=embedder)
    status_before = source_status(old)
    public_before = _tables(old, "public")
    assert {"documents", "chunks", "schema_migrations"} <= public_before
    assert before["passed"], before
    old.close()

    url = open_database(cfg)      # the upgrade: kb's tables move into schema kb
    with connect(url) as conn:
        assert conn.execute("SELECT current_schema()").fetchone()[0] == "kb"
        assert _tables(conn, "public") == {"event_logs"}           # only the foreign table stays
        assert public_before - {"event_logs"} <= _tables(conn, "kb")
        assert conn.execute("SELECT count(*) FROM pg_proc WHERE pronamespace = 'public'::regnamespace"
                            " AND proname LIKE 'kb\\_%'").fetchone()[0] == 0
        assert [r[0] for r in conn.execute("SELECT version FROM schema_migrations ORDER BY 1")][:4] == [1, 2, 3, 4]
        status_after = source_status(conn)
    after = run_regression(cfg, "regression", embedder=embedder)
    assert [d["got"] for d in after["details"]] == [d["got"] for d in before["details"]]
    assert after["mrr"] == before["mrr"]
    counts = ("documents", "chunks", "embedded", "skipped")
    assert [{k: s.get(k) for k in counts} for s in status_after] == \
           [{k: s.get(k) for k in counts} for s in status_before]

    # the moved triggers still track changes: a re-index after an edit refreshes incrementally and exactly
    from kb_assets.pipeline.query_stats import refresh_query_stats

    with connect(url) as conn:
        conn.execute("DELETE FROM documents WHERE path = 'README.md'")
        incremental = refresh_query_stats(conn)
        assert incremental["mode"] == "incremental"
        lex = conn.execute("SELECT lexeme, ndoc FROM lexeme_stats ORDER BY 1").fetchall()
        refresh_query_stats(conn, full=True)
        assert conn.execute("SELECT lexeme, ndoc FROM lexeme_stats ORDER BY 1").fetchall() == lex


def test_kb_tables_never_collide_with_dagsters_runs(tmp_path, bare_db):
    """Dagster's run storage in public has a table `runs`: kb's own `runs` is another table in kb's schema."""
    from kb_assets.store.db import connect, open_database

    with psycopg.connect(bare_db, autocommit=True) as other:
        other.execute("CREATE TABLE public.runs (run_id text PRIMARY KEY, pipeline_name text)")
        other.execute("INSERT INTO public.runs VALUES ('r1', 'kb_index')")
    cfg = _config(tmp_path, bare_db)
    with connect(open_database(cfg)) as conn:
        # kb's unqualified `runs` is its own (kb's columns), Dagster's stays as it was
        conn.execute("INSERT INTO runs (source_key, stage) VALUES ('s', 'documents')")
        assert conn.execute("SELECT source_key, stage FROM kb.runs").fetchall() == [("s", "documents")]
        assert conn.execute("SELECT run_id FROM public.runs").fetchall() == [("r1",)]
        assert "runs" in _tables(conn, "kb")


def test_schema_setting_and_env_override(tmp_path, bare_db, monkeypatch):
    from kb_assets.config import ConfigError
    from kb_assets.store.db import connect, open_database

    cfg = _config(tmp_path, bare_db, schema="team_kb")
    with connect(open_database(cfg)) as conn:
        assert conn.execute("SELECT current_schema()").fetchone()[0] == "team_kb"
        # search_path: kb's schema, then the vector extension's (found from pg_extension) and nothing else
        ext = conn.execute("SELECT extnamespace::regnamespace::text FROM pg_extension"
                           " WHERE extname = 'vector'").fetchone()[0]
        assert conn.execute("SELECT current_schemas(false)").fetchone()[0] == ["team_kb", ext]
        assert "documents" in _tables(conn, "team_kb") and "documents" not in _tables(conn, "kb")
    monkeypatch.setenv("KB_SCHEMA", "other_kb")
    with connect(open_database(cfg)) as conn:
        assert conn.execute("SELECT current_schema()").fetchone()[0] == "other_kb"
    monkeypatch.setenv("KB_SCHEMA", "Bad-Name")
    with pytest.raises(ConfigError, match="KB_SCHEMA"):
        open_database(cfg)
    monkeypatch.delenv("KB_SCHEMA")
    with pytest.raises(ConfigError) as err:
        _config(tmp_path, bare_db, schema="pg_kb")
    assert ": schema: " in str(err.value) and "reserved" in str(err.value)
