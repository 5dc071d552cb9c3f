"""An include glob that matches nothing is a warning — but not the built-in default's file types (a repository
without notebooks is not a typo in a kb.yaml nobody wrote)."""
from __future__ import annotations

from kb_assets.config import DEFAULT_DOC_GLOBS, SourceConfig
from kb_assets.store.health import unmatched_includes


def test_unmatched_globs_warn_except_the_default_menu(conn, tmp_path):
    conn.execute("INSERT INTO sources (key, kind, root, listed_at) VALUES ('docs', 'doc', %s, now())",
                 (str(tmp_path),))
    conn.execute("INSERT INTO documents (source_key, path, kind, title, status, content_hash, text)"
                 " VALUES ('docs', 'README.md', 'readme', 'r', 'active', 'h', 't')")
    typo = SourceConfig(key="docs", kind="doc", root=str(tmp_path), include=["**/*.md", "dcos/*.md"])
    assert unmatched_includes(conn, typo) == ["dcos/*.md"]
    default = SourceConfig(key="docs", kind="doc", root=str(tmp_path), include=list(DEFAULT_DOC_GLOBS))
    assert unmatched_includes(conn, default) == []
