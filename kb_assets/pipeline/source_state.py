"""Nothing changed costs nothing: a cheap fingerprint of everything that could change a source's index.

`kb index` computes it per source before Dagster is imported, compares it with the one recorded by the
source's last complete, successful run (table `source_state`, migration 012) and, when they are equal,
reports the source unchanged without a run: no Dagster import, no model, no call.

What the fingerprint covers
- the source's content: for a git source that indexes commits (`content: HEAD`) the commit it would be
  indexed at; otherwise the listing the documents stage would make (paths with size:mtime signatures, the
  recorded skips, and for a git working tree the HEAD commit: `git ls-files --others` sees new untracked
  files, stat sees edits);
- the source's settings and every global setting (embedder, signposter, models, query settings... the whole
  kb.yaml except the other sources);
- kb's own code and schema (path, size and mtime of every file of the package: an upgrade, or a checkout of
  other code in an editable install, runs everything again);
and, not fingerprinted but required for "unchanged", that the projections' T0 file still exists (the tier
files are rebuilt when someone deleted them).

When it is recorded (record_if_complete): after the source's run succeeded, with no pending work left in
kb's tables (documents not chunked, chunks without a vector in the active space, signposts to retry). The
documents stage forgets the record when any run of the source starts (UI, sensor, schedule, CLI), so a run
that failed, was killed mid-embedding or was started elsewhere always leads to a real run.

Racy files (git's racy-clean rule, done as git does): a file written twice within one timestamp tick keeps
its size:mtime, so a signature is only proof of the content when the file was read after its mtime's tick
had ended. The documents stage stores the signature of a file it read within RACY_SECONDS of its mtime
"smudged" (`racy:<size>:<mtime>`, racy_sig): it never equals a listing's signature, so the next run reads
the file again (and finds it unchanged by its content hash: no downstream work). The fast path settles such
rows before it trusts an equal fingerprint (settle_racy): once the window has passed and the file still has
that signature, its content is read again and compared with what was indexed; equal → the row gets its
plain signature and the source may be skipped; otherwise (too recent, changed, different) → a real run.

The listing the fingerprint was taken from is handed to the documents stage of the run that follows in the
same process (offer_listing / take_listing): a folder is listed once per `kb index`, and the fingerprint is
the listing that run indexed.

Not covered (use `kb index --force`): someone editing kb's tables by hand, upgrades of dependencies.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psycopg

    from kb_assets.config import KbConfig, SourceConfig

STATE_VERSION = 1          # bump when what the fingerprint covers changes
RACY_SECONDS = 2.0         # coarsest file timestamp granularity we care about (FAT, some network mounts)
RACY_PREFIX = "racy:"      # a stored file signature not to be trusted (read within RACY_SECONDS of its mtime)
_CODE_SUFFIXES = (".py", ".sql", ".html", ".txt", ".md", ".jsonl", ".json", ".yaml", ".yml")


@dataclass
class SourceState:
    source: str
    fingerprint: str | None            # None: not computable or not to be trusted (see `why`)
    why: str = ""                      # why fingerprint is None
    details: dict = field(default_factory=dict)
    projections_present: bool = True   # the T0 tier file exists (else a run rebuilds the projections)
    listing: object = field(default=None, repr=False, compare=False)   # the Listing taken (listing mode)
    listing_key: str = ""              # what the listing depends on (_listing_key)


_code_version: str | None = None


def code_version() -> str:
    """A digest of kb's installed code and migrations (path, size, mtime_ns of each file) and Python's version."""
    global _code_version
    if _code_version is None:
        pkg = Path(__file__).resolve().parent.parent
        h = hashlib.sha256(f"{sys.version_info[:3]}\0{STATE_VERSION}\n".encode())
        for dirpath, dirnames, filenames in os.walk(pkg):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
            for name in sorted(filenames):
                if name.endswith(_CODE_SUFFIXES):
                    p = os.path.join(dirpath, name)
                    st = os.stat(p)
                    h.update(f"{os.path.relpath(p, pkg)}\0{st.st_size}:{st.st_mtime_ns}\n".encode())
        _code_version = h.hexdigest()[:16]
    return _code_version


def settings_digest(cfg: KbConfig, source: SourceConfig) -> str:
    """The source's settings, its resolved root, every setting outside `sources`, and which config file they
    came from, however it was named: `kb.yaml` from its folder, its absolute path and a symlink to it are the
    same file (named differently, a nothing-changed pass used to run the whole job, and record the other name)."""
    glob = cfg.model_dump_json(exclude={"sources"})
    own = source.model_dump_json()
    return hashlib.sha256(f"{glob}\0{own}\0{cfg.source_root(source)}\0{_config_file(cfg)}".encode(
        "utf-8", "surrogateescape")).hexdigest()[:16]


def _config_file(cfg: KbConfig) -> str:
    """The config file's real path ("<default>" and other placeholders as they are) and its data folder's."""
    path = str(cfg.config_path)
    if not path.startswith("<"):
        path = os.path.realpath(path)
    return f"{path}\0{os.path.realpath(cfg.data_path())}"


def _mtime_ns(sig: str) -> int | None:
    """The mtime of a worktree signature "size:mtime_ns" (None for a git blob id)."""
    size, sep, mtime = sig.partition(":")
    return int(mtime) if sep and mtime.isdigit() else None


def racy_sig(sig: str, read_started_ns: int) -> str:
    """The signature to store for a file whose read started at read_started_ns: smudged (never equal to a
    listing's) when the read may have begun within the tick of the file's mtime, or the mtime is ahead."""
    m = _mtime_ns(sig)
    if m is not None and m >= read_started_ns - int(RACY_SECONDS * 1e9):
        return RACY_PREFIX + sig
    return sig


def source_fingerprint(cfg: KbConfig, source: SourceConfig) -> SourceState:
    """The source's fingerprint now (never raises: a problem means "run", where the job reports it)."""
    from kb_assets.sources import discovery

    try:
        root = cfg.source_root(source)
        details: dict = {"state_version": STATE_VERSION, "code": code_version(),
                         "settings": settings_digest(cfg, source)}
        listing = None
        h = hashlib.sha256()
        if (discovery.source_enabled(source) and source.content == "HEAD" and root.is_dir()
                and not discovery.refused_repository(root) and discovery._git_mode(root, source)):
            commit = discovery.tip_commit(root, source)
            details.update(mode="git-commit", commit=commit)
            if commit is None:
                return SourceState(source.key, None, "no commit to index yet", details)
        else:
            listing = discovery.list_source(root, source)
            details.update(mode="listing", commit=listing.commit, files=len(listing.files),
                           skips=len(listing.skips), complete=listing.complete)
            for e in listing.files:
                h.update(f"{e.path}\0{e.sig}\n".encode("utf-8", "surrogateescape"))
            for s in listing.skips:
                h.update(f"skip\0{s.path}\0{s.reason}\0{s.detail}\n".encode("utf-8", "surrogateescape"))
            details["listing"] = h.hexdigest()[:16]
        h.update(json.dumps(details, sort_keys=True, default=str).encode())
        state = SourceState(source.key, h.hexdigest(), "", details, listing=listing,
                            listing_key=_listing_key(cfg, source))
        # not part of the fingerprint (the first run creates them): a precondition of "unchanged"
        state.projections_present = (cfg.projections_path() / "index.dsl").is_file()
        return state
    except Exception as exc:   # TooManyFiles, a root that became unsafe...: the run says it properly
        return SourceState(source.key, None, f"{type(exc).__name__}: {exc}")


_offered: SourceState | None = None


def offer_listing(state: SourceState | None) -> None:
    """The listing of `state` is the one the next documents stage of its source in this process uses
    (None: withdraw it). `kb index` offers it just before the source's run and withdraws it after."""
    global _offered
    _offered = state if state is not None and state.listing is not None else None


def offered_files(source_key: str) -> int | None:
    """How many files the listing offered for this source holds (None: none offered); it stays offered."""
    state = _offered
    if state is None or state.source != source_key:
        return None
    return len(state.listing.files)


def take_listing(cfg: KbConfig, source: SourceConfig):
    """The offered listing of this source with these settings and root (once), or None: list it yourself."""
    global _offered
    state, _offered = _offered, None
    if state is None or state.source != source.key or state.listing_key != _listing_key(cfg, source):
        return None
    return state.listing


def _listing_key(cfg: KbConfig, source: SourceConfig) -> str:
    """The settings a listing depends on: the source's, the global ones and the resolved root (not the path
    the config was named by: the CLI and the Dagster resource load the same kb.yaml by different names)."""
    return hashlib.sha256(f"{cfg.model_dump_json(exclude={'sources'})}\0{source.model_dump_json()}\0"
                          f"{cfg.source_root(source)}".encode("utf-8", "surrogateescape")).hexdigest()[:16]


def stored_fingerprint(conn: psycopg.Connection, source_key: str) -> str | None:
    row = conn.execute("SELECT fingerprint FROM source_state WHERE source_key = %s", (source_key,)).fetchone()
    return row[0] if row else None


def unchanged(conn: psycopg.Connection, state: SourceState, cfg: KbConfig, source: SourceConfig) -> bool:
    """True when the source is as its last complete, successful run left it."""
    return (state.fingerprint is not None and state.projections_present
            and stored_fingerprint(conn, state.source) == state.fingerprint
            and settle_racy(conn, cfg, source) is None)


def settle_racy(conn: psycopg.Connection, cfg: KbConfig, source: SourceConfig) -> str | None:
    """Verify the source's smudged rows (files read within their mtime's tick): None when there are none
    left, else why the index may not match them (then a real run reads them again). A file is settled when
    its tick is over, it still has the listed signature, and reading it now gives what was indexed."""
    rows = conn.execute(
        "SELECT path, file_sig, content_hash, status, skip_reason FROM documents"
        " WHERE source_key = %s AND file_sig LIKE %s", (source.key, RACY_PREFIX + "%")).fetchall()
    if not rows:
        return None
    from kb_assets.models import Skip
    from kb_assets.pipeline.documents import _file_of, _storable
    from kb_assets.sources.discovery import FileEntry, stat_sig
    from kb_assets.sources.readers import read_entry

    by_file: dict[str, list] = {}
    for row in rows:
        by_file.setdefault(_file_of(row[0]), []).append(row)
    root = cfg.source_root(source)
    window_ns = int(RACY_SECONDS * 1e9)
    settled: list[tuple[str, str]] = []     # (path, plain signature)
    for file, file_rows in by_file.items():
        sigs = {r[1] for r in file_rows}
        if len(sigs) != 1:
            return f"{file}: rows with different signatures"
        sig = sigs.pop()[len(RACY_PREFIX):]
        mtime = _mtime_ns(sig)
        if mtime is None or time.time_ns() - mtime < window_ns:
            return f"{file} was modified within {RACY_SECONDS:.0f} s"
        try:
            st = os.stat(root / file)
        except OSError:
            return f"{file} is gone"
        if stat_sig(st) != sig:
            return f"{file} changed since it was read"
        try:
            result = read_entry(root, FileEntry(file, sig), source)
        except Exception as exc:
            return f"{file}: {type(exc).__name__}"
        have = {r[0]: (r[3], r[4] if r[3] == "skipped" else r[2]) for r in file_rows}
        if isinstance(result, Skip):
            now = {file: ("skipped", result.reason)}
        else:
            now = {d.path: ("active", d.content_hash) for d in (_storable(doc, file, file) for doc in result)}
        if now != have:
            return f"{file} differs from what was indexed"
        settled.extend((r[0], sig) for r in file_rows)
    with conn.transaction():
        for path, sig in settled:
            conn.execute("UPDATE documents SET file_sig = %s WHERE source_key = %s AND path = %s"
                         " AND file_sig = %s", (sig, source.key, path, RACY_PREFIX + sig))
    return None


def forget(conn: psycopg.Connection, source_key: str) -> dict | None:
    """A run of the source starts: until it completes, the source must not be taken for unchanged. Returns
    the details its last complete run recorded (None: none was)."""
    with conn.transaction():
        row = conn.execute("DELETE FROM source_state WHERE source_key = %s RETURNING details",
                           (source_key,)).fetchone()
    return row[0] if row else None


def pending_work(conn: psycopg.Connection, source_key: str, coverage: dict | None = None) -> str | None:
    """What a re-run would still do for the source (None: nothing): documents not chunked, chunks without
    a vector in the active space, signposts to generate or retry (parked ones wait for a change).

    `coverage`: a health.chunk_coverage taken since the source's last write (the direct run's checks take one):
    its count of the source's chunks without a vector is used instead of counting again, when it was taken
    of the active space. Another run can only add vectors meanwhile (this source's lock is held), so a count
    read earlier never hides a missing one."""
    from kb_assets.store import spaces

    unchunked, unsignposted = conn.execute(
        """SELECT count(*) FILTER (WHERE d.chunked_hash IS DISTINCT FROM d.content_hash),
                  count(*) FILTER (WHERE (st.content_hash IS DISTINCT FROM d.content_hash
                                          OR COALESCE(st.stale OR st.failures > 0, false))
                                   AND NOT (COALESCE(st.parked, false) AND st.failed_hash = d.content_hash))
             FROM documents d LEFT JOIN signpost_state st ON st.document_id = d.id
            WHERE d.source_key = %s AND d.status = 'active' AND d.content_hash IS NOT NULL""",
        (source_key,)).fetchone()
    if unchunked:
        return f"{unchunked} documents not chunked"
    if unsignposted:
        return f"{unsignposted} documents without a current signpost"
    active = spaces.active_space(conn)
    if active is None:
        has_chunks = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM chunks c JOIN documents d ON d.id = c.document_id"
            " WHERE d.source_key = %s)", (source_key,)).fetchone()[0]
        return "chunks and no active vector space" if has_chunks else None
    from kb_assets.store.health import source_counts

    counts = source_counts(coverage, active[2], source_key) or spaces.chunks_without_vector(conn, active[2], source_key)
    missing = counts[1]
    return f"{missing} chunks without a vector" if missing else None


def record_if_complete(conn: psycopg.Connection, state: SourceState, coverage: dict | None = None) -> str | None:
    """Record the fingerprint taken before the source's successful run; returns why not, or None.
    `coverage`: see pending_work."""
    if state.fingerprint is None:
        return state.why or "no fingerprint"
    why = pending_work(conn, state.source, coverage)
    if why:
        return why
    from psycopg.types.json import Json

    with conn.transaction():
        conn.execute(
            "INSERT INTO source_state (source_key, fingerprint, details, recorded_at)"
            " SELECT %s, %s, %s, now() WHERE EXISTS (SELECT 1 FROM sources WHERE key = %s)"
            " ON CONFLICT (source_key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint,"
            " details = EXCLUDED.details, recorded_at = now()",
            (state.source, state.fingerprint, Json(state.details), state.source))
    return None
