"""Bad query input (issue 12 §1, §7): every batch line is answered (an error line for a bad one), single
calls fail with one line and exit 2, limits past the maximum and since > until are refused, and a control
character in a file name never splits the text output of recall, show or search."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from kb_assets.config import parse_config
from kb_assets.pipeline import index_sources
from kb_assets.query import QueryError, QueryInputError, recall, render_show, show
from kb_assets.query.batch import run_batch
from kb_assets.signposts.extractive import ExtractiveSignposter

PROSE = ("The ingestion workers take batches from the PostgreSQL queue with skip locked, so no chunk is embedded "
         "twice; the retry delay grows after each failure of the embedding provider.\n")


JITTER = ("Exponential backoff with full jitter spreads the retries of the embedding client; the jitter keeps "
          "thundering herds away from the provider after an outage.\n")
OTHER = ["The release checklist names the owner of each migration and the rollback plan for it.",
         "Dashboards show the latency of the search endpoint per region and the error budget left.",
         "Onboarding starts with the architecture tour, then pairing on a small change in the indexer.",
         "The billing export is a nightly CSV that finance reconciles against the invoices of the month.",
         "Feature flags are removed within two sprints after a full rollout, with the code paths behind them."]


@pytest.fixture(scope="module")
def local_embedder():
    from kb_assets.config import LocalEmbedderSettings
    from kb_assets.embedding.local import LocalEmbedder

    return LocalEmbedder(LocalEmbedderSettings())     # the config's embedder: the CLI calls agree with it


@pytest.fixture
def indexed(tmp_path, db_url, conn, local_embedder):
    root = tmp_path / "notes"
    root.mkdir()
    (root / "queue.md").write_text("# Queue workers\n\n" + PROSE * 2)
    (root / "line\nbreak.md").write_text("# Retry delays\n\n" + JITTER * 2)
    (root / "bin\nary.md").write_bytes(b"\x00\x01binary" * 40)
    for i, topic in enumerate(OTHER):
        (root / f"other-{i}.md").write_text(f"# Other {i}\n\n" + (topic + "\n") * 3)
    data = {"database_url": db_url, "sources": [{"key": "notes", "kind": "doc", "root": str(root)}]}
    cfg = parse_config(data, path=str(tmp_path / "kb.yaml"), base_dir=str(tmp_path))
    emb = local_embedder
    index_sources(cfg, conn, embedder=emb, signposter=ExtractiveSignposter())
    (tmp_path / "kb.yaml").write_text(json.dumps(data))
    return cfg, emb, tmp_path / "kb.yaml"


@pytest.mark.parametrize("bad, words", [(5, "must be a string"), ("skip\x00locked", "NUL"),
                                         ("skip \ud800 locked", "lone surrogate"), ("  ", "empty"),
                                         (["queue", 7], "query 2 must be a string"), ([], "no query")])
def test_bad_queries_are_one_clear_error(indexed, conn, bad, words):
    _cfg, emb, _ = indexed
    with pytest.raises(QueryInputError, match=words) as err:
        recall(bad, conn=conn, embedder=emb)
    assert isinstance(err.value, QueryError) and "\n" not in str(err.value)


def test_limits_and_dates_are_checked(indexed, conn):
    _cfg, emb, _ = indexed
    with pytest.raises(QueryInputError, match="from 0 to 200"):
        recall("queue", conn=conn, embedder=emb, limit=100_000)
    with pytest.raises(QueryInputError, match="from 0 to 200"):
        recall("queue", conn=conn, embedder=emb, code_limit=-1)
    with pytest.raises(QueryInputError, match="later than until"):
        recall("queue", conn=conn, embedder=emb, since="2026-02-01", until="2026-01-01")
    assert recall("queue", conn=conn, embedder=emb, limit=200).documents       # the maximum is honoured


def test_every_batch_line_is_answered(indexed, conn, tmp_path):
    _cfg, emb, _ = indexed
    lines = [json.dumps({"id": "ok1", "query": "skip locked queue"}).encode(),
             json.dumps({"id": "nul", "query": "skip\x00locked"}).encode(),
             b'{"id": "sur", "query": "skip \\ud800 locked"}',
             json.dumps({"id": "num", "query": 5}).encode(),
             b"not json at all",
             b'{"id": "latin1", "query": "caf\xe9"}',
             json.dumps(["a", "list"]).encode(),
             json.dumps({"id": "empty", "query": ""}).encode(),
             json.dumps({"id": "ok2", "query": "retry delay"}).encode()]
    path = tmp_path / "q.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    out = io.StringIO()
    errors = run_batch(str(path), recall, {"conn": conn, "embedder": emb}, as_json=True, out=out)
    answers = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [a.get("id") for a in answers] == ["ok1", "nul", "sur", "num", None, None, None, "empty", "ok2"]
    assert errors == 7 and all("error" in a for a in answers[1:8])
    assert "NUL" in answers[1]["error"] and "surrogate" in answers[2]["error"]
    assert "must be a string" in answers[3]["error"] and "not UTF-8" in answers[5]["error"]
    assert answers[0]["documents"] and answers[8]["documents"]
    # text mode: the same lines, one answer each
    out = io.StringIO()
    run_batch(str(path), recall, {"conn": conn, "embedder": emb}, as_json=False, out=out)
    assert out.getvalue().count("\n# ") + 1 == 9 and out.getvalue().count("error: ") == 7


def test_a_newline_in_a_file_name_does_not_split_the_text_output(indexed, conn):
    _cfg, emb, _ = indexed
    result = recall("exponential backoff jitter", conn=conn, embedder=emb, limit=5, mode="keyword")
    ids = [r.id for r in result.documents]
    assert "kb:notes/line\nbreak.md" in ids          # the JSON keeps the real name
    text = result.render_text()
    assert "kb:notes/line\\nbreak.md" in text and not any(ln.startswith("break.md") for ln in text.splitlines())
    doc = show("kb:notes/line\nbreak.md", conn=conn)
    first = render_show(doc).splitlines()[:3]
    assert first[0].startswith("kb:notes/line\\nbreak.md") and first[2].endswith("line\\nbreak.md"), first


def test_cli_single_bad_input_exits_2_with_one_line(indexed, capsys):
    from kb_assets.cli import main

    _cfg, _emb, cfg_path = indexed
    cases = [["search", ""], ["search", "queue", "--limit", "-1"], ["search", "queue", "--limit", "100000"],
             ["recall", "queue", "--limit", "100000"], ["recall", "queue", "--since", "2026-02-01",
                                                         "--until", "2026-01-01"],
             ["recall", "queue", "--since", "yesterday"], ["recall", "caf\udce9"]]
    for args in cases:
        code = main([args[0], "--config", str(cfg_path), *args[1:]])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and err.startswith(f"kb {args[0]}: "), (args, code, err)
    main(["search", "--config", str(cfg_path), "exponential backoff jitter", "--limit", "5"])
    out = capsys.readouterr().out
    assert "notes:line\\nbreak.md:" in out and not any(ln.startswith("break.md") for ln in out.splitlines())
    main(["status", "--config", str(cfg_path)])
    out = capsys.readouterr().out
    assert "    bin\\nary.md  binary:" in out and not any(ln.startswith("ary.md") for ln in out.splitlines())
