"""Stage 1: list a source, read what changed, and keep one `documents` row per live document.

Cheap first: a file whose signature (git blob id, or size:mtime) matches the stored one is not read.
Deletions are applied only after a complete, successful listing (invariant 5).
"""
from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psycopg

from kb_assets.config import KbConfig, SourceConfig
from kb_assets.models import Skip, SourceDocument
from kb_assets.pipeline.progress import Progress, null_progress

log = logging.getLogger(__name__)

WRITE_BATCH = 200  # documents written per transaction


@dataclass
class DocumentStats:
    source: str
    listed: int = 0
    new: int = 0
    changed: int = 0
    unchanged: int = 0
    deleted: int = 0
    skipped: int = 0               # skipped in this run (newly seen or changed files)
    skipped_total: int = 0         # all skipped files recorded for the source
    skip_reasons: dict[str, int] = field(default_factory=dict)
    listing_mode: str = "full"     # full | git-diff (committed changes since the indexed commit)
    read_errors: int = 0
    commit: str | None = None
    complete: bool = True
    seconds: float = 0.0

    def as_metadata(self) -> dict:
        return asdict(self)


def _file_of(path: str) -> str:
    """Work-item exports yield documents `<file>#<id>`: the file is what was listed."""
    return path.split("#", 1)[0]


def _config_hash(cfg: KbConfig, source: SourceConfig) -> str:
    from kb_assets.models import sha256_hex

    return sha256_hex(source.model_dump_json() + str(cfg.source_root(source)))[:16]


def ensure_source_row(conn: psycopg.Connection, cfg: KbConfig, source: SourceConfig) -> str | None:
    """Upsert the source; return the commit it was indexed at, or None when its settings changed since
    (new include globs, limits, kind...), which calls for a full listing."""
    row = conn.execute("SELECT indexed_commit, config_hash FROM sources WHERE key = %s", (source.key,)).fetchone()
    h = _config_hash(cfg, source)
    conn.execute(
        "INSERT INTO sources (key, kind, root, config_hash) VALUES (%s, %s, %s, %s)"
        " ON CONFLICT (key) DO UPDATE SET kind = EXCLUDED.kind, root = EXCLUDED.root,"
        " config_hash = EXCLUDED.config_hash",
        (source.key, source.kind, str(cfg.source_root(source)), h),
    )
    if row is None or row[1] != h:
        return None
    return row[0]


def sync_documents(conn: psycopg.Connection, cfg: KbConfig, source: SourceConfig,
                   progress: Progress = null_progress) -> DocumentStats:
    from kb_assets.sources import discovery
    from kb_assets.sources.readers import read_entry

    started = time.perf_counter()
    stats = DocumentStats(source=source.key)
    root = cfg.source_root(source)
    # Committed content with a reachable previous commit: only what `git diff` names is looked at.
    # Otherwise (worktree mode, force-push, gc, first run, changed settings) a full listing with cheap
    # signatures.
    prev = ensure_source_row(conn, cfg, source)
    changes = discovery.changes_since(root, source, prev) if prev else None
    diff_removed: set[str] = set()
    if changes is not None:
        stats.listing_mode = "git-diff"
        touched = changes.added + changes.modified + [new for _, new in changes.renamed]
        listing = discovery.list_paths(root, source, touched)
        diff_removed = set(changes.deleted) | {old for old, _ in changes.renamed}
    else:
        listing = discovery.list_source(root, source)
    stats.listed = len(listing.files)
    stats.commit = listing.commit
    stats.complete = listing.complete or changes is not None

    # What we have: file -> (signature, {document path: content hash})
    stored: dict[str, tuple[str | None, dict[str, str | None]]] = {}
    for path, sig, content_hash in conn.execute(
        "SELECT path, file_sig, content_hash FROM documents WHERE source_key = %s", (source.key,)
    ):
        f = _file_of(path)
        entry = stored.setdefault(f, (sig, {}))
        entry[1][path] = content_hash
    if changes is not None:
        named = set(touched) | diff_removed
        stats.unchanged += sum(1 for f, (_, docs) in stored.items() if f not in named
                               for h in docs.values() if h is not None)

    to_read = []
    for entry in listing.files:
        have = stored.get(entry.path)
        if have is not None and have[0] == entry.sig:
            stats.unchanged += sum(1 for h in have[1].values() if h is not None)   # skipped rows have no hash
        else:
            to_read.append(entry)
    # Skips found by the listing itself (binary, too large, symlink outside root, ...).
    listing_skips = [s for s in listing.skips]

    progress.start(f"{source.key}: reading", total=len(to_read))
    pending: list[tuple] = []  # rows to write
    gone_paths: list[str] = []

    def flush() -> None:
        if not pending and not gone_paths:
            return
        with conn.transaction():
            if gone_paths:
                conn.execute("DELETE FROM documents WHERE source_key = %s AND path = ANY(%s)",
                             (source.key, gone_paths))
            for row in pending:
                _upsert(conn, source.key, row, listing.commit)
        pending.clear()
        gone_paths.clear()

    for entry in to_read:
        try:
            result = read_entry(root, entry, source)
        except Exception as exc:  # a reader bug must not stop the run: record it, go on
            log.exception("reading %s failed", entry.path)
            stats.read_errors += 1
            result = Skip(entry.path, "read-error", f"{type(exc).__name__}: {exc}"[:500])
        had = stored.get(entry.path, (None, {}))[1]
        if isinstance(result, Skip):
            stats.skipped += 1
            pending.append(("skip", result, entry.sig))
            gone_paths.extend(p for p in had if p != result.path)
        else:
            new_paths = set()
            for doc in result:
                new_paths.add(doc.path)
                old_hash = had.get(doc.path)
                if doc.path not in had:
                    stats.new += 1
                elif old_hash != doc.content_hash:
                    stats.changed += 1
                else:
                    stats.unchanged += 1
                pending.append(("doc", doc, entry.sig))
            removed = [p for p in had if p not in new_paths]
            gone_paths.extend(removed)
            stats.deleted += len(removed)
        if len(pending) >= WRITE_BATCH:
            flush()
        progress.advance()
    for skip in listing_skips:
        have = stored.get(skip.path)
        if have is None or have[1].get(skip.path, "x") is not None:  # not yet recorded as skipped
            stats.skipped += 1
            pending.append(("skip", skip, None))
            gone_paths.extend(p for p in (have[1] if have else {}) if p != skip.path)
    flush()
    progress.done()

    if changes is not None:
        gone = [p for f, (_, docs) in stored.items() if f in diff_removed for p in docs]
    elif listing.complete:
        seen = {e.path for e in listing.files} | {s.path for s in listing_skips}
        gone = [p for f, (_, docs) in stored.items() if f not in seen for p in docs]
    else:
        gone = []
        log.warning("listing of %s was incomplete: no document was pruned", source.key)
    if gone:
        with conn.transaction():
            conn.execute("DELETE FROM documents WHERE source_key = %s AND path = ANY(%s)", (source.key, gone))
        stats.deleted += len(gone)
    if stats.complete:
        conn.execute("UPDATE sources SET indexed_commit = %s, listed_at = now() WHERE key = %s",
                     (listing.commit, source.key))

    reasons = Counter()
    for reason, n in conn.execute(
        "SELECT skip_reason, count(*) FROM documents WHERE source_key = %s AND status = 'skipped' GROUP BY 1",
        (source.key,),
    ):
        reasons[reason] = n
    stats.skip_reasons = dict(reasons)
    stats.skipped_total = sum(reasons.values())
    stats.seconds = round(time.perf_counter() - started, 3)
    return stats


def _upsert(conn: psycopg.Connection, source_key: str, row: tuple, commit: str | None) -> None:
    what, item, sig = row
    if what == "skip":
        skip: Skip = item
        conn.execute(
            """INSERT INTO documents (source_key, path, kind, title, status, skip_reason, skip_detail, file_sig,
                                      content_hash, chunked_hash, text, indexed_commit)
               VALUES (%s, %s, '', '', 'skipped', %s, %s, %s, NULL, NULL, NULL, %s)
               ON CONFLICT (source_key, path) DO UPDATE SET
                 status = 'skipped', skip_reason = EXCLUDED.skip_reason, skip_detail = EXCLUDED.skip_detail,
                 file_sig = EXCLUDED.file_sig, content_hash = NULL, chunked_hash = NULL, text = NULL,
                 indexed_commit = EXCLUDED.indexed_commit, updated_at = now()""",
            (source_key, skip.path, skip.reason, skip.detail[:1000], sig, commit),
        )
        # A document that became unreadable has no live chunks.
        conn.execute(
            "DELETE FROM chunks WHERE document_id = (SELECT id FROM documents WHERE source_key = %s AND path = %s)",
            (source_key, skip.path),
        )
        return
    doc: SourceDocument = item
    conn.execute(
        """INSERT INTO documents (source_key, path, kind, title, status, file_sig, content_hash, meta, text,
                                  indexed_commit)
           VALUES (%s, %s, %s, %s, 'active', %s, %s, %s, %s, %s)
           ON CONFLICT (source_key, path) DO UPDATE SET
             kind = EXCLUDED.kind, title = EXCLUDED.title, status = 'active', skip_reason = NULL,
             skip_detail = NULL, file_sig = EXCLUDED.file_sig, content_hash = EXCLUDED.content_hash,
             meta = EXCLUDED.meta, text = EXCLUDED.text, indexed_commit = EXCLUDED.indexed_commit,
             updated_at = CASE WHEN documents.content_hash IS DISTINCT FROM EXCLUDED.content_hash
                               THEN now() ELSE documents.updated_at END""",
        (source_key, doc.path, doc.kind, _no_nul(doc.title[:1000]), sig, doc.content_hash,
         json.dumps(doc.meta, default=str).replace("\\u0000", ""), _no_nul(doc.text), commit),
    )


def _no_nul(text: str) -> str:
    # PostgreSQL text and jsonb cannot hold NUL; readers skip binary files, this is the last guard.
    return text.replace("\x00", "") if "\x00" in text else text


def source_root_exists(cfg: KbConfig, source: SourceConfig) -> bool:
    return Path(cfg.source_root(source)).is_dir()
