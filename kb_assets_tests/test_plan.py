"""`kb plan`: files, chunks, tokens and dollars per source before anything is spent; what is already paid
for is not counted again."""
from __future__ import annotations

import json

from kb_assets.cli import main
from kb_assets.config import parse_config
from kb_assets.plan import plan

ADR = ("# 4. Use Gemini for signposts\n\n## Status\n\nAccepted\n\n## Context\n\n" + "We need summaries. " * 40 +
       "\n\n## Decision\n\nWe will use Gemini in JSON mode because it validates against a schema.\n")


def _cfg(tmp_path, db_url, **top):
    (tmp_path / "adr").mkdir(exist_ok=True)
    (tmp_path / "adr" / "0004-gemini.md").write_text(ADR)
    return parse_config({"database_url": db_url, **top,
                         "sources": [{"key": "adr", "kind": "adr", "root": str(tmp_path), "include": ["adr/*.md"]}]},
                        path=str(tmp_path / "kb.yaml"), base_dir=str(tmp_path))


def test_plan_prices_voyage_and_gemini_without_calling_them(tmp_path, db_url, monkeypatch):
    monkeypatch.setenv("VOYAGE_API_KEY", "unused")
    monkeypatch.setenv("GEMINI_API_KEY", "unused")
    cfg = _cfg(tmp_path, db_url, embedder="voyage", signposter="gemini",
               voyage={"base_url": "http://127.0.0.1:9/none", "price_per_million_tokens": 1000.0})
    report = plan(cfg)
    row = report["sources"][0]
    assert row["files"] == 1 and row["documents"] == 1 and row["chunks"] >= 1
    assert row["chunks_to_embed"] == row["chunks"] and row["embedding_tokens"] > 100
    assert row["documents_to_signpost"] == 1 and row["signpost_input_tokens"] > 100
    assert row["signpost_output_tokens"] > 0
    assert report["total_usd"] > 0.1 and row["estimated_usd"] == report["total_usd"]


def test_plan_counts_only_unpaid_work(tmp_path, db_url, conn):
    from kb_assets.embedding import make_embedder
    from kb_assets.pipeline import index_sources
    from kb_assets.signposts import make_signposter

    cfg = _cfg(tmp_path, db_url)
    index_sources(cfg, conn, embedder=make_embedder(cfg), signposter=make_signposter(cfg))
    row = plan(cfg)["sources"][0]
    assert row["chunks"] >= 1 and row["chunks_to_embed"] == 0 and row["documents_to_signpost"] == 0
    assert row["estimated_usd"] == 0


def test_kb_plan_json(tmp_path, db_url, capsys):
    cfg = _cfg(tmp_path, db_url)
    (tmp_path / "kb.yaml").write_text(json.dumps({"database_url": db_url, "sources": [
        {"key": "adr", "kind": "adr", "root": ".", "include": ["adr/*.md"]}]}))
    assert main(["plan", "--config", str(tmp_path / "kb.yaml"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sources"][0]["source"] == "adr" and out["total_usd"] == 0
    assert cfg.embedder == "local"
