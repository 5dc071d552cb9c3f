"""The MCP server through the official SDK's own client: over stdio (a `kb mcp` child process) and over
streamable HTTP (uvicorn on a free port, the app mounted at /mcp in a parent Starlette app as kb serve
does). Answers must equal the in-process recall() / show(); bad input is a one-line tool error and the
server keeps serving. Real PostgreSQL, the real local model, a small indexed sample."""
from __future__ import annotations

import json
import socket
import sys
import threading
import time
import uuid
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import quote

import anyio
import pytest

from kb_assets_tests.test_cli_e2e import ADR

QUERIES = ["retry embedding calls on rate limits", "how to restart the workers"]
VOLATILE = ("timings", "token_estimate")       # measured per call


@pytest.fixture(scope="module")
def sample(pg_server_url, tmp_path_factory):
    """A fresh database on the session's PostgreSQL, indexed (real model, extractive signposts) from a
    sample folder; kb.yaml points at it through database_url."""
    import psycopg

    from kb_assets.config import load_config
    from kb_assets.embedding import make_embedder
    from kb_assets.pipeline import index_sources
    from kb_assets.signposts import make_signposter
    from kb_assets.store.db import connect, migrate
    from kb_assets_tests.conftest import _with_db

    name = "mcp_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg_server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = _with_db(pg_server_url, name)
    root = tmp_path_factory.mktemp("mcp_sample")
    (root / "docs" / "adr").mkdir(parents=True)
    (root / "docs" / "adr" / "0003-retry-with-backoff.md").write_text(ADR)
    (root / "docs" / "guide.md").write_text(
        "# Operator guide\n\n## Restarting workers\n\nRestart the celery workers with `make restart-workers` "
        "after changing the queue settings; they drain their current task first.\n\n" + "More detail. " * 20)
    (root / "src").mkdir()
    (root / "src" / "backoff.py").write_text(
        '"""Backoff delays for API retries."""\nimport random\n\n\ndef delay(attempt: int) -> float:\n'
        '    """Full-jitter exponential delay in seconds."""\n    return random.uniform(0, 2 ** attempt)\n')
    config = root / "kb.yaml"
    config.write_text(
        f"data_dir: .kb\ndatabase_url: {json.dumps(url)}\nsources:\n"
        "  - {key: decisions, kind: adr, root: ., include: ['docs/adr/*.md']}\n"
        "  - {key: docs, kind: doc, root: ., include: ['docs/*.md']}\n"
        "  - {key: code, kind: code, root: ., include: ['src/**/*.py']}\n")
    cfg = load_config(config)
    with connect(url, register=False) as conn:
        migrate(conn)
    with connect(url) as conn:
        index_sources(cfg, conn, embedder=make_embedder(cfg), signposter=make_signposter(cfg), projections=True)
    yield cfg, config
    with psycopg.connect(pg_server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _stable(payload: dict) -> dict:
    return {k: v for k, v in payload.items() if k not in VOLATILE}


def _expected(cfg):
    from kb_assets.query import recall, show

    many = recall(QUERIES, config=cfg, limit=5).to_dict()
    one = recall(QUERIES[0], config=cfg).to_dict()
    first_id = many["documents"][0]["id"]
    return many, one, json.loads(json.dumps(show(first_id, config=cfg), default=str))


async def _exercise(session, cfg) -> dict:
    """What every transport must answer identically; returns what it saw for the caller's checks."""
    from mcp.types import TextResourceContents

    init = await session.initialize()
    assert init.server_info.name == "kb" and "focused queries" in (init.instructions or "")
    tools = {t.name: t for t in (await session.list_tools()).tools}
    assert set(tools) == {"recall", "show", "search", "status", "tier", "tags", "related"}
    assert "kb:<" in tools["recall"].description and "2-3" in tools["recall"].description
    assert tools["recall"].annotations.read_only_hint is True
    assert "queries" in tools["recall"].input_schema["required"]

    many, one, doc = _expected(cfg)
    assert many["documents"], "the sample must answer the queries"
    got = await session.call_tool("recall", {"queries": QUERIES, "limit": 5})
    assert not got.is_error, got.content
    got_many = json.loads(got.content[0].text)
    assert _stable(got_many) == _stable(many)
    assert set(got_many) >= {"documents", "code", "truncated", "queries"}

    got = await session.call_tool("show", {"id": many["documents"][0]["id"]})
    assert not got.is_error, got.content
    assert json.loads(got.content[0].text) == doc

    templates = (await session.list_resource_templates()).resource_templates
    assert sorted(t.uri_template for t in templates) == ["kb://recall/{query}", "kb://related/{id}",
                                                          "kb://tier/1/{type}"]
    await _exercise_projections(session, cfg, tools)
    read = await session.read_resource(f"kb://recall/{quote(QUERIES[0], safe='')}")
    content = read.contents[0]
    assert isinstance(content, TextResourceContents) and content.mime_type == "application/json"
    assert _stable(json.loads(content.text)) == _stable(one)

    status = json.loads((await session.call_tool("status", {})).content[0].text)
    assert {s["source"] for s in status["sources"]} == {"decisions", "docs", "code"}
    search = json.loads((await session.call_tool("search", {"query": "Retry-After header", "limit": 3})).content[0].text)
    assert search["chunks"] and search["chunks"][0]["path"] == "docs/adr/0003-retry-with-backoff.md"

    # bad input: one line naming the argument, and the server keeps serving
    bad = {
        "empty": ("recall", {"queries": "   "}, "empty"),
        "kind": ("recall", {"queries": "x", "kind": "novel"}, "unknown kind 'novel'"),
        "nul": ("recall", {"queries": "retry\x00backoff"}, "NUL byte"),
        "date": ("recall", {"queries": "x", "since": "last tuesday"}, "YYYY-MM-DD"),
        "limit": ("recall", {"queries": "x", "limit": 10_000}, "out of range"),
        "id": ("show", {"id": "kb:docs/no-such.md"}, "no document kb:docs/no-such.md"),
        "search": ("search", {"query": "a\x00"}, "NUL byte"),
    }
    for label, (tool, args, needle) in bad.items():
        res = await session.call_tool(tool, args)
        text = res.content[0].text
        assert res.is_error and needle in text and "\n" not in text and "Traceback" not in text, (label, text)
    with pytest.raises(Exception) as excinfo:
        await session.read_resource("kb://recall/" + quote("a\x00b", safe=""))
    assert "Traceback" not in str(excinfo.value)
    again = await session.call_tool("recall", {"queries": QUERIES, "limit": 5})
    assert _stable(json.loads(again.content[0].text)) == _stable(many)
    return {"many": got_many}


async def _exercise_projections(session, cfg, tools) -> None:
    """tier / tags / related and their resources: the text `kb tier` prints, the JSON of `kb tags --json` and
    `kb related --json`; the descriptions carry the T0 → T1 → T2 → T3 order."""
    from mcp.types import TextResourceContents

    from kb_assets.projections.commands import tier_text
    from kb_assets.projections.report import tags_report
    from kb_assets.query.relations import related
    from kb_assets.store.db import connect, open_database

    desc = tools["tier"].description
    assert desc.index("T0") < desc.index("T1") < desc.index("T2") < desc.index("T3")
    assert "show" in desc and "kb:<id>" in desc and "supersed" in tools["related"].description

    adr = "kb:decisions/docs/adr/0003-retry-with-backoff.md"
    t0 = tier_text(cfg, 0)
    assert "0003-retry-with-backoff.md" in t0
    got = json.loads((await session.call_tool("tier", {"tier": 0})).content[0].text)
    assert got == {"tier": 0, "type": None, "chars": len(t0), "truncated": False, "text": t0}
    got = json.loads((await session.call_tool("tier", {"tier": 1})).content[0].text)
    assert got["text"] == tier_text(cfg, 1) and "adr |" in got["text"]
    got = json.loads((await session.call_tool("tier", {"tier": 1, "type": "adr"})).content[0].text)
    assert got["text"] == tier_text(cfg, 1, "adr") and adr in got["text"]
    cut = json.loads((await session.call_tool("tier", {"tier": 0, "max_chars": 1000})).content[0].text)
    assert cut["truncated"] is (len(t0) > 1000) and len(cut["text"]) <= 1000
    with connect(open_database(cfg)) as conn:
        want_tags = tags_report(conn, cfg)
        want_related = related(conn, "decisions", "docs/adr/0003-retry-with-backoff.md", depth=2)
    assert json.loads((await session.call_tool("tags", {})).content[0].text) == want_tags
    got = json.loads((await session.call_tool("related", {"id": adr, "depth": 2})).content[0].text)
    assert got == want_related and got["found"] is True

    read = (await session.read_resource("kb://tier/0")).contents[0]
    assert isinstance(read, TextResourceContents) and read.mime_type == "text/plain" and read.text == t0
    read = (await session.read_resource("kb://tier/1/adr")).contents[0]
    assert read.text == tier_text(cfg, 1, "adr")
    read = (await session.read_resource(f"kb://related/{quote(adr, safe='')}")).contents[0]
    assert json.loads(read.text)["id"] == adr

    bad = {
        "tier2": ({"tier": 2}, "use show"),
        "type": ({"tier": 1, "type": "novel"}, "no T1 file for type 'novel'"),
        "type0": ({"tier": 0, "type": "adr"}, "only tier 1 takes a type"),
        "related": ({"id": "kb:docs/no-such.md"}, "no document kb:docs/no-such.md"),
        "depth": ({"id": adr, "depth": 9}, "out of range"),
    }
    for label, (args, needle) in bad.items():
        res = await session.call_tool("related" if "id" in args else "tier", args)
        text = res.content[0].text
        assert res.is_error and needle in text and "\n" not in text and "Traceback" not in text, (label, text)


def test_stdio_kb_mcp_answers_like_in_process_recall(sample):
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    cfg, config = sample
    params = StdioServerParameters(command=sys.executable, args=["-m", "kb_assets.cli", "mcp", "--config", str(config)],
                                   env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
                                   cwd=str(Path(__file__).resolve().parents[1]))

    async def main():
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                with anyio.fail_after(300):
                    seen = await _exercise(session, cfg)
                    _assert_no_torch_in_kb_mcp()
                    return seen

    anyio.run(main)


def _assert_no_torch_in_kb_mcp() -> None:
    """The `kb mcp` child, after answering every tool: no torch library mapped (the query encoder is
    onnxruntime's; importing torch maps libtorch*.so)."""
    import psutil

    kids = [p for p in psutil.Process().children(recursive=True)
            if "kb_assets.cli" in p.cmdline() and "mcp" in p.cmdline()]
    assert kids, "the kb mcp child process was not found"
    for proc in kids:
        libs = {m.path for m in proc.memory_maps()}
        assert not [lib for lib in libs if "libtorch" in lib or "/torch/" in lib], proc.cmdline()
        assert any("onnxruntime" in lib for lib in libs), "the query encoder should run on onnxruntime"


def test_kb_mcp_with_a_bad_config_is_one_line_and_exit_2(tmp_path):
    import subprocess

    bad = tmp_path / "kb.yaml"
    bad.write_text("data_dir: .kb\nembedder: lokal\n")
    proc = subprocess.run([sys.executable, "-m", "kb_assets.cli", "mcp", "--config", str(bad)], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "embedder" in proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def http_server(sample):
    """uvicorn on a free loopback port; the MCP app mounted at /mcp with its session manager run by the
    parent's lifespan — exactly the recipe in serving/mcp.py's docstring."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Mount, Route

    from kb_assets.serving.mcp import mcp_http_app

    cfg, _ = sample
    mcp_app = mcp_http_app(cfg)

    @asynccontextmanager
    async def lifespan(app):
        async with mcp_app.router.lifespan_context(mcp_app):
            yield

    app = Starlette(routes=[Route("/healthz", lambda request: JSONResponse({"ok": True})),
                            Mount("/mcp", app=mcp_app)], lifespan=lifespan)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=30)
    assert not thread.is_alive()


@pytest.mark.parametrize("path", ["/mcp/", "/mcp"])
def test_streamable_http_answers_like_in_process_recall(sample, http_server, path):
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    cfg, _ = sample

    async def main():
        async with streamable_http_client(http_server + path) as (read, write):
            async with ClientSession(read, write) as session:
                with anyio.fail_after(300):
                    return await _exercise(session, cfg)

    anyio.run(main)


def test_streamable_http_refuses_a_foreign_host_header(http_server):
    """DNS-rebinding protection on loopback: a request naming another Host is refused before any tool runs."""
    import httpx

    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    r = httpx.post(http_server + "/mcp/", json=body, headers={"Host": "evil.example", "Accept":
                   "application/json, text/event-stream"}, timeout=30)
    assert r.status_code in (400, 403, 421) and "recall" not in r.text


def test_show_text_is_bounded_with_a_truncated_flag():
    from kb_assets.serving.tools import bound_show

    doc = {"id": "kb:s/p.md", "path": "p.md", "text": ("line of text\n" * 5000)}
    cut = bound_show(doc, 1000)
    assert cut["truncated"] is True and cut["text_chars"] == len(doc["text"]) and len(cut["text"]) <= 1000
    assert bound_show({**doc, "text": "short"}, 1000) == {**doc, "text": "short"}     # untouched: no flag
