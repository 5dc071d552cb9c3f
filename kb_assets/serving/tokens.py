"""Bearer tokens for `kb serve` and their per-token rate limits, both in PostgreSQL.

- A token is `kb_` + 43 URL-safe characters (256 random bits), printed once by `kb token create`.
- Only HMAC-SHA256(server secret, token) is stored. The secret is generated once and kept in the database
  (`serve_secret`), so every process serving the same database verifies the same tokens. With 256-bit random
  tokens a keyed fast hash is enough: there is nothing to brute-force, unlike passwords.
- Rate limit: a token bucket per token (capacity `burst`, refilled at `rate_per_s`), held in the token's row
  and updated by one `UPDATE … RETURNING` per request, so the limit holds across workers and processes.
"""
from __future__ import annotations

import hashlib
import hmac
import math
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import psycopg

TOKEN_PREFIX = "kb_"
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(s|sec|second|m|min|minute|h|hour|d|day)\s*$", re.I)
_UNIT_SECONDS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hour": 3600,
                 "d": 86400, "day": 86400}
_DURATION_RE = re.compile(r"^\s*(\d+)\s*(m|min|h|d|w|y)\s*$", re.I)
_DURATION_SECONDS = {"m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")


class TokenError(Exception):
    """A token command that cannot run as asked; str() says what to do."""


@dataclass(frozen=True)
class Rate:
    text: str
    per_second: float
    burst: float


def parse_rate(text: str) -> Rate:
    """"60/min" → 1 token per second, bucket of 60 (a client may spend a minute's allowance at once)."""
    m = _RATE_RE.match(text or "")
    if not m or float(m.group(1)) <= 0:
        raise TokenError(f"cannot read the rate {text!r}: write N/s, N/min, N/hour or N/day (e.g. 60/min)")
    n = float(m.group(1))
    per_s = n / _UNIT_SECONDS[m.group(2).lower()]
    return Rate(text=f"{m.group(1)}/{m.group(2).lower()}", per_second=per_s, burst=max(1.0, n))


def parse_duration(text: str) -> timedelta:
    m = _DURATION_RE.match(text or "")
    if not m or int(m.group(1)) <= 0:
        raise TokenError(f"cannot read the duration {text!r}: write e.g. 30m, 12h, 90d, 2w or 1y")
    return timedelta(seconds=int(m.group(1)) * _DURATION_SECONDS[m.group(2).lower()])


def server_secret(conn: psycopg.Connection) -> bytes:
    """The HMAC key, created on first use (the INSERT races harmlessly: one row wins, all read it)."""
    row = conn.execute("SELECT secret FROM serve_secret WHERE id = 1").fetchone()
    if row is None:
        conn.execute("INSERT INTO serve_secret (id, secret) VALUES (1, %s) ON CONFLICT (id) DO NOTHING",
                     (secrets.token_bytes(32),))
        row = conn.execute("SELECT secret FROM serve_secret WHERE id = 1").fetchone()
    return bytes(row[0])


def hash_token(secret: bytes, token: str) -> bytes:
    return hmac.new(secret, token.encode("utf-8", "surrogateescape"), hashlib.sha256).digest()


def create_token(conn: psycopg.Connection, name: str, *, rate: str = "60/min",
                 expires: str | None = None) -> dict:
    """Make a token and return {"name", "token", …}: the only time the token itself is seen."""
    if not NAME_RE.match(name or ""):
        raise TokenError(f"bad token name {name!r}: 1-64 letters, digits, '_', '.', '@' or '-'")
    r = parse_rate(rate)
    expires_at = datetime.now(timezone.utc) + parse_duration(expires) if expires else None
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    digest = hash_token(server_secret(conn), token)
    with conn.transaction():
        old = conn.execute("SELECT revoked_at FROM api_tokens WHERE name = %s FOR UPDATE", (name,)).fetchone()
        if old is not None and old[0] is None:
            raise TokenError(f"a token named {name!r} exists: revoke it first (`kb token revoke {name}`) "
                             "or choose another name")
        conn.execute("DELETE FROM api_tokens WHERE name = %s", (name,))   # a revoked one: the name is free again
        conn.execute(
            "INSERT INTO api_tokens (name, token_hash, prefix, rate_text, rate_per_s, burst, expires_at, bucket_level)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            (name, digest, token[:7], r.text, r.per_second, r.burst, expires_at, r.burst))
    return {"name": name, "token": token, "rate": r.text, "expires_at": expires_at.isoformat() if expires_at else None}


def list_tokens(conn: psycopg.Connection) -> list[dict]:
    now = datetime.now(timezone.utc)
    out = []
    for name, prefix, rate, created, expires, revoked, last in conn.execute(
            "SELECT name, prefix, rate_text, created_at, expires_at, revoked_at, last_used_at FROM api_tokens"
            " ORDER BY name"):
        state = "revoked" if revoked else "expired" if expires and expires <= now else "active"
        out.append({"name": name, "prefix": prefix + "…", "rate": rate, "state": state,
                    "created_at": created.isoformat(), "expires_at": expires.isoformat() if expires else None,
                    "revoked_at": revoked.isoformat() if revoked else None,
                    "last_used_at": last.isoformat() if last else None})
    return out


def revoke_token(conn: psycopg.Connection, name: str) -> None:
    row = conn.execute("UPDATE api_tokens SET revoked_at = now() WHERE name = %s AND revoked_at IS NULL"
                       " RETURNING name", (name,)).fetchone()
    if row is None:
        known = [r[0] for r in conn.execute("SELECT name FROM api_tokens WHERE revoked_at IS NULL ORDER BY name")]
        raise TokenError(f"no active token named {name!r}" + (f"; active: {', '.join(known)}" if known else ""))


# The bucket refill, written once and used twice below. GREATEST(0, …): concurrent requests may commit a
# later bucket_at than this statement's now(); elapsed time is never negative.
_LEVEL = ("LEAST(burst, bucket_level + GREATEST(0, EXTRACT(EPOCH FROM (now() - bucket_at))) * rate_per_s)")
_LIVE = "revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())"

# One statement per allowed request. Every expression reads the row being updated, so when two requests race
# for the same row PostgreSQL re-evaluates the second against the first's result (no double spending).
_SPEND_SQL = (f"UPDATE api_tokens SET bucket_level = {_LEVEL} - 1, bucket_at = greatest(bucket_at, now()),"
              f" last_used_at = now() WHERE token_hash = %s AND {_LIVE} AND {_LEVEL} >= 1 RETURNING name, token_hash")
_WHY_SQL = f"SELECT name, token_hash, {_LIVE}, {_LEVEL}, rate_per_s FROM api_tokens WHERE token_hash = %s"


@dataclass(frozen=True)
class Verdict:
    ok: bool
    name: str | None = None
    status: int = 200                  # 200 | 401 | 429
    retry_after: int | None = None     # seconds, with 429


def check_token(conn: psycopg.Connection, secret: bytes, token: str | None) -> Verdict:
    """Authenticate and spend one request from the token's bucket."""
    if not token or not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return Verdict(False, status=401)
    digest = hash_token(secret, token)
    row = conn.execute(_SPEND_SQL, (digest,)).fetchone()
    if row is not None and hmac.compare_digest(bytes(row[1]), digest):
        return Verdict(True, name=row[0])
    why = conn.execute(_WHY_SQL, (digest,)).fetchone()
    if why is None or not hmac.compare_digest(bytes(why[1]), digest) or not why[2]:
        return Verdict(False, status=401)          # unknown, revoked or expired: the same answer for all three
    level, per_s = float(why[3]), float(why[4])
    return Verdict(False, name=why[0], status=429, retry_after=max(1, math.ceil((1.0 - level) / per_s)))
