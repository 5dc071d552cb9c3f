"""Stage 1: list a source, read what changed, and keep one `documents` row per live document.

Cheap first: a file whose signature (git blob id, or size:mtime) matches the stored one is not read.
Deletions are applied only after a complete, successful listing (invariant 5).
Files are read (and redacted) on the calling thread while a writer thread stores them, WRITE_BATCH rows
per transaction and per statement (see _UPSERT).
"""
from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psycopg

from kb_assets.config import KbConfig, SourceConfig
from kb_assets.models import Skip, SourceDocument
from kb_assets.pipeline import cancel
from kb_assets.pipeline.progress import Progress, null_progress
from kb_assets.sources.safe_names import assign_names, clean_json_value, clean_text, escape_surrogates

log = logging.getLogger(__name__)

WRITE_BATCH = 200  # documents written per transaction (and per statement)
WRITE_BATCH_CHARS = 16_000_000  # ... or fewer when their texts add up to this (transcripts: bounded memory)


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
    listing_reason: str = ""       # why a full listing, when it was not expected (force-push, rewrite)
    unmatched_includes: list[str] = field(default_factory=list)   # include globs that matched no file
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

    # branch/remote unset leave the hash as it was before they existed (no full re-listing on upgrade)
    unset = {k for k in ("branch", "remote") if getattr(source, k, None) is None}
    return sha256_hex(source.model_dump_json(exclude=unset) + str(cfg.source_root(source)))[:16]


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
    from kb_assets.sources import classify, discovery
    from kb_assets.sources.gitutil import BlobReader

    started = time.perf_counter()
    stats = DocumentStats(source=source.key)
    root = cfg.source_root(source)
    # Committed content with a reachable previous commit: only what `git diff` names is looked at.
    # Otherwise (worktree mode, force-push, gc, first run, changed settings) a full listing with cheap
    # signatures.
    from kb_assets.sources.roots import TooManyFiles, check_root

    from kb_assets.pipeline.source_state import forget, racy_sig, take_listing

    # until this run completes, `kb index` must not take the source for unchanged; what the last complete run
    # recorded tells whether this code stored the names the index holds (the secret scan of names, below)
    last = forget(conn, source.key) or {}
    check_root(root, source, cfg.config_path)     # before anything is listed or stored
    prev = ensure_source_row(conn, cfg, source)
    changes = discovery.changes_since(root, source, prev) if prev else None
    diff_removed: set[str] = set()
    touched: list[str] = []
    renamed: dict[str, str] = {}
    if changes is not None:
        touched = changes.added + changes.modified + [new for _, new in changes.renamed]
        diff_removed = set(changes.deleted) | {old for old, _ in changes.renamed}
        renamed = assign_names(touched + list(diff_removed))
        if any("[REDACTED:" in n for n in renamed.values()):
            # redacted names that coincide are told apart (~2, ~3) in the order of the whole listing,
            # which a diff does not have: list everything (rare: a secret in a changed file's name)
            changes, diff_removed, touched = None, set(), []
    if changes is not None:
        stats.listing_mode = "git-diff"
        listing = discovery.list_paths(root, source, touched)
    else:
        try:
            # `kb index` took this listing for the fingerprint moments ago: the folder is listed once
            listing = take_listing(cfg, source) or discovery.list_source(root, source)
        except TooManyFiles as exc:
            raise exc.with_config_path(cfg.config_path) from None
        if prev and source.content == "HEAD" and listing.commit:
            # the indexed commit is gone or not an ancestor of the tip: say why this run lists everything
            stats.listing_reason = "history rewritten: the indexed commit is not an ancestor of the tip"
    # What we have: file -> (signature, {document path: content hash})
    stored: dict[str, tuple[str | None, dict[str, str | None]]] = {}
    for path, sig, content_hash in conn.execute(
        "SELECT path, file_sig, content_hash FROM documents WHERE source_key = %s", (source.key,)
    ):
        f = _file_of(path)
        entry = stored.setdefault(f, (sig, {}))
        entry[1][path] = content_hash
    if changes is None:
        # The names files have in the index (undecodable bytes escaped, secrets in names redacted); files
        # are still read through their listed names. Only names the index does not hold yet are scanned: one
        # stored as listed by this same code was scanned then and found clean (a delete or rename of a few
        # files: no detect-secrets import, ~0.3 s).
        from kb_assets.pipeline.source_state import code_version

        renamed = assign_names([e.path for e in listing.files] + [s.path for s in listing.skips],
                               clean=stored.keys() if last.get("code") == code_version() else ())
    stats.listed = len(listing.files)
    stats.commit = listing.commit
    stats.complete = listing.complete or changes is not None
    name = (lambda p: renamed.get(p, p)) if renamed else (lambda p: p)

    if changes is not None:
        named = {name(p) for p in touched} | {name(p) for p in diff_removed}
        stats.unchanged += sum(1 for f, (_, docs) in stored.items() if f not in named
                               for h in docs.values() if h is not None)

    to_read = []
    for entry in listing.files:
        have = stored.get(name(entry.path))
        if have is not None and have[0] == entry.sig:
            stats.unchanged += sum(1 for h in have[1].values() if h is not None)   # skipped rows have no hash
        else:
            to_read.append(entry)
    # Skips found by the listing itself (binary, too large, symlink outside root, ...).
    listing_skips = [s for s in listing.skips]

    progress.start(f"{source.key}: reading", total=len(to_read))
    # Reading and redaction (CPU, this thread) overlap with the database writes (another thread: psycopg
    # releases the GIL while it waits for the server). Each batch is still its own transaction.
    writer = _BatchWriter(conn, source.key, listing.commit)
    # HEAD mode: one git process for all blobs, asked ahead in reading order (transcripts are streamed
    # on their own: not asked ahead).
    blobs = BlobReader(root, [e.sig for e in to_read
                              if classify.kind_for(e.path, source.kind, source.auto_kind) != "transcript"]) \
        if source.content == "HEAD" else None
    batch = _Batch()
    if to_read:    # the readers (parsers, redaction: ~0.1 s of imports) only when a file is read
        from kb_assets.sources.readers import read_entry
    try:
        for entry in to_read:
            cancel.check()     # between files: the batches handed over are still written (close below)
            stored_name = name(entry.path)
            # read within its mtime's tick: the signature proves nothing, store it smudged (source_state)
            sig = racy_sig(entry.sig, time.time_ns())
            try:
                result = read_entry(root, entry, source, blobs=blobs)
                if not isinstance(result, Skip):
                    result = [_storable(doc, entry.path, stored_name) for doc in result]
            except Exception as exc:  # a reader bug must not stop the run: record it, go on
                log.exception("reading %s failed", escape_surrogates(entry.path))
                stats.read_errors += 1
                result = Skip(entry.path, "read-error", clean_text(f"{type(exc).__name__}: {exc}"[:500]))
            had = stored.get(stored_name, (None, {}))[1]
            if isinstance(result, Skip):
                result = Skip(stored_name, result.reason, _safe_detail(result.detail))
                stats.skipped += 1
                batch = writer.add(batch, _skip_row(result, sig))
                batch.gone.extend(p for p in had if p != result.path)
            else:
                new_paths = set()
                for doc in result:
                    new_paths.add(doc.path)
                    content_hash = doc.content_hash
                    old_hash = had.get(doc.path)
                    if doc.path not in had:
                        stats.new += 1
                    elif old_hash != content_hash:
                        stats.changed += 1
                    else:
                        stats.unchanged += 1
                    batch = writer.add(batch, _doc_row(doc, content_hash, sig))
                removed = [p for p in had if p not in new_paths]
                batch.gone.extend(removed)
                stats.deleted += len(removed)
            if len(batch.rows) >= WRITE_BATCH or batch.chars >= WRITE_BATCH_CHARS:
                writer.submit(batch)
                batch = _Batch()
            progress.advance()
        for skip in listing_skips:
            skip = Skip(name(skip.path), skip.reason, skip.detail)
            have = stored.get(skip.path)
            if have is None or have[1].get(skip.path, "x") is not None:  # not yet recorded as skipped
                skip.detail = _safe_detail(skip.detail)
                stats.skipped += 1
                batch = writer.add(batch, _skip_row(skip, None))
                batch.gone.extend(p for p in (have[1] if have else {}) if p != skip.path)
        writer.submit(batch)
    except BaseException:
        writer.close(raise_error=False)
        raise
    finally:
        if blobs is not None:
            blobs.close()
    writer.close()
    progress.done()
    from kb_assets.pipeline.document_fields import fill_commit_dates, refill_stale

    refill_stale(conn, source.key)     # rows stored before the fields existed (or by older rules): from meta
    refill_blocks(conn, source.key)    # rows stored before documents.blocks (migration 008): from the text

    if changes is not None:
        removed_names = {name(p) for p in diff_removed}
        gone = [p for f, (_, docs) in stored.items() if f in removed_names for p in docs]
    elif listing.complete:
        seen = {name(e.path) for e in listing.files} | {name(s.path) for s in listing_skips}
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
    fill_commit_dates(conn, source.key, root, listing.commit)   # documents with no date of their own

    reasons = Counter()
    for reason, n in conn.execute(
        "SELECT skip_reason, count(*) FROM documents WHERE source_key = %s AND status = 'skipped' GROUP BY 1",
        (source.key,),
    ):
        reasons[reason] = n
    stats.skip_reasons = dict(reasons)
    stats.skipped_total = sum(reasons.values())
    if stats.complete:
        from kb_assets.store.health import glob_warning, unmatched_includes

        stats.unmatched_includes = unmatched_includes(conn, source)
        if stats.unmatched_includes:
            log.warning(glob_warning(source.key, stats.unmatched_includes))
    stats.seconds = round(time.perf_counter() - started, 3)
    return stats


# One batch = one transaction: the batch's deletions, then every row upserted by one statement (the rows
# travel as arrays, in binary: one round trip instead of one per document, and no text escaping). The SET
# clause keeps what the former per-row statements did: a skipped file keeps its kind, title and meta, loses
# its text, hashes and chunks; `updated_at` moves for a skip or a changed content hash only.
_UPSERT = """
WITH up AS (
  INSERT INTO documents AS d (source_key, path, kind, title, status, skip_reason, skip_detail, file_sig,
                              content_hash, meta, text, indexed_commit, blocks, blocks_version)
  SELECT %(key)s, u.path, u.kind, u.title, u.status, u.skip_reason, u.skip_detail, u.file_sig, u.content_hash,
         u.meta::jsonb, u.text, %(commit)s, u.blocks::jsonb, u.blocks_version
  FROM unnest(%(path)b::text[], %(kind)b::text[], %(title)b::text[], %(status)b::text[], %(skip_reason)b::text[],
              %(skip_detail)b::text[], %(file_sig)b::text[], %(content_hash)b::text[], %(meta)b::text[],
              %(text)b::text[], %(blocks)b::text[], %(blocks_version)b::int2[])
       WITH ORDINALITY AS u(path, kind, title, status, skip_reason, skip_detail, file_sig, content_hash, meta,
                            text, blocks, blocks_version, n)
  ORDER BY u.n
  ON CONFLICT (source_key, path) DO UPDATE SET
    kind = CASE WHEN EXCLUDED.status = 'skipped' THEN d.kind ELSE EXCLUDED.kind END,
    title = CASE WHEN EXCLUDED.status = 'skipped' THEN d.title ELSE EXCLUDED.title END,
    status = EXCLUDED.status, skip_reason = EXCLUDED.skip_reason, skip_detail = EXCLUDED.skip_detail,
    file_sig = EXCLUDED.file_sig, content_hash = EXCLUDED.content_hash,
    chunked_hash = CASE WHEN EXCLUDED.status = 'skipped' THEN NULL ELSE d.chunked_hash END,
    meta = CASE WHEN EXCLUDED.status = 'skipped' THEN d.meta ELSE EXCLUDED.meta END,
    text = EXCLUDED.text, indexed_commit = EXCLUDED.indexed_commit,
    blocks = EXCLUDED.blocks, blocks_version = EXCLUDED.blocks_version,
    updated_at = CASE WHEN EXCLUDED.status = 'skipped' OR d.content_hash IS DISTINCT FROM EXCLUDED.content_hash
                      THEN now() ELSE d.updated_at END
  RETURNING d.id, d.status
)
-- A document that became unreadable has no live chunks.
DELETE FROM chunks WHERE document_id IN (SELECT id FROM up WHERE status = 'skipped')
"""
_COLUMNS = ("path", "kind", "title", "status", "skip_reason", "skip_detail", "file_sig", "content_hash", "meta",
            "text", "blocks", "blocks_version")


def _storable(doc: SourceDocument, listed: str, stored_name: str) -> SourceDocument:
    """The document as the index keeps it: under the file's stored name (a work item keeps its `#id`,
    escaped and redacted like a name), text and meta without lone surrogates or NUL, the title free of
    secrets (it is often the file name)."""
    from kb_assets.sources.redaction import redact

    if doc.path == listed:
        doc.path = stored_name
    elif doc.path.startswith(listed + "#"):
        doc.path = stored_name + redact(escape_surrogates(doc.path[len(listed):]))[0]
    else:   # a reader that names documents otherwise: make the name storable all the same
        doc.path = redact(escape_surrogates(doc.path))[0]
    if stored_name != listed:
        doc.title = doc.title.replace(listed, stored_name)
    doc.title = redact(escape_surrogates(doc.title))[0]
    doc.text = clean_text(doc.text)
    doc.meta = clean_json_value(doc.meta)
    return doc


def _safe_detail(detail: str) -> str:
    """A skip's reason often quotes the file name or a symlink target: escaped and redacted like names."""
    from kb_assets.sources.redaction import redact

    return redact(clean_text(escape_surrogates(detail)))[0]


def _skip_row(skip: Skip, sig: str | None) -> tuple:
    return (skip.path, "", "", "skipped", skip.reason, skip.detail[:1000], sig, None, "{}", None, None, None)


def _doc_row(doc: SourceDocument, content_hash: str, sig: str) -> tuple:
    text = _no_nul(doc.text)
    return (doc.path, doc.kind, _no_nul(doc.title[:1000]), "active", None, None, sig, content_hash,
            json.dumps(doc.meta, default=str).replace("\\u0000", ""), text, *_blocks_columns(doc, text))


def _blocks_columns(doc: SourceDocument, text: str) -> tuple[str | None, int]:
    """(documents.blocks as JSON text, blocks_version): the one block scan of the stored text (migration 008),
    read by the chunks and signposts stages instead of scanning it again."""
    from kb_assets.chunking import document_blocks
    from kb_assets.chunking.markdown import BLOCKS_VERSION

    stored = document_blocks(SourceDocument(path=doc.path, kind=doc.kind, title=doc.title, text=text,
                                            meta=doc.meta))
    return (json.dumps(stored, ensure_ascii=False).replace("\\u0000", "") if stored is not None else None,
            BLOCKS_VERSION)


def refill_blocks(conn: psycopg.Connection, source_key: str) -> int:
    """documents.blocks of active rows written before migration 008 (or by older scan rules), from the stored
    text: no file read again, no chunk or vector changes."""
    from kb_assets.models import BLOCKS_VERSION

    ids = [r[0] for r in conn.execute(
        "SELECT id FROM documents WHERE source_key = %s AND status = 'active'"
        " AND blocks_version IS DISTINCT FROM %s", (source_key, BLOCKS_VERSION)).fetchall()]
    for i in range(0, len(ids), 500):
        rows = conn.execute("SELECT id, path, kind, title, text, meta FROM documents WHERE id = ANY(%s)",
                            (ids[i:i + 500],)).fetchall()
        out_ids, out_blocks = [], []
        for doc_id, path, kind, title, text, meta in rows:
            doc = SourceDocument(path=path, kind=kind, title=title or "", text=text or "",
                                 meta=meta if isinstance(meta, dict) else json.loads(meta or "{}"))
            out_ids.append(doc_id)
            out_blocks.append(_blocks_columns(doc, doc.text)[0])
        with conn.transaction():
            conn.execute("UPDATE documents d SET blocks = v.b::jsonb, blocks_version = %s"
                         " FROM unnest(%s::bigint[], %s::text[]) AS v(id, b) WHERE d.id = v.id",
                         (BLOCKS_VERSION, out_ids, out_blocks))
    return len(ids)


@dataclass
class _Batch:
    rows: list[tuple] = field(default_factory=list)
    paths: set[str] = field(default_factory=set)
    gone: list[str] = field(default_factory=list)     # document paths to delete (before the upsert)
    chars: int = 0                                    # length of the texts in rows


# What one bad row can raise (a value the server or the client encoding refuses); anything else (the
# connection lost, a bug) stops the run as before.
_ROW_ERRORS = (psycopg.DataError, psycopg.errors.ProgramLimitExceeded, UnicodeError, ValueError, TypeError)


def write_batch(conn: psycopg.Connection, source_key: str, commit: str | None, batch: _Batch) -> None:
    """Write a batch in one transaction. When a row makes it fail, the batch is written again one row per
    transaction and each row that still fails is recorded as a skip (reason write-error) instead: one bad
    document never costs the others."""
    if not batch.rows and not batch.gone:
        return
    try:
        _write(conn, source_key, commit, batch.rows, batch.gone)
        return
    except _ROW_ERRORS as exc:
        if not batch.rows:
            raise
        log.warning("writing a batch of %s failed (%s): writing its rows one by one", source_key, exc)
    _write(conn, source_key, commit, [], batch.gone)
    for row in batch.rows:
        try:
            _write(conn, source_key, commit, [row], [])
        except _ROW_ERRORS as exc:
            name = clean_text(escape_surrogates(row[0]))
            log.warning("document %s of %s cannot be stored: %s", name, source_key, exc)
            detail = clean_text(escape_surrogates(f"cannot be stored: {type(exc).__name__}: {exc}"))
            try:
                _write(conn, source_key, commit, [_skip_row(Skip(name, "write-error", detail), row[6])], [])
            except _ROW_ERRORS:
                log.exception("document %s of %s: not even its skip can be stored", name, source_key)


def _write(conn: psycopg.Connection, source_key: str, commit: str | None, rows: list[tuple],
           gone: list[str]) -> None:
    with conn.transaction():
        if gone:
            conn.execute("DELETE FROM documents WHERE source_key = %s AND path = ANY(%s)", (source_key, gone))
        if rows:
            params: dict = {"key": source_key, "commit": commit}
            for i, col in enumerate(_COLUMNS):
                params[col] = [r[i] for r in rows]
            conn.execute(_UPSERT, params)
            # The parse's normalised fields as columns (status, dates, tags), in the same transaction.
            from kb_assets.pipeline.document_fields import write_fields

            write_fields(conn, source_key, [(r[0], r[1], json.loads(r[8]), r[6]) for r in rows if r[3] == "active"])
            # The document's relations are part of its version: written in the same transaction.
            from kb_assets.pipeline.relations import replace_document_edges

            replace_document_edges(conn, source_key, [(r[0], r[1], r[8] if r[3] == "active" else None, r[9])
                                                      for r in rows])


class _BatchWriter:
    """Writes batches in order on a thread of its own, at most one batch behind the one being written
    (memory: the batch being filled, one waiting, one being written)."""

    def __init__(self, conn: psycopg.Connection, source_key: str, commit: str | None):
        self.conn, self.source_key, self.commit = conn, source_key, commit
        self.queue: queue.Queue[_Batch | None] = queue.Queue(maxsize=1)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"kb-documents-writer-{source_key}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            batch = self.queue.get()
            if batch is None:
                return
            if self.error is not None:
                continue        # drain: after a failure nothing more is written
            try:
                write_batch(self.conn, self.source_key, self.commit, batch)
            except BaseException as exc:  # handed to the reading thread, which raises it
                self.error = exc

    def add(self, batch: _Batch, row: tuple) -> _Batch:
        """Append a row; a path already in the batch goes into the next one (one upsert statement cannot
        touch a row twice, and the later version must win as it did row by row)."""
        if row[0] in batch.paths:
            self.submit(batch)
            batch = _Batch()
        batch.rows.append(row)
        batch.paths.add(row[0])
        batch.chars += len(row[9] or "")
        return batch

    def submit(self, batch: _Batch) -> None:
        if self.error is not None:
            raise self.error     # the writer stopped at a failed batch: stop reading too
        if batch.rows or batch.gone:
            self.queue.put(batch)

    def close(self, *, raise_error: bool = True) -> None:
        """Wait until the batches handed over are written (each is its own transaction, so whatever
        stops the run leaves a consistent state); then raise the writer's error, if any."""
        if self.thread.is_alive():
            self.queue.put(None)
            self.thread.join()
        if raise_error and self.error is not None:
            raise self.error


def _no_nul(text: str) -> str:
    # PostgreSQL text and jsonb cannot hold NUL; readers skip binary files, this is the last guard.
    return text.replace("\x00", "") if "\x00" in text else text


def source_root_exists(cfg: KbConfig, source: SourceConfig) -> bool:
    return Path(cfg.source_root(source)).is_dir()
