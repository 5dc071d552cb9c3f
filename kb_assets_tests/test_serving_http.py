"""kb serve over real HTTP: a uvicorn server on a free port, httpx as the client, the real PostgreSQL.

The embedder is the deterministic toy (the API's behaviour does not depend on the model; test_serving_e2e runs
the real model through `kb serve` as a separate process)."""
from __future__ import annotations

import json
import logging
import subprocess
import time

import httpx
import pytest

from kb_assets.config import KbConfig
from kb_assets.serving.tokens import create_token, revoke_token
from kb_assets_tests.serve_support import MALICIOUS_TITLE, drop_database, fresh_database, running_server, seed
from kb_assets_tests.test_query_support import ToyEmbedder

ROUTES = ["/api/v1/knowledge/search?q=celery", "/api/v1/recall?q=celery", "/api/v1/status",
          "/api/v1/documents/kb:decisions/adr/0001-celery-restart.md", "/openapi.json"]


@pytest.fixture(scope="module")
def served(pg_server_url):
    from kb_assets.store.db import connect

    url = fresh_database(pg_server_url)
    conn = connect(url)
    seed(conn)
    with running_server(KbConfig(), url, ToyEmbedder()) as (srv, state):
        yield srv, state, conn, url
    conn.close()
    drop_database(pg_server_url, url)


@pytest.fixture(scope="module")
def tokens(served):
    _, _, conn, _ = served
    good = create_token(conn, "good", rate="1000/min")["token"]
    revoked = create_token(conn, "gone", rate="1000/min")["token"]
    revoke_token(conn, "gone")
    expired = create_token(conn, "old", rate="1000/min", expires="1d")["token"]
    conn.execute("UPDATE api_tokens SET expires_at = now() - interval '1 second' WHERE name = 'old'")
    return {"good": good, "revoked": revoked, "expired": expired}


def get(srv, path, token=None, **kw):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(srv.url + path, headers=headers, timeout=30, **kw)


def test_healthz_needs_no_token(served):
    srv = served[0]
    r = get(srv, "/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


@pytest.mark.parametrize("path", ROUTES)
def test_every_route_refuses_bad_tokens_and_serves_a_good_one(served, tokens, path):
    srv = served[0]
    for label, tok in [("none", None), ("wrong", "kb_" + "x" * 43), ("garbage", "not-a-token"),
                       ("revoked", tokens["revoked"]), ("expired", tokens["expired"])]:
        r = get(srv, path, tok)
        assert r.status_code == 401, (label, r.status_code, r.text[:200])
        assert set(r.json()) == {"error"}, label                     # nothing of the index is returned
        assert r.headers["www-authenticate"].startswith("Bearer")
    r = get(srv, path, tokens["good"])
    assert r.status_code == 200, r.text[:300]
    assert r.headers["content-type"].startswith("application/json")


def test_knowledge_page_refuses_without_cookie(served, tokens):
    srv = served[0]
    r = httpx.get(srv.url + "/knowledge?q=celery")
    assert r.status_code == 401 and "sign in" in r.text.lower() and "Restart celery" not in r.text
    r = httpx.get(srv.url + "/knowledge?q=celery", cookies={"kb_token": tokens["revoked"]})
    assert r.status_code == 401 and "Restart celery" not in r.text


def test_recall_is_the_json_of_kb_recall(served, tokens):
    from kb_assets.query import recall

    srv, state, conn, _ = served
    r = get(srv, "/api/v1/recall", tokens["good"], params=[("q", "celery restart"), ("q", "retry backoff"),
                                                           ("limit", "3"), ("filter[kind]", "adr")])
    assert r.status_code == 200
    body = r.json()
    local = json.loads(json.dumps(recall(["celery restart", "retry backoff"], config=KbConfig(), conn=conn,
                                         embedder=ToyEmbedder(), limit=3, kind=["adr"]).to_dict(), default=str))
    for d in (body, local):
        d.pop("timings"), d.pop("token_estimate")
    assert body == local and body["documents"]
    assert all(d["kind"] == "adr" for d in body["documents"])
    text = get(srv, "/api/v1/recall?q=celery+restart&format=text", tokens["good"]).json()["text"]
    assert text.startswith("recall 'celery restart'") and "kb:decisions/adr/0001-celery-restart.md" in text


def test_search_shape_citation_link_snippet(served, tokens):
    srv = served[0]
    r = get(srv, "/api/v1/knowledge/search", tokens["good"], params={"q": "restart celery workers", "top_k": 3})
    body = r.json()
    assert r.status_code == 200 and 0 < len(body["results"]) <= 3
    first = body["results"][0]
    assert set(first) >= {"score", "source_url", "citation", "snippet", "id", "title", "kind", "source", "path",
                          "stale"}
    assert first["citation"] == first["id"] and first["id"].startswith("kb:")
    assert first["snippet"]
    assert [s["key"] for s in body["index"]["sources"]] == ["code", "decisions", "notes"]
    assert {s["key"]: s["documents"] for s in body["index"]["sources"]}["notes"] == 5
    kinds = {x["kind"] for x in get(srv, "/api/v1/knowledge/search", tokens["good"],
                                    params={"q": "celery", "filter[kind]": "code"}).json()["results"]}
    assert kinds == {"code"}


def test_document_and_status(served, tokens):
    srv = served[0]
    doc = get(srv, "/api/v1/documents/kb:decisions/adr/0001-celery-restart.md", tokens["good"]).json()
    assert doc["title"] == "Restart celery workers nightly" and "graceful warm shutdown" in doc["text"]
    # the id percent-encoded, as a client library would send it
    doc2 = get(srv, "/api/v1/documents/kb%3Adecisions%2Fadr%2F0001-celery-restart.md", tokens["good"])
    assert doc2.status_code == 200 and doc2.json()["id"] == doc["id"]
    status = get(srv, "/api/v1/status", tokens["good"]).json()
    assert {s["source"] for s in status["sources"]} == {"code", "decisions", "notes"}


@pytest.mark.parametrize("path,param", [
    ("/api/v1/knowledge/search?q=x&filter[colour]=red", "filter[colour]"),
    ("/api/v1/knowledge/search?q=x&filter[date_range]=2024-13-01:2024-12-01", "filter[date_range]"),
    ("/api/v1/knowledge/search?q=x&filter[date_range]=2025-01-01:2024-01-01", "filter[date_range]"),
    ("/api/v1/knowledge/search?q=x&filter[date_range]=yesterday", "filter[date_range]"),
    ("/api/v1/knowledge/search?q=", "q"),
    ("/api/v1/knowledge/search?q=%20%20", "q"),
    ("/api/v1/knowledge/search", "q"),
    ("/api/v1/knowledge/search?q=x&top_k=0", "top_k"),
    ("/api/v1/knowledge/search?q=x&top_k=101", "top_k"),
    ("/api/v1/knowledge/search?q=x&top_k=ten", "top_k"),
    ("/api/v1/knowledge/search?q=x&filter[kind]=poem", "filter[kind]"),
    ("/api/v1/knowledge/search?q=a%00b", "q"),
    ("/api/v1/recall?q=x&limit=-1", "limit"),
    ("/api/v1/recall?q=x&q=", "q"),
    ("/api/v1/recall?q=x&format=xml", "format"),
    ("/api/v1/knowledge/search?q=x&topk=5", "topk"),
    ("/api/v1/recall?q=x&top_k=5", "top_k"),
])
def test_bad_input_is_400_naming_the_parameter(served, tokens, path, param):
    r = get(served[0], path, tokens["good"])
    assert r.status_code == 400, (path, r.status_code, r.text)
    msg = r.json()["error"]
    assert msg.startswith(param) and "\n" not in msg and "Traceback" not in msg, msg


def test_unknown_or_malformed_document_is_404(served, tokens):
    r = get(served[0], "/api/v1/documents/kb:decisions/adr/9999-nothing.md", tokens["good"])
    assert r.status_code == 404 and "no document kb:decisions/adr/9999-nothing.md" in r.json()["error"]
    r = get(served[0], "/api/v1/documents/not-an-id", tokens["good"])
    assert r.status_code == 404 and r.json()["error"].startswith("doc_id: not a kb id")


def test_rate_limit_429_with_retry_after_then_served_again(served):
    srv, _, conn, _ = served
    tok = create_token(conn, "slow", rate="4/min")["token"]       # bucket of 4, one more every 15 s
    codes = [get(srv, "/api/v1/status", tok).status_code for _ in range(5)]
    assert codes[:4] == [200] * 4 and codes[4] == 429, codes
    r = get(srv, "/api/v1/status", tok)
    assert r.status_code == 429 and "rate limit" in r.json()["error"]
    wait = int(r.headers["retry-after"])
    assert 1 <= wait <= 15
    time.sleep(wait + 0.2)
    assert get(srv, "/api/v1/status", tok).status_code == 200


def test_rate_limit_holds_across_two_server_processes(served, pg_server_url):
    """Two apps (as two workers would be) on one database share one bucket per token."""
    srv, _, conn, url = served
    tok = create_token(conn, "shared", rate="6/min")["token"]     # 6 at once, then one per 10 s
    with running_server(KbConfig(), url, ToyEmbedder()) as (srv2, _):
        codes = [get(s, "/api/v1/status", tok).status_code for _ in range(6) for s in (srv, srv2)]
    ok = codes.count(200)
    assert 6 <= ok <= 7 and codes.count(429) == len(codes) - ok, codes


def test_access_log_has_no_token_and_no_query_text(served, tokens, caplog):
    srv = served[0]
    with caplog.at_level(logging.INFO, logger="kb.serve.access"):
        get(srv, "/api/v1/recall?q=supersecretquestion", tokens["good"])
        get(srv, "/api/v1/status", "kb_wrongtoken")
        time.sleep(0.2)
    lines = [r.getMessage() for r in caplog.records if r.name == "kb.serve.access"]
    assert lines, "no access log lines"
    entries = [json.loads(x) for x in lines]
    assert {"path": "/api/v1/recall", "status": 200, "token": "good"}.items() <= entries[-2].items()
    assert entries[-1]["status"] == 401
    blob = "\n".join(lines)
    assert tokens["good"] not in blob and "kb_wrongtoken" not in blob and "supersecretquestion" not in blob


def test_login_cookie_flags_and_escaped_page(served, tokens):
    srv = served[0]
    with httpx.Client(base_url=srv.url) as c:
        bad = c.post("/knowledge/login", data={"token": tokens["revoked"]})
        assert bad.status_code == 401 and "set-cookie" not in bad.headers
        r = c.post("/knowledge/login", data={"token": tokens["good"], "next": "https://evil.example/"})
        assert r.status_code == 303 and r.headers["location"] == "/knowledge"      # no open redirect
        cookie = r.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/knowledge" in cookie
        page = c.get("/knowledge", params={"q": "retry policy backoff"})
        assert page.status_code == 200
        assert "<script>" not in page.text and "onerror=alert" not in page.text.replace("onerror=alert(1)&gt;", "")
        assert "&lt;script&gt;" in page.text and "&lt;b&gt;bold&lt;/b&gt;" in page.text
        csp = page.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src" not in csp
        doc = c.get("/knowledge/doc", params={"id": "kb:decisions/adr/0002-retry-backoff.md"})
        assert doc.status_code == 200 and "&lt;script&gt;" in doc.text and MALICIOUS_TITLE not in doc.text
        c.post("/knowledge/logout")
        assert c.get("/knowledge").status_code == 401


def test_source_url_links_the_commit_on_the_web_host_without_credentials(tmp_path):
    from kb_assets.serving.views import source_url, web_base

    assert web_base("git@github.com:acme/kb.git") == "https://github.com/acme/kb"
    assert web_base("https://x-access-token:ghp_secret@github.com/acme/kb.git") == "https://github.com/acme/kb"
    assert web_base("ssh://git@gitlab.example.com:2222/team/kb") == "https://gitlab.example.com/team/kb"
    assert web_base("/srv/git/kb.git") is None
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "remote", "add", "origin", "https://u:tok@github.com/acme/kb.git"], cwd=repo, check=True)
    sha = "a" * 40
    assert source_url(str(repo / "docs"), "adr/1.md", sha, 7) == f"https://github.com/acme/kb/blob/{sha}/docs/adr/1.md#L7"
    plain = tmp_path / "plain"
    plain.mkdir()
    assert source_url(str(plain), "notes/a b.md#Heading", None) == (plain / "notes" / "a b.md").as_uri()


def test_no_auth_is_refused_off_loopback(capsys):
    from kb_assets.cli import main

    assert main(["serve", "--no-auth", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "--no-auth" in err and "loopback" in err and len(err.strip().splitlines()) == 1


def test_token_verbs_store_only_a_hash(served, capsys, monkeypatch, tmp_path):
    from kb_assets.cli import main

    _, _, conn, url = served
    monkeypatch.setenv("KB_DATABASE_URL", url)
    cfg = tmp_path / "kb.yaml"
    cfg.write_text("sources: []\n")
    assert main(["token", "create", "ci-bot", "--rate", "30/min", "--expires", "90d", "--config", str(cfg)]) == 0
    token = capsys.readouterr().out.strip()
    assert token.startswith("kb_") and len(token) > 40
    rows = conn.execute("SELECT row_to_json(t)::text FROM api_tokens t").fetchall()
    assert rows and not any(token in r[0] or token[3:] in r[0] for r in rows)
    assert main(["token", "list", "--json", "--config", str(cfg)]) == 0
    listed = capsys.readouterr().out
    assert token not in listed and token[10:] not in listed
    me = [t for t in json.loads(listed) if t["name"] == "ci-bot"][0]
    assert me["rate"] == "30/min" and me["state"] == "active" and me["expires_at"]
    assert main(["token", "create", "ci-bot", "--config", str(cfg)]) == 1     # the name is taken
    assert "exists" in capsys.readouterr().err
    assert main(["token", "revoke", "ci-bot", "--config", str(cfg)]) == 0
    assert main(["token", "revoke", "ci-bot", "--config", str(cfg)]) == 1
    assert main(["token", "create", "x", "--rate", "lots", "--config", str(cfg)]) == 1
    assert "60/min" in capsys.readouterr().err


def test_optional_mounts_mcp_behind_bearer_and_webhooks_without(served, tokens, monkeypatch):
    """The merge points: kb_assets.serving.mcp (branch mcp) and kb_assets.serving.webhooks (branch ops),
    stood in for by small modules with the agreed shapes."""
    import sys
    import types

    from starlette.responses import JSONResponse as SJSON
    from starlette.routing import Route

    async def mcp_asgi(scope, receive, send):
        await SJSON({"mcp": True, "path": scope["path"]})(scope, receive, send)

    async def hook(request):
        return SJSON({"hook": "ok"})

    mcp_mod = types.ModuleType("kb_assets.serving.mcp")
    mcp_mod.build_mcp_asgi = lambda cfg: mcp_asgi
    hooks_mod = types.ModuleType("kb_assets.serving.webhooks")
    hooks_mod.routes = [Route("/hooks/git", hook, methods=["POST"])]
    monkeypatch.setitem(sys.modules, "kb_assets.serving.mcp", mcp_mod)
    monkeypatch.setitem(sys.modules, "kb_assets.serving.webhooks", hooks_mod)
    with running_server(KbConfig(), served[3], ToyEmbedder()) as (srv, _):
        assert httpx.post(srv.url + "/mcp", json={}).status_code == 401
        assert httpx.post(srv.url + "/mcp", json={}, headers={"Authorization": "Bearer " + tokens["revoked"]}
                          ).status_code == 401
        r = httpx.post(srv.url + "/mcp", json={}, headers={"Authorization": "Bearer " + tokens["good"]})
        assert r.status_code == 200 and r.json() == {"mcp": True, "path": "/mcp"}
        assert httpx.post(srv.url + "/hooks/git", json={}).json() == {"hook": "ok"}   # its own auth, not ours


def test_real_mcp_sdk_server_mounted_at_mcp_behind_bearer(served, tokens):
    """kb's own MCP server (kb_assets.serving.mcp, the official SDK) is served at /mcp by kb serve: the SDK's
    streamable-HTTP client lists its tools with a token, and is refused without one."""
    import asyncio

    from mcp import ClientSession
    from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

    async def session_run(url, token):
        async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http:
            async with streamable_http_client(url, http_client=http) as streams:
                async with ClientSession(streams[0], streams[1]) as session:
                    await session.initialize()
                    tools = await session.list_tools()
                    return sorted(t.name for t in tools.tools)

    with running_server(KbConfig(), served[3], ToyEmbedder()) as (srv, _):
        assert httpx.post(srv.url + "/mcp", json={}).status_code == 401
        names = asyncio.run(session_run(srv.url + "/mcp", tokens["good"]))
    assert names == ["recall", "related", "search", "show", "status", "tags", "tier"]


def test_projection_routes_answer_like_kb_tier_tags_related(served, tokens, tmp_path):
    """/api/v1/tier/{0,1,3}, /tags and /related/{id}: the text `kb tier` prints, the JSON of `kb tags --json`
    and `kb related --json`; no projection yet, an unknown type or document → 404 saying what to do."""
    from kb_assets.pipeline.projections import build_projections
    from kb_assets.projections.commands import tier_text
    from kb_assets.projections.report import tags_report
    from kb_assets.query.relations import related

    _, _, conn, url = served
    cfg = KbConfig(data_dir=str(tmp_path / "kb"))
    with running_server(cfg, url, ToyEmbedder()) as (srv, _):
        none = get(srv, "/api/v1/tier/0", tokens["good"])
        assert none.status_code == 404 and "run `kb index`" in none.json()["error"]
        build_projections(conn, cfg)
        for path, args in (("/api/v1/tier/0", (0,)), ("/api/v1/tier/1", (1,)), ("/api/v1/tier/1?type=adr", (1, "adr")),
                           ("/api/v1/tier/3", (3,))):
            r = get(srv, path, tokens["good"])
            assert r.status_code == 200, (path, r.text)
            want = tier_text(cfg, *args)
            assert r.json()["text"] == want and r.json()["truncated"] is False and r.json()["chars"] == len(want)
        assert "kb:decisions/adr/0001-celery-restart.md" in get(srv, "/api/v1/tier/1?type=adr", tokens["good"]).text
        cut = get(srv, "/api/v1/tier/0?max_chars=1000", tokens["good"]).json()
        assert len(cut["text"]) <= 1000 and cut["truncated"] is (cut["chars"] > 1000)
        assert get(srv, "/api/v1/tags", tokens["good"]).json() == json.loads(json.dumps(tags_report(conn, cfg)))
        doc = "kb:decisions/adr/0001-celery-restart.md"
        r = get(srv, f"/api/v1/related/{doc}?depth=2", tokens["good"])
        assert r.status_code == 200 and r.json() == related(conn, "decisions", "adr/0001-celery-restart.md", depth=2)
        for path, status, needle in (
                ("/api/v1/tier/2", 400, "tier 2 is one document"),
                ("/api/v1/tier/7", 400, "use 0 (the index)"),
                ("/api/v1/tier/1?type=novel", 404, "no T1 file for type 'novel'"),
                ("/api/v1/tier/1?type=../x", 400, "type:"),
                ("/api/v1/tier/0?type=adr", 400, "only tier 1 takes a type"),
                ("/api/v1/tier/0?typo=adr", 400, "typo: unknown parameter"),
                ("/api/v1/related/kb:decisions/adr/nope.md", 404, "no document kb:decisions/adr/nope.md"),
                ("/api/v1/related/nonsense", 404, "not a kb id"),
                (f"/api/v1/related/{doc}?depth=9", 400, "depth")):
            r = get(srv, path, tokens["good"])
            assert r.status_code == status and needle in r.json()["error"], (path, r.status_code, r.text)
        for path in ("/api/v1/tier/0", "/api/v1/tags", f"/api/v1/related/{doc}"):
            assert get(srv, path).status_code == 401


def test_query_vector_cache_is_bounded_and_gives_the_same_numbers():
    """kb serve's LRU of query vectors: a repeated query costs no forward pass and returns exactly the
    vector the encoder gave; the oldest entries go first once the bound is reached."""
    from kb_assets.serving.app import QueryEmbedder

    class Counting:
        model, dimension = "toy", 3

        def __init__(self):
            self.calls = []

        def embed_query(self, text):
            self.calls.append(text)
            return [0.1 * len(text), 1 / 3, -2.5] if text != "f32" else [0.5, 0.25, -1.0]

    inner = Counting()
    emb = QueryEmbedder(inner, cache_size=2)
    first = emb.embed_query("alpha")
    assert emb.embed_query("alpha") == first == inner.embed_query("alpha") and inner.calls == ["alpha", "alpha"]
    assert emb.embed_query("f32") == [0.5, 0.25, -1.0] and emb.embed_query("f32") == [0.5, 0.25, -1.0]
    emb.embed_query("gamma")                        # evicts "alpha", the least recently used
    emb.embed_query("alpha")
    assert inner.calls == ["alpha", "alpha", "f32", "gamma", "alpha"] and (emb.hits, emb.misses) == (2, 4)
    off = QueryEmbedder(Counting(), cache_size=0)
    off.embed_query("x")
    off.embed_query("x")
    assert off._inner.calls == ["x", "x"]
