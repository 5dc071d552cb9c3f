import psycopg
import pytest

from kb_assets.store import spaces
from kb_assets.store.db import connect, migrate


def test_migrate_is_idempotent(db_url):
    with connect(db_url) as c:
        assert migrate(c) == []
        names = {r[0] for r in c.execute("SELECT tablename FROM pg_tables WHERE schemaname=current_schema()")}
    assert {"sources", "documents", "chunks", "embedding_spaces", "signposts", "signpost_state"} <= names


def test_spaces_are_separate_tables(conn):
    a = spaces.ensure_space(conn, "model-a", 3)
    b = spaces.ensure_space(conn, "model-b", 4)
    assert a != b and spaces.ensure_space(conn, "model-a", 3) == a
    conn.execute(f"INSERT INTO {a} (chunk_hash, embedding) VALUES ('h', '[1,0,0]')")
    with pytest.raises(psycopg.errors.DataException):
        conn.execute(f"INSERT INTO {b} (chunk_hash, embedding) VALUES ('h', '[1,0,0]')")
    assert spaces.active_space(conn) is None
    spaces.activate_space(conn, "model-b", 4)
    assert spaces.active_space(conn)[0] == "model-b"
    spaces.activate_space(conn, "model-a", 3)
    assert spaces.active_space(conn)[:2] == ("model-a", 3)
    spaces.ensure_vector_index(conn, a)
    idx = conn.execute("SELECT indexdef FROM pg_indexes WHERE tablename=%s", (a,)).fetchall()
    assert any("hnsw" in r[0] and "vector_cosine_ops" in r[0] for r in idx)
    # built with the measured settings (docs/BENCHMARKS.md), not pgvector's defaults
    assert any(f"m='{spaces.HNSW_M}'" in r[0] and f"ef_construction='{spaces.HNSW_EF_CONSTRUCTION}'" in r[0]
               for r in idx), idx
