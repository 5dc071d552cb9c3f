"""Run the app on uvicorn: one process, the model and the connection pool loaded once, graceful shutdown."""
from __future__ import annotations

import ipaddress
import logging
import socket
import sys

log = logging.getLogger("kb.serve")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(info[4][0]).is_loopback
                       for info in socket.getaddrinfo(host, None))
        except (OSError, ValueError):
            return False


def configure_logging() -> None:
    """One JSON line per request on stderr (kb.serve.access); uvicorn's own access log is off because it
    prints query strings."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    for name in ("kb.serve.access",):
        lg = logging.getLogger(name)
        lg.handlers[:] = [handler]
        lg.setLevel(logging.INFO)
        lg.propagate = False
    other = logging.StreamHandler(sys.stderr)
    other.setFormatter(logging.Formatter("kb serve: %(message)s"))
    lg = logging.getLogger("kb.serve")
    lg.handlers[:] = [other]
    lg.setLevel(logging.INFO)
    lg.propagate = False


def serve(cfg, *, host: str, port: int, no_auth: bool = False, log_query_text: bool = False,
          pool_size: int = 8, secure_cookie: bool = False, ready=None) -> None:
    import uvicorn

    from kb_assets.serving.app import build_app, open_state

    configure_logging()
    state = open_state(cfg, no_auth=no_auth, log_query_text=log_query_text, pool_size=pool_size,
                       secure_cookie=secure_cookie)
    app = build_app(state)
    config = uvicorn.Config(app, host=host, port=port, access_log=False, log_level="warning",
                            timeout_graceful_shutdown=10, lifespan="on", server_header=False)
    server = uvicorn.Server(config)
    mode = "WITHOUT AUTHENTICATION (--no-auth, loopback only)" if no_auth else "bearer tokens required"
    print(f"kb serve: listening on http://{host}:{port} — {mode}; /knowledge for people, /api/v1 for "
          f"scripts, /openapi.json; Ctrl-C stops", file=sys.stderr, flush=True)
    # uvicorn finishes the requests in flight (up to 10 s), runs the lifespan shutdown (pool closed), then
    # re-raises SIGTERM/SIGINT so the exit status says how the process ended.
    server.run()
