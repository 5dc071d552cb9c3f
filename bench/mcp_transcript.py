"""A real MCP session with `kb mcp`, driven by the official SDK's client over stdio, printed as Markdown
(the transcript in docs/AGENTS.md comes from this script).

    python bench/mcp_transcript.py                      # index the sample ADRs once, then run the session
    python bench/mcp_transcript.py --config kb.yaml --query "..." --query "..."

The sample: the arachne-framework architecture ADRs from the shared corpora (17 decisions), indexed on the
embedded defaults under /tmp/kb-mcp-transcript. Long answers are cut for the page (marked `… [cut for this
page: N more characters]`); the server's own bounds (`truncated`, `max_chars`) are not changed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parents[1]
KB = Path(sys.executable).with_name("kb")
CORPUS = ROOT.parent / "shared" / "corpora" / "adr-arachne-framework+architecture-060a956277a5.tar.gz"
SAMPLE = Path(tempfile.gettempdir()) / "kb-mcp-transcript"
QUERIES = ["how is configuration stored and validated", "why use a database for configuration"]


def sample_config() -> Path:
    config = SAMPLE / "kb.yaml"
    if (SAMPLE / "indexed").exists():
        return config
    SAMPLE.mkdir(parents=True, exist_ok=True)
    with tarfile.open(CORPUS) as tar:
        tar.extractall(SAMPLE / "src", filter="data")
    root = next((SAMPLE / "src").iterdir())
    config.write_text(textwrap.dedent(f"""\
        data_dir: {SAMPLE / '.kb'}
        sources:
          - {{key: decisions, kind: adr, root: {root}, include: ['*.md']}}
        """))
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               DAGSTER_HOME=tempfile.mkdtemp(prefix="kb-transcript-dagster-"))
    subprocess.run([str(KB), "index", "--config", str(config), "--quiet"], env=env, check=True)
    (SAMPLE / "indexed").write_text("ok\n")     # kb index also writes the projections (tier files)
    return config


def _show(payload, limit: int) -> str:
    text = json.dumps(payload, indent=2, ensure_ascii=False)
    if len(text) > limit:
        text = text[:limit] + f"\n… [cut for this page: {len(text) - limit} more characters]"
    return text


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n… [cut for this page: {len(text) - limit} more characters]"


async def session(config: Path, queries: list[str], limit: int) -> list[str]:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    out: list[str] = []
    params = StdioServerParameters(command=str(KB), args=["mcp", "--config", str(config)],
                                   env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})

    def block(title: str, body: str, lang: str = "json") -> None:
        out.append(f"**{title}**\n\n```{lang}\n{body}\n```\n")

    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            t0 = time.perf_counter()
            init = await s.initialize()
            block(f"initialize → server {init.server_info.name!r} ({(time.perf_counter() - t0) * 1000:.0f} ms), "
                  "instructions", init.instructions or "", "text")
            tools = (await s.list_tools()).tools
            block("tools/list", "\n".join(f"{t.name}({', '.join(t.input_schema.get('properties', {}))}): "
                                          f"{t.description.splitlines()[0]}" for t in tools), "text")

            async def call(name: str, args: dict, cut: int = limit):
                t = time.perf_counter()
                res = await s.call_tool(name, args)
                ms = (time.perf_counter() - t) * 1000
                text = res.content[0].text
                body = _show(json.loads(text), cut) if not res.is_error else text
                block(f"tools/call {name} {json.dumps(args, ensure_ascii=False)} → "
                      f"{'ERROR ' if res.is_error else ''}({ms:.0f} ms, {len(text)} characters)", body,
                      "json" if not res.is_error else "text")
                return None if res.is_error else json.loads(text)

            # the order the descriptions teach: T0, T1 for the type, recall, T2 (show) for 1-3 documents, T3
            await call("tier", {"tier": 0}, cut=limit // 2)
            await call("tier", {"tier": 1, "type": "adr"}, cut=limit // 2)
            rec = await call("recall", {"queries": queries, "limit": 3, "code_limit": 0})
            if rec and rec["documents"]:
                await call("show", {"id": rec["documents"][0]["id"], "max_chars": 1500}, cut=limit)
            # T3 for the decision most of the configuration ADRs build on (the sample's most referenced one)
            await call("related", {"id": "kb:decisions/adr-002-configuration.md", "depth": 1}, cut=limit // 2)
            await call("tags", {}, cut=limit // 3)
            t = time.perf_counter()
            res = await s.read_resource("kb://tier/0")
            block(f"resources/read kb://tier/0 ({(time.perf_counter() - t) * 1000:.0f} ms, text/plain)",
                  _cut(res.contents[0].text, limit // 3), "text")
            t = time.perf_counter()
            from urllib.parse import quote

            uri = f"kb://recall/{quote(queries[0], safe='')}"
            res = await s.read_resource(uri)
            body = json.loads(res.contents[0].text)
            block(f"resources/read {uri} ({(time.perf_counter() - t) * 1000:.0f} ms)",
                  _show({k: body[k] for k in ("query", "documents", "truncated")}, limit // 2))
            await call("status", {}, cut=limit // 2)
            await call("recall", {"queries": "", "kind": "adr"})
            await call("recall", {"queries": "configuration", "kind": "decision"})
            await call("tier", {"tier": 2})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path)
    ap.add_argument("--query", action="append", help="repeatable (default: two focused queries)")
    ap.add_argument("--cut", type=int, default=2500, help="characters of each answer printed")
    args = ap.parse_args()
    config = args.config or sample_config()
    print("\n".join(anyio.run(session, config, args.query or QUERIES, args.cut)))


if __name__ == "__main__":
    main()
