"""Invariant 8 end to end: planted secrets of every family, in a transcript, a README and a code file,
appear in no table of the database and in no request that reaches the (mock) Voyage server — while the
normal content of the same files is indexed and searchable.

Also the nine families that once leaked (issue 12 §6) and a token in a file name: after indexing, a dump
of every table (every column of every row, signposts' payload and lexeme_stats included; no 12-character
piece of a secret, no lexeme of one) and the outputs of `kb recall --json`, `kb recall`, `kb search`,
`kb search --json` and `kb show` for every document hold no secret."""
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
from kb_assets_tests.test_sources_secret_plugins import planted_more, token_file_name


def _repo(root: Path, fams: dict, token_name: str) -> None:
    all_text = "\n".join(t for t, _v, _s in fams.values())
    (root / "notes").mkdir()
    (root / token_name).write_text("# Token rotation\n\nRotate the deploy token every quarter and record who did it "
                                   "in the ledger runbook; the old token is revoked at once.\n")
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


def _pieces(value: str, n: int = 12) -> set[str]:
    """Every n-character piece of a secret, lowercased (a partial redaction leaves one behind)."""
    v = value.lower()
    return {v[i:i + n] for i in range(max(1, len(v) - n + 1))}


def _leaks(values: list[str], haystack: str) -> list[str]:
    low = haystack.lower()
    return [v for v in values if any(p in low for p in _pieces(v))]


def _lexeme_leaks(conn, values: list[str]) -> list[tuple[str, str]]:
    """Lexemes of a secret (as the keyword index spells them) found in lexeme_stats or any chunk's tsv."""
    out = []
    for v in values:
        lexemes = [lx for (lx,) in conn.execute("SELECT lexeme FROM unnest(to_tsvector('english', %s))", (v,))
                   if len(lx) >= 8 and any(c.isdigit() for c in lx)]
        for lx in lexemes:
            hit = conn.execute("SELECT EXISTS (SELECT 1 FROM lexeme_stats WHERE lexeme = %s)"
                               " OR EXISTS (SELECT 1 FROM chunks WHERE tsv @@ to_tsquery('simple', quote_literal(%s)))",
                               (lx, lx)).fetchone()[0]
            if hit:
                out.append((v, lx))
    return out


def _cli_outputs(cfg_path: Path, conn, capsys) -> str:
    """What a person or an agent sees: recall (JSON and text), search (JSON and text), show of every document."""
    from kb_assets.cli import main

    outputs = []
    for args in (["recall", "--json", "--passage", "ledger credentials rotate token"],
                 ["recall", "rotate the ledger credentials"], ["search", "--json", "ledger credentials"],
                 ["search", "payments service token"], ["recall", "--json", "--limit", "50", "token rotation"]):
        assert main([args[0], "--config", str(cfg_path), *args[1:]]) == 0, args
        outputs.append(capsys.readouterr().out)
    ids = [f"kb:{k}/{p}" for k, p in conn.execute(
        "SELECT source_key, path FROM documents WHERE status = 'active' ORDER BY 1, 2")]
    for doc_id in ids:
        for extra in ([], ["--json"]):
            assert main(["show", "--config", str(cfg_path), doc_id, *extra]) == 0, doc_id
            outputs.append(capsys.readouterr().out)
    return "\n".join(outputs)


def test_no_secret_reaches_any_table_or_the_embedding_api(tmp_path, db_url, conn, monkeypatch, capsys):
    fams = {**planted(), **planted_more()}
    token_name, name_token = token_file_name()
    values = [v for _t, v, _s in fams.values()] + [name_token]
    root = tmp_path / "repo"
    root.mkdir()
    _repo(root, fams, token_name)
    data = {"database_url": db_url, "embedder": "voyage", "sources": [
        {"key": "readme", "kind": "readme", "root": str(root), "include": ["README.md"]},
        {"key": "code", "kind": "code", "root": str(root), "include": ["src/*.py"], "max_line_chars": 100_000},
        {"key": "sessions", "kind": "transcript", "root": str(root), "include": ["sessions/*.jsonl"]},
        {"key": "notes", "kind": "doc", "root": str(root), "include": ["notes/*.md"], "min_chars": 20},
    ]}
    cfg = parse_config(data, path="kb.yaml", base_dir=str(root))
    with MockVoyage(api_key="test-key") as mock:
        cfg.voyage.base_url = mock.base_url
        cfg.voyage.dimension = 256
        embedder = VoyageEmbedder(cfg.voyage, api_key="test-key")
        runs = index_sources(cfg, conn, embedder=embedder, signposter=ExtractiveSignposter())
        sent = "\n".join(mock.inputs())
        # the CLI, on the same database and (mock) embedding API
        cfg_path = tmp_path / "kb.yaml"
        data["voyage"] = {"base_url": mock.base_url, "dimension": 256}
        cfg_path.write_text(json.dumps(data))
        monkeypatch.setenv("VOYAGE_API_KEY", "test-key")
        shown = _cli_outputs(cfg_path, conn, capsys)
    assert all(r.documents.new == 1 for r in runs.values()), {k: r.documents for k, r in runs.items()}
    assert all(r.embeddings.missing_after == 0 for r in runs.values())

    dump = _dump_database(conn)
    assert conn.execute("SELECT count(*) FROM lexeme_stats").fetchone()[0] > 0
    assert conn.execute("SELECT count(*) FROM signposts").fetchone()[0] >= 4
    leaked_db = _leaks(values, dump)
    leaked_api = _leaks(values, sent)
    leaked_cli = _leaks(values, shown)
    assert not leaked_db, f"secrets stored: {leaked_db}"
    assert not leaked_api, f"secrets sent to the embedding API: {leaked_api}"
    assert not leaked_cli, f"secrets shown by the CLI: {leaked_cli}"
    assert not _lexeme_leaks(conn, values)
    # the file named with a token is indexed under its redacted name, and shown so
    assert "kb:notes/notes/rotation-[REDACTED:github-token].md" in shown
    assert "Rotate the deploy token every quarter" in dump
    for fam in planted_more():
        slug = fams[fam][2]
        assert f"[REDACTED:{slug}]" in dump, fam
    assert "[REDACTED:" in dump and "[REDACTED:" in sent

    # the normal content of the same files is indexed and sent
    for phrase in ("How to run the payments service locally.", "def load_mode():",
                   "Rotated the ledger credentials and restarted the workers."):
        assert phrase in dump and phrase in sent, phrase
    counts = {r[0]: r[1] for r in conn.execute(
        "SELECT path, (SELECT sum(v::int) FROM jsonb_each_text(meta->'redactions') AS x(k, v))"
        " FROM documents WHERE status = 'active'")}
    assert all(n and n >= 10 for p, n in counts.items() if not p.startswith("notes/")), counts
