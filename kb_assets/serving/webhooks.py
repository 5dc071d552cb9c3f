"""POST /hooks/git: a push webhook from GitHub or GitLab, recorded in the database for git_commit_sensor.

- GitHub: `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>`, event `X-GitHub-Event: push`
  (`ping` answers 200), delivery id `X-GitHub-Delivery`.
- GitLab: `X-Gitlab-Token: <secret>` (a shared token, not an HMAC), event `X-Gitlab-Event: Push Hook`,
  delivery id `X-Gitlab-Event-UUID`.
- The secret comes from the environment (`KB_WEBHOOK_SECRET`); without it the hook answers 503 and records
  nothing. A bad or missing signature answers 401 and is logged without the payload. A delivery id seen
  before (a replay or a redelivery) answers 200 "duplicate" and records nothing.

Mount `routes` in any Starlette app (`kb serve` does); the app needs `app.state.kb_database_url`, else the
kb.yaml database ($KB_CONFIG / ./kb.yaml) is opened on first use. `create_app()` is a standalone app:
`python -m kb_assets.serving.webhooks --host 0.0.0.0 --port 8081`.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import threading

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

log = logging.getLogger("kb_assets.webhooks")

SECRET_ENV = "KB_WEBHOOK_SECRET"
MAX_BODY_BYTES = 5 * 1024 * 1024     # GitHub caps payloads at 25 MB; a push payload is a few KB
_ZERO_SHA = "0" * 40

_url_lock = threading.Lock()
_default_url: str | None = None


def _database_url(request: Request) -> str:
    url = getattr(request.app.state, "kb_database_url", None)
    if url:
        return url
    global _default_url
    with _url_lock:
        if _default_url is None:
            from kb_assets.config import load_config
            from kb_assets.store.db import open_database

            _default_url = open_database(load_config())
        return _default_url


def _secret(request: Request) -> str | None:
    return getattr(request.app.state, "kb_webhook_secret", None) or os.environ.get(SECRET_ENV) or None


def verify(headers, body: bytes, secret: str) -> str | None:
    """The provider ("github" | "gitlab") when the request is signed with secret, else None."""
    sig = headers.get("x-hub-signature-256")
    if sig is not None:
        want = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
        return "github" if hmac.compare_digest(sig.strip().encode(), want.encode()) else None
    token = headers.get("x-gitlab-token")
    if token is not None:
        return "gitlab" if hmac.compare_digest(token.encode(), secret.encode()) else None
    return None


def parse_push(provider: str, payload: dict) -> dict:
    """The fields we keep from a GitHub or GitLab push payload."""
    if provider == "github":
        repo = payload.get("repository") or {}
        urls = [repo.get(k) for k in ("clone_url", "ssh_url", "git_url", "html_url", "url")]
        name = repo.get("full_name")
        forced = bool(payload.get("forced"))
    else:
        project = payload.get("project") or {}
        repo = payload.get("repository") or {}
        urls = [project.get("git_http_url"), project.get("git_ssh_url"), project.get("web_url"),
                repo.get("git_http_url"), repo.get("git_ssh_url"), repo.get("url"), repo.get("homepage")]
        name = project.get("path_with_namespace")
        forced = False      # GitLab does not say; the sensor sees a rewrite itself (ancestry check)
    return {"repository": name, "repo_urls": sorted({u for u in urls if isinstance(u, str) and u}),
            "ref": payload.get("ref"), "before_sha": payload.get("before"), "after_sha": payload.get("after"),
            "forced": forced}


def _record(url: str, delivery_id: str, provider: str, push: dict) -> int | None:
    """Insert the push; None when the delivery id was recorded before."""
    from kb_assets.store.db import connect

    with connect(url, register=False) as conn:
        row = conn.execute(
            "INSERT INTO git_pushes (delivery_id, provider, repository, repo_urls, ref, before_sha, after_sha,"
            " forced) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (delivery_id) DO NOTHING RETURNING id",
            (delivery_id, provider, push["repository"], push["repo_urls"], push["ref"], push["before_sha"],
             push["after_sha"], push["forced"])).fetchone()
    return row[0] if row else None


async def git_push(request: Request) -> JSONResponse:
    secret = _secret(request)
    client = request.client.host if request.client else "?"
    if not secret:
        log.error("push webhook from %s refused: %s is not set", client, SECRET_ENV)
        return JSONResponse({"error": f"webhook disabled: set {SECRET_ENV}"}, status_code=503)
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        return JSONResponse({"error": "payload too large"}, status_code=413)
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        return JSONResponse({"error": "payload too large"}, status_code=413)
    provider = verify(request.headers, body, secret)
    delivery = (request.headers.get("x-github-delivery") or request.headers.get("x-gitlab-event-uuid")
                or request.headers.get("idempotency-key") or "")
    if provider is None:
        # never log the payload or the presented signature: only who called and what they claimed to be
        claimed = ("github" if "x-hub-signature-256" in request.headers
                   else "gitlab" if "x-gitlab-token" in request.headers else "unsigned")
        log.warning("push webhook from %s rejected: bad signature (%s, delivery %s, %d bytes)",
                    client, claimed, delivery[:64] or "-", len(body))
        return JSONResponse({"error": "bad signature"}, status_code=401)
    event = request.headers.get("x-github-event") if provider == "github" else request.headers.get("x-gitlab-event")
    if provider == "github" and event == "ping":
        return JSONResponse({"status": "pong"})
    if event not in ("push", "Push Hook"):
        return JSONResponse({"status": "ignored", "event": event}, status_code=202)
    try:
        payload = json.loads(body)
        if not isinstance(payload, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        return JSONResponse({"error": f"payload is not a JSON object: {str(exc)[:100]}"}, status_code=400)
    push = parse_push(provider, payload)
    if not push["ref"] or not push["after_sha"]:
        return JSONResponse({"error": "push payload without ref/after"}, status_code=400)
    if push["after_sha"] == _ZERO_SHA:
        return JSONResponse({"status": "ignored", "reason": "branch deleted"}, status_code=202)
    delivery_id = f"{provider}:{delivery or hashlib.sha256(body).hexdigest()}"
    url = await run_in_threadpool(_database_url, request)    # may open (and migrate) the database once
    push_id = await run_in_threadpool(_record, url, delivery_id, provider, push)
    if push_id is None:
        log.info("push webhook %s ignored: delivery already recorded", delivery_id[:80])
        return JSONResponse({"status": "duplicate", "delivery": delivery_id})
    log.info("push recorded: %s %s %s → %s", provider, push["repository"], push["ref"], push["after_sha"])
    return JSONResponse({"status": "recorded", "id": push_id, "delivery": delivery_id}, status_code=202)


routes: list[Route] = [Route("/hooks/git", git_push, methods=["POST"])]


def create_app(database_url: str | None = None, secret: str | None = None) -> Starlette:
    """A standalone app serving only the webhook (tests; deployments without `kb serve`)."""
    app = Starlette(routes=list(routes))
    app.state.kb_database_url = database_url
    app.state.kb_webhook_secret = secret
    return app


def main(argv: list[str] | None = None) -> int:
    import argparse

    import uvicorn

    p = argparse.ArgumentParser(prog="python -m kb_assets.serving.webhooks",
                                description="serve POST /hooks/git (secret from $KB_WEBHOOK_SECRET)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8081)
    args = p.parse_args(argv)
    if not os.environ.get(SECRET_ENV):
        print(f"kb webhooks: {SECRET_ENV} is not set — export it (the secret configured in GitHub/GitLab)")
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(create_app(), host=args.host, port=args.port, log_level="info")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
