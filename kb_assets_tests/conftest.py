"""Shared fixtures: one embedded PostgreSQL (pgserver) per test session, a fresh database per test."""
from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path

import pytest

# Nothing in the test suite may reach a model hub or the internet.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.pop("KB_DATABASE_URL", None)
os.environ.pop("KB_CONFIG", None)
# kb recall/show/search/status in a child process would leave the embedded database up for 5 minutes
# (store/linger.py): tests stop it at exit unless they test lingering itself.
os.environ.setdefault("KB_DB_LINGER", "0")
# Dagster instance storage for tests: a temp folder, never the repo-root dagster.yaml.
os.environ.setdefault("DAGSTER_HOME", tempfile.mkdtemp(prefix="kb-dagster-"))

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture(scope="session")
def pg_server_url(tmp_path_factory) -> str:
    from kb_assets.store.db import embedded_url

    # pgserver needs a short path (unix socket path limit ~107 bytes).
    base = Path(tempfile.mkdtemp(prefix="kbpg-", dir="/tmp"))
    return embedded_url(base)


def _with_db(url: str, dbname: str) -> str:
    import psycopg.conninfo as ci

    params = ci.conninfo_to_dict(url)
    params["dbname"] = dbname
    return ci.make_conninfo(**params)


@pytest.fixture
def db_url(pg_server_url) -> str:
    import psycopg

    from kb_assets.store.db import connect, migrate

    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(pg_server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = _with_db(pg_server_url, name)
    with connect(url, register=False) as conn:
        migrate(conn)
    yield url
    with psycopg.connect(pg_server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def conn(db_url):
    from kb_assets.store.db import connect

    c = connect(db_url)
    yield c
    c.close()


@pytest.fixture
def shared_dir() -> Path:
    if not SHARED.exists():
        pytest.skip(f"shared data not found at {SHARED}")
    return SHARED
