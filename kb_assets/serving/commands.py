"""The `kb serve` and `kb token create|list|revoke` verbs (cli.py adds their parsers with add_parsers)."""
from __future__ import annotations

import argparse
import json
import sys

from kb_assets.config import ConfigError


def add_parsers(add, sub_parsers=None) -> None:
    """`add(name, fn, help)` is cli.build_parser's helper (it adds --config)."""
    sp = add("serve", cmd_serve, "HTTP API, /knowledge page (and /mcp) for agents, scripts and people")
    sp.add_argument("--host", help="address to bind (default 127.0.0.1, or serve.host)")
    sp.add_argument("--port", type=int, help="port (default 8765, or serve.port)")
    sp.add_argument("--no-auth", action="store_true", help="no tokens (refused unless bound to loopback)")
    sp.add_argument("--log-query-text", action="store_true",
                    help="include query strings in the access log (off: they may hold sensitive text)")
    sp.add_argument("--secure-cookie", action="store_true", help="mark the /knowledge cookie Secure (behind TLS)")

    sp = add("token", cmd_token, "bearer tokens for kb serve: create, list, revoke")
    verbs = sp.add_subparsers(dest="token_verb", required=True)
    c = verbs.add_parser("create", help="make a token and print it once")
    c.add_argument("name")
    c.add_argument("--rate", help="requests allowed, e.g. 60/min (default serve.default_rate)")
    c.add_argument("--expires", help="lifetime, e.g. 90d, 12h, 2w (default: never)")
    c.add_argument("--json", action="store_true")
    ls = verbs.add_parser("list", help="names, created, last used, rate, state (never the secret)")
    ls.add_argument("--json", action="store_true")
    rv = verbs.add_parser("revoke", help="revoke a token at once")
    rv.add_argument("name")
    for p in (c, ls, rv):
        p.add_argument("--config", default=argparse.SUPPRESS, help="kb.yaml")


def _config(args):
    from kb_assets.config import load_config

    return load_config(args.config)


def cmd_serve(args) -> int:
    from kb_assets.serving.server import is_loopback, serve

    cfg = _config(args)
    host = args.host or cfg.serve.host
    port = args.port or cfg.serve.port
    if args.no_auth and not is_loopback(host):
        raise ConfigError("(command line)", "--no-auth", f"refused with --host {host} (not a loopback address)",
                          "bind 127.0.0.1 for --no-auth, or create a token: kb token create NAME")
    from kb_assets.config import check_environment

    check_environment(cfg, need_sources=False)
    serve(cfg, host=host, port=port, no_auth=args.no_auth, log_query_text=args.log_query_text,
          pool_size=cfg.serve.pool_size, secure_cookie=args.secure_cookie)
    return 0


def cmd_token(args) -> int:
    from kb_assets.serving.tokens import TokenError, create_token, list_tokens, revoke_token
    from kb_assets.store.db import connect, open_database

    cfg = _config(args)
    with connect(open_database(cfg), register=False) as conn:
        try:
            if args.token_verb == "create":
                t = create_token(conn, args.name, rate=args.rate or cfg.serve.default_rate, expires=args.expires)
                if args.json:
                    print(json.dumps(t))
                else:
                    print(t["token"])
                    print(f"token {t['name']!r}: rate {t['rate']}, expires {t['expires_at'] or 'never'} — shown "
                          "once; kb keeps only its hash. Use it as 'Authorization: Bearer <token>' or KB_TOKEN.",
                          file=sys.stderr)
            elif args.token_verb == "list":
                rows = list_tokens(conn)
                if args.json:
                    print(json.dumps(rows, indent=2))
                else:
                    from rich.console import Console
                    from rich.table import Table

                    t = Table(title="kb tokens", title_justify="left")
                    for col in ("name", "prefix", "state", "rate", "created", "expires", "last used"):
                        t.add_column(col)
                    for r in rows:
                        t.add_row(r["name"], r["prefix"], r["state"], r["rate"], r["created_at"][:19],
                                  (r["expires_at"] or "never")[:19], (r["last_used_at"] or "never")[:19])
                    Console(highlight=False, width=None if sys.stdout.isatty() else 200).print(t)
            else:
                revoke_token(conn, args.name)
                print(f"token {args.name!r} revoked", file=sys.stderr)
        except TokenError as exc:
            print(f"kb token {args.token_verb}: {exc}", file=sys.stderr)
            return 1
    return 0
