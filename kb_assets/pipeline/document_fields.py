"""The documents stage's normalised fields: one row's metadata (what the readers parsed, once) as columns.

doc_status / doc_status_raw, created / updated (DATE), date_source, tags; see migration 007 for what each
means. Every active document gets a date: its own (front matter, ADR / PEP header, file name, work item), else
the file's mtime (worktree mode, from its signature: no extra system call), else the date of the commit it was
indexed at (HEAD mode; filled once per run by `fill_commit_dates`). Rows written by an older version of these
rules (FIELDS_VERSION) are refilled from their stored meta by `refill_stale`: no file is read again, no chunk
or vector changes.
"""
from __future__ import annotations

import datetime as dt
import json
from typing import Any

import psycopg

from kb_assets.sources.dates import parse_date
from kb_assets.sources.decisions import normalize_status

FIELDS_VERSION = 1

Fields = tuple[str | None, str | None, dt.date | None, dt.date | None, str | None, list[str]]


def _tags(meta: dict[str, Any]) -> list[str]:
    raw = meta.get("tags")
    items = raw if isinstance(raw, list) else ([raw] if isinstance(raw, str) and raw else [])
    out: list[str] = []
    for t in items:
        t = str(t).strip().lower()
        if t and t not in out:
            out.append(t[:100])
    return out


def _mtime(file_sig: str | None) -> dt.date | None:
    """Worktree signatures are `size:mtime_ns`."""
    if not file_sig or ":" not in file_sig:
        return None
    try:
        ns = int(file_sig.rsplit(":", 1)[1])
    except ValueError:
        return None
    if ns <= 0:
        return None
    return dt.datetime.fromtimestamp(ns / 1e9, tz=dt.timezone.utc).date()


def document_fields(kind: str, meta: dict[str, Any], file_sig: str | None) -> Fields:
    raw = meta.get("status_raw") or meta.get("status")
    raw = str(raw).strip()[:200] if raw not in (None, "") else None
    if raw is None:
        status = None
    elif kind == "work_item":      # an issue tracker's own words (open, closed, in progress) are the status
        status = raw[:1].upper() + raw[1:]
    else:
        status = normalize_status(raw)
    created = parse_date(meta.get("created")) or parse_date(meta.get("date"))
    updated = parse_date(meta.get("updated"))
    source = meta.get("date_source") or (kind if kind in ("work_item", "transcript") and (created or updated)
                                         else None)
    if created is None and updated is None:
        created = updated = _mtime(file_sig)
        source = "mtime" if created else None
    return status, raw, created, updated, (str(source) if source else None), _tags(meta)


def write_fields(conn: psycopg.Connection, source_key: str, rows: list[tuple[str, str, dict, str | None]]) -> None:
    """Set the fields of (path, kind, meta, file_sig) documents of a source (inside the caller's transaction)."""
    if not rows:
        return
    cols: list[list] = [[] for _ in range(7)]
    for path, kind, meta, sig in rows:
        for i, v in enumerate((path,) + document_fields(kind, meta, sig)):
            cols[i].append(v)
    conn.execute(
        "UPDATE documents d SET doc_status = u.st, doc_status_raw = u.raw, created = u.c, updated = u.u,"
        " date_source = u.ds, tags = coalesce(string_to_array(u.tags, chr(31)), '{}'), fields_version = %s"
        " FROM unnest(%s::text[], %s::text[], %s::text[], %s::date[], %s::date[], %s::text[], %s::text[])"
        " AS u(path, st, raw, c, u, ds, tags)"
        " WHERE d.source_key = %s AND d.path = u.path AND d.status = 'active'",
        (FIELDS_VERSION, cols[0], cols[1], cols[2], cols[3], cols[4], cols[5],
         [chr(31).join(t) if t else None for t in cols[6]], source_key))


def refill_stale(conn: psycopg.Connection, source_key: str) -> int:
    """Fill the fields of documents written before them (or by older rules) from their stored meta."""
    rows = conn.execute(
        "SELECT path, kind, meta, file_sig FROM documents WHERE source_key = %s AND status = 'active'"
        " AND fields_version IS DISTINCT FROM %s", (source_key, FIELDS_VERSION)).fetchall()
    if rows:
        with conn.transaction():
            for i in range(0, len(rows), 1000):
                write_fields(conn, source_key, [(p, k, m if isinstance(m, dict) else json.loads(m or "{}"), s)
                                                for p, k, m, s in rows[i:i + 1000]])
    return len(rows)


def fill_commit_dates(conn: psycopg.Connection, source_key: str, root, commit: str | None) -> int:
    """Documents that state no date and have no mtime (HEAD mode) take the date of the indexed commit."""
    if not commit:
        return 0
    if not conn.execute("SELECT EXISTS (SELECT 1 FROM documents WHERE source_key = %s AND status = 'active'"
                        " AND created IS NULL AND updated IS NULL)", (source_key,)).fetchone()[0]:
        return 0
    from kb_assets.sources.gitutil import GitError, run_git

    try:
        out = run_git(root, "show", "-s", "--format=%cs", commit)
    except GitError:
        return 0
    day = parse_date(out.stdout.decode("utf-8", "replace").strip())
    if day is None:
        return 0
    with conn.transaction():
        cur = conn.execute("UPDATE documents SET created = %s, updated = %s, date_source = 'commit'"
                           " WHERE source_key = %s AND status = 'active' AND created IS NULL AND updated IS NULL",
                           (day, day, source_key))
    return cur.rowcount
