"""Invariant 8 end to end: planted secrets of every family, in a transcript, a README and a code file,
appear in no table of the database and in no request that reaches the (mock) Voyage server — while the
normal content of the same files is indexed and searchable."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from kb_assets.config import parse_config
from kb_assets.embedding import VoyageEmbedder
from kb_assets.pipeline import index_sources
from kb_assets.signposts.extractive import ExtractiveSignposter

from kb_assets_tests.mock_voyage import MockVoyage
from kb_assets_tests.test_sources_redaction import planted


def _repo(root: Path, fams: dict) -> None:
    all_text = "\n".join(t for t, _v, _s in fams.values())
    (root / "README.md").write_text(
        "# Payments service\n\nHow to run the payments service locally.\n\n```\n" + all_text +
        "\n```\n\nAsk the platform team for access to the staging ledger.\n")
    (root / "src").mkdir()
    (root / "src" / "settings.py").write_text(
        '"""Settings for the payments service."""\nimport os\n\n' +
        "\n".join(f"VALUE_{i} = {json.dumps(t)}" for i, (t, _v, _s) in enumerate(fams.values())) +
        "\n\n\ndef load_mode():\n    \"\"\"Read the run mode from the environment.\"\"\"\n"
        "    return os.environ.get('MODE', 'dev')\n")
    (root / "sessions").mkdir()
    recs = [
        {"type": "user", "sessionId": "s1", "cwd": str(root), "timestamp": "2026-01-01T00:00:00Z",
         "message": {"role": "user", "content": "Rotate the ledger credentials, here they are:\n" + all_text}},
        {"type": "assistant", "sessionId": "s1", "timestamp": "2026-01-01T00:00:01Z", "message": {
            "id": "m1", "role": "assistant", "content": [
                {"type": "tool_use", "id": "t1", "name": "Bash",
                 "input": {"command": f"export GH={fams['github'][1]} && ./rotate.sh"}},
                {"type": "text", "text": "Rotated the ledger credentials and restarted the workers."}]}},
        {"type": "user", "sessionId": "s1", "timestamp": "2026-01-01T00:00:02Z", "message": {
            "role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": all_text}]}},
    ]
    (root / "sessions" / "s1.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "-c", "user.email=t@e", "-c", "user.name=t", "add", "."], cwd=root, check=True)
    subprocess.run(["git", "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", "i"], cwd=root, check=True)


def _dump_database(conn) -> str:
    """Every row of every table in every schema (kb's own and any other), as text."""
    parts = []
    tables = conn.execute("SELECT schemaname, tablename FROM pg_tables"
                          " WHERE schemaname NOT IN ('pg_catalog', 'information_schema')").fetchall()
    for schema, t in tables:
        for (row,) in conn.execute(f'SELECT t::text FROM "{schema}"."{t}" t'):
            parts.append(row)
    return "\n".join(parts)


def test_no_secret_reaches_any_table_or_the_embedding_api(tmp_path, db_url, conn, monkeypatch):
    fams = planted()
    values = [v for _t, v, _s in fams.values()]
    root = tmp_path / "repo"
    root.mkdir()
    _repo(root, fams)
    cfg = parse_config({"database_url": db_url, "embedder": "voyage", "sources": [
        {"key": "readme", "kind": "readme", "root": str(root), "include": ["README.md"]},
        {"key": "code", "kind": "code", "root": str(root), "include": ["src/*.py"], "max_line_chars": 100_000},
        {"key": "sessions", "kind": "transcript", "root": str(root), "include": ["sessions/*.jsonl"]},
    ]}, path="kb.yaml", base_dir=str(root))
    with MockVoyage(api_key="test-key") as mock:
        cfg.voyage.base_url = mock.base_url
        cfg.voyage.dimension = 256
        embedder = VoyageEmbedder(cfg.voyage, api_key="test-key")
        runs = index_sources(cfg, conn, embedder=embedder, signposter=ExtractiveSignposter())
        sent = "\n".join(mock.inputs())
    assert all(r.documents.new == 1 for r in runs.values()), {k: r.documents for k, r in runs.items()}
    assert all(r.embeddings.missing_after == 0 for r in runs.values())

    dump = _dump_database(conn)
    leaked_db = [v for v in values if v in dump]
    leaked_api = [v for v in values if v in sent]
    assert not leaked_db, f"secrets stored: {leaked_db}"
    assert not leaked_api, f"secrets sent to the embedding API: {leaked_api}"
    assert "[REDACTED:" in dump and "[REDACTED:" in sent

    # the normal content of the same files is indexed and sent
    for phrase in ("How to run the payments service locally.", "def load_mode():",
                   "Rotated the ledger credentials and restarted the workers."):
        assert phrase in dump and phrase in sent, phrase
    counts = {r[0]: r[1] for r in conn.execute(
        "SELECT path, (SELECT sum(v::int) FROM jsonb_each_text(meta->'redactions') AS x(k, v))"
        " FROM documents WHERE status = 'active'")}
    assert all(n and n >= 10 for n in counts.values()), counts
