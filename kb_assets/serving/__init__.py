"""Where agents and people reach kb: `kb serve` (HTTP API, /knowledge page, /mcp) and `kb mcp` (stdio).

- `app.build_app(cfg)`: the ASGI app (FastAPI): the HTTP API under /api/v1, /healthz, /openapi.json, the
  /knowledge page, and the optional mount points for the MCP app (`/mcp`) and the webhook routes (`/hooks/…`).
- `tokens`: bearer tokens stored hashed, per-token rate limits (token buckets in PostgreSQL).
- `server.serve(cfg, …)`: runs the app on uvicorn, the model and a connection pool loaded once.
- `mcp`: the MCP server (tools recall/show/search/status, resource kb://recall/{query}); `kb mcp` on stdio.
- `webhooks`: POST /hooks/git (GitHub / GitLab push events, HMAC-checked), read by the git sensor.
- `client`: `kb recall` against a running server (KB_SERVER).

Nothing here imports dagster.
"""
