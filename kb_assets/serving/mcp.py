"""kb as an MCP server (official `mcp` SDK, 2.x): tools `recall`, `show`, `search`, `status`, the projections'
`tier`, `tags`, `related`; resources `kb://recall/{query}`, `kb://tier/0`, `kb://tier/1/{type}`,
`kb://related/{id}`; over stdio (`kb mcp`) or streamable HTTP (`mcp_http_app()`).

    claude mcp add kb -- /path/to/.venv/bin/kb mcp [--config /path/to/kb.yaml]

Every answer is the JSON the CLI prints with `--json` (serving/tools.py builds it for both), sent as one
text block; outputs are bounded (caller-set limits within hard caps, a `truncated` flag). Bad input
(empty query, unknown kind, NUL byte, bad date, unknown id) is a tool error with a one-line message; the
server keeps serving.

Mounting the streamable HTTP app in `kb serve` (Starlette):

    from contextlib import asynccontextmanager
    from starlette.applications import Starlette
    from starlette.routing import Mount
    from kb_assets.serving.mcp import mcp_http_app

    mcp_app = mcp_http_app(cfg)                 # the MCP endpoint is the mount's root ("/mcp" and "/mcp/")

    @asynccontextmanager
    async def lifespan(app):
        async with mcp_app.router.lifespan_context(mcp_app):   # runs the SDK's session manager
            ... your own start-up ...
            yield

    app = Starlette(routes=[..., Mount("/mcp", app=mcp_app)], lifespan=lifespan)

- Starlette does not run a mounted app's lifespan: the parent's lifespan must enter
  `mcp_app.router.lifespan_context(mcp_app)` (equivalently `mcp_app.state.kb_mcp.session_manager.run()`),
  once per app instance — else every request fails with "Task group is not initialized".
  Build one `mcp_http_app()` per server process (the session manager cannot be restarted).
- Authentication is the mounting app's job: wrap the mount (or the whole app) in the same bearer-token
  middleware as /api/v1; `mcp_http_app` itself checks no token.
- DNS-rebinding protection (Host / Origin allow-list) is on for loopback hosts; pass `host=` the address
  kb serve binds, or `allowed_hosts=` for a reverse proxy name.
- `stateless=True` (default) keeps no per-client session in memory: any worker can answer any request, and
  a restarted server needs no re-initialisation from clients.
"""
from __future__ import annotations

import json
import logging
from typing import Annotated, Any

from pydantic import Field

from kb_assets.serving import tools

log = logging.getLogger(__name__)

SERVER_NAME = "kb"
INSTRUCTIONS = """\
kb is this team's knowledge index: decisions (ADRs) with their rationale, design and planning docs, agent \
session transcripts, READMEs, AGENTS.md/CLAUDE.md sections, work items and the source tree. Ask it before \
proposing a design, changing a subsystem, or redoing work: it answers with signposts (summary, decisions, \
files, freshness), not whole documents.
How to use it well:
1. Starting a task: read `tier` 0 (T0, one line per entry) once to learn what exists; then `tier` 1 with the type you need (T1: that type's entries with "use when").
2. For a question: decompose a broad topic into 2-5 focused queries and pass them together to `recall` (one call). Read the signposts.
3. Open with `show` (T2) only the 2-3 documents worth reading in full; `related` (T3) for what a decision supersedes, amends or touches.
4. Cite what you rely on by its id, e.g. kb:decisions/docs/adr/0003-retry.md.
5. A record marked stale changed after indexing: check the file itself."""

TIER_DESCRIPTION = """The index rendered ahead of time (projections), cheapest first: read T0 before searching, T1 once the type is known, then T2 (`show`) only for documents to cite, T3 on demand.
tier 0: every entry, one line each (`id | type | title | path | status`, grouped by folder: a `## kb:<prefix>` line starts a folder, ids below it are relative to it). tier 1 without a type: the types and their sizes; tier 1 with a type (adr, doc, session, …, or code for the repository map): one line per entry, `id | title | status | use when`; a superseded entry names its successor (read that instead). tier 3: the relations graph (`from | kind | to`). Text cut at max_chars (default 60000) with `truncated: true`. Same text as `kb tier`; cite entries as kb:<id>."""

TAGS_DESCRIPTION = """Tags in use with their document counts and by-tag files (`kb tier`'s T1 by tag), vocabulary tags no document uses, and tags outside the kb.yaml vocabulary. Use it to pick a tag filter for `recall`. Same JSON as `kb tags --json`."""

RELATED_DESCRIPTION = """T3 for one document: its relations (supersedes, superseded_by, amends, amended_by, references, touches) in both directions, up to `depth` hops (1-3). Use it before relying on a decision: a superseded one names its successor; `touches` edges name the code files a decision affects. Unresolved targets have `resolved: false`. Same JSON as `kb related --json`."""

TIER_RESOURCE_DESCRIPTION = """T0, the one-line-per-entry index (`kb tier 0`): read it first, then kb://tier/1/{type}."""
TIER1_RESOURCE_DESCRIPTION = """T1 for one type (`kb tier 1 <type>`): `id | title | status | use when`; `code` gives the repository map."""
RELATED_RESOURCE_DESCRIPTION = """T3 for one document (`kb related <id>`), the id percent-encoded: kb://related/kb%3Adecisions%2Fdocs%2Fadr%2F0003-retry.md"""

RECALL_DESCRIPTION = """\
Ranked signposts for one or several focused queries: a `documents` section (ADRs, docs, sessions, \
transcripts, work items…) and a separate `code` section. Each record has an id (`kb:<source>/<path>`), \
title, kind, score, status, dates, a budgeted signpost (summary, key decisions with rationale, files), \
freshness (`stale`, `indexed_commit`), and which queries matched it. Output is bounded (`truncated` says \
when a record was cut; `token_estimate` is its size).
Guidance: split a broad topic into focused queries (e.g. ["why celery was dropped", "worker restart \
procedure"]) instead of one long question; cite results as kb:<id>; then call `show` for the 2-3 \
documents worth opening — not all of them. Same JSON as `kb recall --json`."""

SHOW_DESCRIPTION = """\
The whole document behind a kb id from `recall`/`search` (e.g. "kb:decisions/docs/adr/0003-retry.md"): \
title, kind, status, dates, signpost, chunk outline (headings and line ranges), freshness and the text. \
`text` is cut at `max_chars` (default 20000) with `truncated: true` and `text_chars` when longer. Open only \
the 2-3 documents worth reading. Same JSON as `kb show --json`."""

SEARCH_DESCRIPTION = """\
Plain hybrid (vector + keyword) search over chunks, unbudgeted by document: shows which passages the \
index holds (source, path, heading, line range, text cut to 1200 characters). Prefer `recall` to answer a \
question; use `search` to find an exact passage. Same JSON as `kb search --json`."""

STATUS_DESCRIPTION = """\
Per indexed source: documents, chunks, embedded, signposted, skipped (with reasons and up to 20 files), \
indexed commit vs HEAD (`fresh`), last run; plus configured sources never indexed. Use it to judge how far \
to trust an answer (a source behind HEAD may miss recent work). Same JSON as `kb status --json`."""

RESOURCE_DESCRIPTION = """\
`recall` for one query as a resource: kb://recall/<percent-encoded query>, e.g. \
kb://recall/why%20did%20we%20drop%20celery%3F — the same JSON as the `recall` tool with default limits."""

Queries = Annotated[list[str] | str, Field(description="one query, or several focused queries (at most 8): "
                                                       "their union is returned, each query ranked on its own")]
Strings = list[str] | str | None


def _dumps(payload: dict[str, Any]) -> str:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), default=str)


def _tool_error(exc: Exception):
    """One line for the caller; the traceback (if unexpected) goes to the server's log (stderr)."""
    from mcp.server.mcpserver.exceptions import ToolError

    from kb_assets.config import ConfigError
    from kb_assets.store.db import DatabaseError

    if isinstance(exc, (tools.ToolInputError, ConfigError, DatabaseError)):
        return ToolError(str(exc).strip().splitlines()[0])
    log.exception("kb tool failed")
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return ToolError(f"internal error ({type(exc).__name__}{': ' + first[:300] if first else ''}) — "
                     "see the kb server's log; the server keeps serving")


def build_mcp_server(config=None, *, name: str = SERVER_NAME, embedder=None, **server_kwargs):
    """The kb MCP server (`mcp.server.mcpserver.MCPServer`) over the config's index.

    `config`: a KbConfig, a kb.yaml path, or None (the usual lookup: $KB_CONFIG, ./kb.yaml, this git
    repository). Loaded once here, so a configuration mistake fails at start-up, not on the first call.
    `embedder`: the query encoder for recall (kb serve passes its own, shared with /api/v1: one pass at a
    time and its query-vector cache); default the config's, made on the first call.
    The database and the query encoder start on the first call (then stay: one per process)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ResourceError
    from mcp.server.mcpserver.resources.templates import ResourceSecurity
    from mcp.types import ToolAnnotations

    from kb_assets.query.engine import _resolve_config

    cfg = _resolve_config(config)
    server_kwargs.setdefault("log_level", "WARNING")   # INFO would echo every pgserver command to stderr
    server = MCPServer(name, instructions=INSTRUCTIONS, **server_kwargs)
    read_only = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                                open_world_hint=False)

    def guarded(fn, *args, **kwargs) -> str:
        try:
            return _dumps(fn(cfg, *args, **kwargs))
        except Exception as exc:   # every failure is one line to the caller, never a dead server
            raise _tool_error(exc) from None

    @server.tool(name="recall", title="Recall team knowledge", description=RECALL_DESCRIPTION,
                 annotations=read_only, structured_output=False)
    def recall(
        queries: Queries,
        limit: Annotated[int | None, Field(description=f"documents, 1-{tools.MAX_LIMIT} (default 20)")] = None,
        code_limit: Annotated[int | None, Field(description=f"code records, 0-{tools.MAX_CODE_LIMIT} "
                                                            "(default 10; 0 for none)")] = None,
        source: Annotated[Strings, Field(description="only these source keys (see `status`)")] = None,
        kind: Annotated[Strings, Field(description="only these kinds: " + ", ".join(tools.DOCUMENT_KINDS))] = None,
        tag: Annotated[Strings, Field(description="only documents with one of these tags")] = None,
        since: Annotated[str | None, Field(description="documents dated on or after YYYY-MM-DD")] = None,
        until: Annotated[str | None, Field(description="documents dated on or before YYYY-MM-DD")] = None,
        passage: Annotated[bool, Field(description="add each record's best matching passage")] = False,
    ) -> str:
        return guarded(tools.recall_json, queries, embedder=embedder, limit=limit, code_limit=code_limit,
                       source=source, kind=kind, tag=tag, since=since, until=until, passage=passage)

    @server.tool(name="show", title="Open one document", description=SHOW_DESCRIPTION, annotations=read_only,
                 structured_output=False)
    def show(
        id: Annotated[str, Field(description="a kb id as printed by recall/search: kb:<source>/<path>")],
        max_chars: Annotated[int | None, Field(description=f"cap on `text`, 1000-{tools.SHOW_HARD_MAX_CHARS} "
                                                           f"(default {tools.SHOW_MAX_CHARS})")] = None,
    ) -> str:
        return guarded(tools.show_json, id, max_chars=max_chars)

    @server.tool(name="search", title="Search passages", description=SEARCH_DESCRIPTION, annotations=read_only,
                 structured_output=False)
    def search(
        query: Annotated[str, Field(description="words or a question")],
        limit: Annotated[int | None, Field(description=f"chunks, 1-{tools.MAX_SEARCH_LIMIT} (default 10)")] = None,
    ) -> str:
        return guarded(tools.search_json, query, limit=limit)

    @server.tool(name="status", title="Index status", description=STATUS_DESCRIPTION, annotations=read_only,
                 structured_output=False)
    def status() -> str:
        return guarded(tools.status_json)

    @server.tool(name="tier", title="Read a projection tier", description=TIER_DESCRIPTION,
                 annotations=read_only, structured_output=False)
    def tier(
        tier: Annotated[int, Field(description="0 (the index), 1 (per type; without a type: the list of types) "
                                               "or 3 (relations graph); tier 2 is `show`")],
        type: Annotated[str | None, Field(description="tier 1: a document type (adr, doc, session, transcript, "
                                                      "readme, agents_md, memory, work_item) or code")] = None,
        max_chars: Annotated[int | None, Field(description=f"cap on `text`, 1000-{tools.TIER_HARD_MAX_CHARS} "
                                                           f"(default {tools.TIER_MAX_CHARS})")] = None,
    ) -> str:
        return guarded(tools.tier_json, tier, type, max_chars=max_chars)

    @server.tool(name="tags", title="Tags in use", description=TAGS_DESCRIPTION, annotations=read_only,
                 structured_output=False)
    def tags() -> str:
        return guarded(tools.tags_json)

    @server.tool(name="related", title="Relations of one document", description=RELATED_DESCRIPTION,
                 annotations=read_only, structured_output=False)
    def related(
        id: Annotated[str, Field(description="a kb id: kb:<source>/<path>")],
        depth: Annotated[int | None, Field(description=f"hops, 1-{tools.MAX_RELATED_DEPTH} (default 1)")] = None,
    ) -> str:
        return guarded(tools.related_json, id, depth=depth)

    def resource_text(fn, *args, text_only: bool = False, **kwargs) -> str:
        try:
            out = fn(cfg, *args, **kwargs)
        except Exception as exc:
            raise ResourceError(str(_tool_error(exc))) from None
        return out["text"] if text_only else _dumps(out)

    @server.resource("kb://tier/0", name="tier0", title="T0: the index", description=TIER_RESOURCE_DESCRIPTION,
                     mime_type="text/plain")
    def tier0_resource() -> str:
        return resource_text(tools.tier_json, 0, text_only=True, max_chars=tools.TIER_HARD_MAX_CHARS)

    @server.resource("kb://tier/1/{type}", name="tier1", title="T1: one type", description=TIER1_RESOURCE_DESCRIPTION,
                     mime_type="text/plain")
    def tier1_resource(type: str) -> str:
        return resource_text(tools.tier_json, 1, type, text_only=True, max_chars=tools.TIER_HARD_MAX_CHARS)

    @server.resource("kb://related/{id}", name="related", title="T3: relations of one document",
                     description=RELATED_RESOURCE_DESCRIPTION, mime_type="application/json",
                     security=ResourceSecurity(exempt_params={"id"}))
    def related_resource(id: str) -> str:
        return resource_text(tools.related_json, id)

    # Queries are free text, not paths: the SDK's path-traversal checks ("..", "/x") would reject real
    # questions; NUL bytes are still refused (by tools._text).
    @server.resource("kb://recall/{query}", name="recall", title="Recall one query",
                     description=RESOURCE_DESCRIPTION, mime_type="application/json",
                     security=ResourceSecurity(exempt_params={"query"}))
    def recall_resource(query: str) -> str:
        try:
            return _dumps(tools.recall_json(cfg, query, embedder=embedder))
        except Exception as exc:
            raise ResourceError(str(_tool_error(exc))) from None

    server.kb_config = cfg   # type: ignore[attr-defined]  (for the mounting app and tests)
    return server


def mcp_http_app(config=None, *, host: str = "127.0.0.1", allowed_hosts: list[str] | None = None,
                 stateless: bool = True, json_response: bool = True, server=None):
    """A Starlette ASGI app serving MCP over streamable HTTP at its root path (mount it at /mcp).

    Its lifespan runs the SDK's session manager: served alone (uvicorn) that happens by itself; mounted,
    the parent's lifespan must enter it (see the module docstring). `app.state.kb_mcp` is the MCPServer."""
    from mcp.server.transport_security import TransportSecuritySettings

    server = server or build_mcp_server(config)
    security = None     # the SDK's default: Host/Origin checked against loopback names when host is loopback
    if allowed_hosts:
        names = [*allowed_hosts, "127.0.0.1:*", "localhost:*", "[::1]:*"]
        security = TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=names,
                                             allowed_origins=[f"{scheme}://{n}" for n in names
                                                              for scheme in ("http", "https")])
    app = server.streamable_http_app(streamable_http_path="/", stateless_http=stateless,
                                     json_response=json_response, transport_security=security, host=host)
    app.state.kb_mcp = server
    return app


def run_stdio(config=None) -> None:
    """`kb mcp`: serve on stdin/stdout until the client closes them. Logs go to stderr (stdout is the wire;
    the SDK points fd 1 at stderr while serving, so no stray print or child process can corrupt it).

    Shutdown: MCP clients close stdin, wait ~2 s, then SIGTERM (and SIGKILL 2 s later). Python's default
    SIGTERM exits without atexit handlers, which would leave the embedded PostgreSQL running with a stale
    handle (pgserver then never stops it). So SIGTERM ends the serve loop like a closed stdin, and once
    shutting down further SIGTERMs are ignored while the database stops."""
    import signal
    import threading

    import anyio

    from kb_assets.embedding import numpy_bert

    server = build_mcp_server(config)
    # a long-lived process: the query encoder on onnxruntime (built once, cached), never torch
    numpy_bert.prefer_onnxruntime(threads=server.kb_config.serve.embed_threads)
    threading.Thread(target=tools.warm_up, args=(server.kb_config,), name="kb-warm-up", daemon=True).start()
    logging.basicConfig(level=logging.WARNING, format="kb mcp: %(levelname)s %(name)s: %(message)s")

    def on_sigterm(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        anyio.run(server.run_stdio_async)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN if previous is not signal.SIG_IGN else previous)
