"""`kb recall` through a running `kb serve` (KB_SERVER + KB_TOKEN, or `serve.url` in kb.yaml).

Same output as in-process: the server returns `kb recall --json` (or, with format=text, the text), and this
prints it the way cli.cmd_recall does. A server that cannot be reached or refuses the token is a configuration
mistake (one line, exit 2), never a silent fallback that costs the model load after all.
"""
from __future__ import annotations

import json
import os

from kb_assets.config import ConfigError

SERVER_ENV = "KB_SERVER"
TOKEN_ENV = "KB_TOKEN"


def server_url(cfg) -> str | None:
    url = os.environ.get(SERVER_ENV)
    if url is None:
        serve = getattr(cfg, "serve", None)
        url = getattr(serve, "url", None) if serve is not None else None
    return url.rstrip("/") if url else None


def _where(cfg) -> tuple[str, str]:
    return ("(environment)", SERVER_ENV) if os.environ.get(SERVER_ENV) else (cfg.config_path, "serve.url")


def _params(q: list[str], *, limit, code_limit, passage, source, kind, tag, path_prefix, since, until,
            fmt: str) -> list[tuple[str, str]]:
    p: list[tuple[str, str]] = [("q", x) for x in q]
    for name, value in (("limit", limit), ("code_limit", code_limit)):
        if value is not None:
            p.append((name, str(value)))
    if passage:
        p.append(("passage", "true"))
    for name, values in (("filter[source]", source), ("filter[kind]", kind), ("filter[tag]", tag)):
        for v in values or []:
            p.append((name, v))
    if path_prefix:
        p.append(("filter[path_prefix]", path_prefix))
    if since or until:
        p.append(("filter[date_range]", f"{since or ''}:{until or ''}"))
    p.append(("format", fmt))
    return p


class RemoteRecall:
    def __init__(self, cfg, url: str):
        import httpx

        self.cfg, self.url = cfg, url
        token = os.environ.get(TOKEN_ENV)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=url, headers=headers, timeout=60.0)

    def recall(self, queries: list[str], *, fmt: str, **kw) -> dict:
        import httpx

        file, key = _where(self.cfg)
        try:
            r = self.http.get("/api/v1/recall", params=_params(queries, fmt=fmt, **kw))
        except httpx.HTTPError as exc:
            raise ConfigError(file, key, f"cannot reach kb serve at {self.url} ({type(exc).__name__})",
                              f"start `kb serve`, fix the URL, or unset {SERVER_ENV} to recall in-process") from None
        if r.status_code == 401:
            raise ConfigError("(environment)", TOKEN_ENV, f"{self.url} refused the token (401)",
                              "export KB_TOKEN=<a token from `kb token create NAME`>")
        if r.status_code == 429:
            from kb_assets.query import QueryError
            raise QueryError(f"rate limited by {self.url}: retry after {r.headers.get('Retry-After', '?')} s")
        try:
            body = r.json()
        except ValueError:
            body = {"error": r.text[:200]}
        if r.status_code != 200:
            from kb_assets.query import QueryError
            raise QueryError(body.get("error") or f"HTTP {r.status_code} from {self.url}")
        return body


def cmd_recall_remote(args, cfg, url: str) -> int:
    """cli.cmd_recall's output, from the server."""
    remote = RemoteRecall(cfg, url)
    kw = dict(limit=args.limit, code_limit=args.code_limit, passage=args.passage, source=args.source,
              kind=args.kind, tag=args.tag, path_prefix=args.path_prefix, since=args.since, until=args.until)
    fmt = "json" if args.json else "text"
    if args.queries:
        if args.query:
            raise ConfigError("(command line)", "QUERY", "given together with --queries", "use one or the other")
        with open(args.queries, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    item = json.loads(line)
                    qid, q = item.get("id", item.get("_id")), item.get("query", item.get("text"))
                except (json.JSONDecodeError, AttributeError):
                    qid, q = None, None
                if not q:
                    print(json.dumps({"id": None, "line": n, "error": "expected {\"id\", \"query\"}"}))
                    continue
                body = remote.recall([q], fmt=fmt, **kw)
                if args.json:
                    line_out = {"id": qid, **{k: v for k, v in body.items() if k != "query"}}
                    print(json.dumps(line_out, default=str, ensure_ascii=False), flush=True)
                else:
                    print(f"# {qid}\n{body['text']}\n", flush=True)
        return 0
    if not args.query:
        raise ConfigError("(command line)", "QUERY", "missing", "give a query, several queries, or --queries FILE")
    body = remote.recall(list(args.query), fmt=fmt, **kw)
    print(json.dumps(body, indent=2, default=str) if args.json else body["text"])
    return 0
