"""`kb serve` and its MCP endpoint never import torch: the query encoder is the torch-free one (onnxruntime,
numpy as the fallback) with the vectors sentence-transformers gives (test_embedding_numpy.py). Checked in a
fresh process's sys.modules after real requests: HTTP recall, and the official MCP SDK's client calling
recall over streamable HTTP at /mcp (through the server's own query encoder and its cache)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from kb_assets_tests.serve_support import drop_database, fresh_database, seed
from kb_assets_tests.test_serving_e2e import _RealModel

HEAVY = ("torch", "sentence_transformers", "transformers", "sklearn", "scipy", "pandas", "dagster")


def test_kb_serve_and_mcp_answer_without_importing_torch(pg_server_url, tmp_path):
    from kb_assets.store.db import connect

    url = fresh_database(pg_server_url)
    try:
        with connect(url) as conn:
            seed(conn, _RealModel())          # vectors of the local model: the server embeds every query
        cfg = tmp_path / "kb.yaml"
        cfg.write_text("sources: []\n")
        code = textwrap.dedent(f"""
            import json, sys
            import anyio, httpx
            from kb_assets.config import load_config
            from kb_assets.serving.app import build_app, open_state
            from kb_assets_tests.serve_support import ServerThread

            state = open_state(load_config({str(cfg)!r}), database_url={url!r}, no_auth=True)
            srv = ServerThread(build_app(state)).start()
            r = httpx.get(srv.url + "/api/v1/recall", params={{"q": "restart celery workers"}}, timeout=120)
            assert r.status_code == 200, r.text

            async def mcp_calls():
                from mcp import ClientSession
                from mcp.client.streamable_http import streamable_http_client
                async with streamable_http_client(srv.url + "/mcp") as (read, write):
                    async with ClientSession(read, write) as session:
                        await session.initialize()
                        got = await session.call_tool("recall", {{"queries": ["restart celery workers", "retry"]}})
                        assert not got.is_error, got.content
                        return json.loads(got.content[0].text)

            answer = anyio.run(mcp_calls)
            srv.stop()
            heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)
            print(json.dumps({{"heavy": heavy, "runtime": state.embedder.runtime,
                              "cache": [state.embedder.hits, state.embedder.misses],
                              "http_documents": [d["id"] for d in r.json()["documents"]],
                              "mcp_documents": [d["id"] for d in answer["documents"]]}}))
        """)
        repo = str(Path(__file__).resolve().parents[1])     # kb_assets_tests.serve_support's ServerThread
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", KB_DATABASE_URL=url, KB_CONFIG=str(cfg),
                   PYTHONPATH=os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p))
        env.pop("KB_QUERY_RUNTIME", None)
        env.pop("KB_QUERY_ENCODER", None)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600,
                             cwd=str(tmp_path))
        assert out.returncode == 0, out.stderr[-3000:]
        report = json.loads(out.stdout.strip().splitlines()[-1])
        assert report["heavy"] == [], report
        assert report["runtime"] == "onnx"
        # /mcp embeds with the server's own encoder: the query /api/v1 asked first is a cache hit there
        assert report["cache"] == [1, 2], report
        assert set(report["http_documents"][:2]) == {"kb:decisions/adr/0001-celery-restart.md",
                                                     "kb:notes/notes/celery-runbook.md"}, report
        assert "kb:decisions/adr/0001-celery-restart.md" in report["mcp_documents"]
    finally:
        drop_database(pg_server_url, url)
