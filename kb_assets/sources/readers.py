"""read_entry: one listed file -> SourceDocument(s) (text redacted) or a Skip with a reason.

Content comes from the working tree (opened read-only, re-checked to be a regular file inside the root),
or in HEAD mode from the committed blob (`git cat-file blob <entry.sig>`, or a BlobReader's one
`git cat-file --batch` for a whole run), never more than the size bound.

Kind: source.kind, or per path when source.auto_kind (see classify.auto_kind_for; a PEP header also makes
a doc an adr). Order of work for text kinds: decode (binary / not-utf8 skips) -> generated marker ->
line-length policy -> redact the raw text -> parse metadata -> min_chars (too-small) -> document.

Line-length policy (max_line_chars): code with a longer line is skipped ("line-too-long": minified or
data); prose kinds keep the file and cut the long line with a visible marker (a pasted log or a data: URI
should not cost the whole note), meta['long_lines_cut'] counts them; transcripts and work items are JSON
lines where long lines are normal: transcripts have their own 5 MB per-line cap, work items none.

Dates, in order: front matter (date / created / updated), the document's own header (ADR Date line or
table, PEP Created), the file name (2026-01-31-topic.md, 20260131_x.md), then git history: pass
git_dates=discovery.git_file_dates(root, source) (one git process per source) to read_entry.
meta['date_source'] says which one was used.
"""
from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from kb_assets.models import Skip, SourceDocument
from kb_assets.sources import classify
from kb_assets.sources.content import (
    SNIFF_BYTES, DecodeError, decode_text, generated_marker, longest_line, minified, sniff_binary,
    truncate_long_lines,
)
from kb_assets.sources.decisions import is_pep, parse_adr, parse_pep
from kb_assets.sources.discovery import FileEntry, effective_max_bytes, source_enabled
from kb_assets.sources.gitutil import BlobReader, GitError, git_env, is_sha, read_blob
from kb_assets.sources.redaction import config_style_for, merge_counts, redact
from kb_assets.sources.roots import is_never_read
from kb_assets.sources.sections import render_sections
from kb_assets.sources.textutil import (
    as_list, date_from_name, first_title, normalize_date, split_front_matter, title_from_path,
)
from kb_assets.sources.transcripts import TranscriptError, read_transcript
from kb_assets.sources.work_items import WorkItemError, iter_items, normalize_item, references, render_item

if TYPE_CHECKING:
    from kb_assets.config import SourceConfig

GitDates = dict[str, tuple[str, str]]


class _SkipNow(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def read_entry(root: Path, entry: FileEntry, source: SourceConfig,
               git_dates: GitDates | None = None, blobs: BlobReader | None = None) -> list[SourceDocument] | Skip:
    """Read one listed file. Never raises for bad input: every problem is a Skip with a reason.
    `blobs`: a BlobReader on root for HEAD-mode reads of many files (else one git process per blob)."""
    root = Path(root)
    path = entry.path
    if not source_enabled(source):
        return Skip(path, "disabled", "the source is not enabled (memory sources need `enabled: true`)")
    kind = classify.kind_for(path, source.kind, source.auto_kind)
    limit = effective_max_bytes(source, kind)
    try:
        if kind == "transcript":
            return _read_transcript_entry(root, entry, source, limit)
        data = _read_bytes(root, entry, source, limit, blobs)
        try:
            text = decode_text(data)
        except DecodeError as exc:
            return Skip(path, exc.reason, exc.detail)
        del data
        if kind == "work_item":
            return _work_items(path, text)
        if kind == "code":
            return _code(path, text, source)
        if path.lower().endswith(".ipynb"):
            return _notebook(path, text, kind, source, git_dates)
        return _prose(path, text, kind, source, git_dates)
    except _SkipNow as exc:
        return Skip(path, exc.reason, exc.detail)
    except OSError as exc:    # read() itself failed (EIO, EINVAL on pseudo files, a vanished mount...)
        return Skip(path, "unreadable", f"cannot read: {exc.strerror or exc}")


# --- reading bytes ----------------------------------------------------------------------------------

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
_PROC_FD = "/proc/self/fd/"
_FAST_OPEN = bool(getattr(os, "O_NOFOLLOW", 0)) and os.path.isdir(_PROC_FD)   # Linux


def _open_worktree(root: Path, path: str) -> IO[bytes]:
    full = os.path.join(root, *path.split("/"))
    f = _open_worktree_fast(root, full)
    return f if f is not None else _open_worktree_checked(root, full)


def _open_worktree_fast(root: Path, full: str) -> IO[bytes] | None:
    """The common case in two system calls: open the path as listed (the last component must not be a
    symlink), and ask the kernel where the opened file really is (/proc/self/fd: the path of the file
    actually opened, so no race between the check and the open). Only a regular file inside the root is
    accepted; anything else (a final symlink, a missing /proc, outside the root...) returns None and
    goes through _open_worktree_checked, which decides the skip exactly as before."""
    if not _FAST_OPEN:
        return None
    try:
        fd = os.open(full, _OPEN_FLAGS)
    except OSError:
        return None
    try:
        real = os.readlink(_PROC_FD + str(fd))
        realroot = os.path.realpath(root)
        if (real == realroot or real.startswith(realroot.rstrip(os.sep) + os.sep)) \
                and not is_never_read(real) and stat.S_ISREG(os.fstat(fd).st_mode):
            return os.fdopen(fd, "rb")
    except OSError:
        pass
    os.close(fd)
    return None


def _open_worktree_checked(root: Path, full: str) -> IO[bytes]:
    try:
        real = os.path.realpath(full, strict=True)
    except FileNotFoundError:
        raise _SkipNow("unreadable", "the file disappeared before it could be read") from None
    except (OSError, RuntimeError) as exc:
        raise _SkipNow("not-regular-file", f"symlink loop or unresolvable path ({exc})") from None
    realroot = os.path.realpath(root)
    if not (real == realroot or real.startswith(realroot.rstrip(os.sep) + os.sep)):
        raise _SkipNow("symlink-outside-root", f"resolves to {real}, outside the source root")
    if is_never_read(real):
        raise _SkipNow("system-file", f"{real}: /proc, /sys and /dev are never read")
    try:
        fd = os.open(real, _OPEN_FLAGS)
    except OSError as exc:
        raise _SkipNow("unreadable", f"cannot open: {exc.strerror or exc}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _SkipNow("not-regular-file", "not a regular file (folder, fifo, socket or device)")
    return os.fdopen(fd, "rb")


def _read_bytes(root: Path, entry: FileEntry, source: SourceConfig, limit: int,
                blobs: BlobReader | None = None) -> bytes:
    if source.content == "HEAD" and is_sha(entry.sig):
        try:
            data = blobs.read(entry.sig, limit) if blobs is not None else read_blob(root, entry.sig, limit)
        except GitError as exc:
            raise _SkipNow("unreadable", str(exc)[:300]) from None
        if data is None:
            raise _SkipNow("too-large", f"committed blob is over max_file_bytes ({limit:,})")
        return data
    # Worktree mode, or a HEAD-mode listing that fell back to walking (size:mtime signature).
    with _open_worktree(root, entry.path) as f:
        # f.read(limit + 1) would allocate limit + 1 bytes for every file; asking for the size the file
        # has, plus one byte to see whether it grew since, returns the same bytes.
        size = os.fstat(f.fileno()).st_size
        data = f.read(min(size, limit) + 1)
        if len(data) == size + 1 and size < limit:
            data += f.read(limit + 1 - len(data))
    if len(data) > limit:
        raise _SkipNow("too-large", f"over max_file_bytes ({limit:,} bytes)")
    return data


class _BlobStream:
    """`git cat-file blob` stdout as a binary stream (transcripts in HEAD mode)."""

    def __init__(self, root: Path, sha: str):
        self.proc = subprocess.Popen(["git", "cat-file", "blob", sha], cwd=str(root), stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=git_env())
        self.stream = self.proc.stdout

    def __enter__(self) -> IO[bytes]:
        assert self.stream is not None
        return self.stream

    def __exit__(self, *exc: Any) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        if self.stream:
            self.stream.close()
        self.proc.wait()


def _read_transcript_entry(root: Path, entry: FileEntry, source: SourceConfig, limit: int
                           ) -> list[SourceDocument] | Skip:
    path = entry.path
    ctx = _BlobStream(root, entry.sig) if (source.content == "HEAD" and is_sha(entry.sig)) else \
        _open_worktree(root, path)
    with ctx as stream:
        head = stream.peek(SNIFF_BYTES)[:SNIFF_BYTES] if hasattr(stream, "peek") else b""
        why = sniff_binary(head, nul_is_binary=False)
        if why:
            return Skip(path, "binary", why)
        try:
            title, text, meta = read_transcript(stream, path)
        except TranscriptError as exc:
            return Skip(path, exc.reason, exc.detail)
    if len(text.strip()) < source.min_chars:
        return Skip(path, "too-small", f"{len(text.strip())} characters of conversation (< min_chars "
                                        f"{source.min_chars})")
    meta["date_source"] = "transcript" if meta.get("date") else None
    meta = {k: v for k, v in meta.items() if v is not None}
    return [SourceDocument(path=path, kind="transcript", title=title, text=text, meta=meta)]


# --- kinds ------------------------------------------------------------------------------------------

def _code(path: str, text: str, source: SourceConfig) -> list[SourceDocument] | Skip:
    first_line = text[:200].split("\n", 1)[0]
    lang = classify.language_for_path(path, first_line)
    if lang is None:
        return Skip(path, "not-code", f"no programming language is known for {path.rsplit('/', 1)[-1]!r}")
    marker = generated_marker(text)
    if marker:
        return Skip(path, "generated", f"generated-code marker: {marker!r}")
    mini = minified(text)
    if mini:
        return Skip(path, "generated", mini)
    longest, line_no = longest_line(text)
    if longest > source.max_line_chars:
        return Skip(path, "line-too-long", f"line {line_no} has {longest:,} characters (max_line_chars "
                                           f"{source.max_line_chars:,}): minified or data, not code")
    if len(text.strip()) < source.min_chars:
        return Skip(path, "too-small", f"{len(text.strip())} characters (< min_chars {source.min_chars})")
    red, counts = redact(text, config_style=config_style_for(path))
    meta: dict[str, Any] = {"language": lang[0], "language_name": lang[1], "lines": red.count("\n") + 1,
                            "redactions": counts}
    return [SourceDocument(path=path, kind="code", title=path, text=red, meta=meta)]


def _work_items(path: str, text: str) -> list[SourceDocument] | Skip:
    counter = {"malformed": 0}
    docs: list[SourceDocument] = []
    seen: dict[str, int] = {}
    try:
        for n, obj in enumerate(iter_items(text, path, counter)):
            item = normalize_item(obj)
            ident = item["id"] or f"item-{n + 1}"
            if ident in seen:                      # duplicate ids in an export: keep them apart
                seen[ident] += 1
                ident = f"{ident}~{seen[ident]}"
            else:
                seen[ident] = 1
            item["id"] = ident
            rendered = render_item(item)
            red, counts = redact(rendered)
            title, tcounts = redact(item["title"] or f"Item {ident}")
            merge_counts(counts, tcounts)
            meta: dict[str, Any] = {
                "id": ident, "kind": item["kind"], "status": item["status"], "tags": item["tags"],
                "author": item["author"], "assignees": item["assignees"], "created": item["created"],
                "updated": item["updated"], "closed": item["closed"], "date": item["created"],
                "url": item["url"], "milestone": item["milestone"], "comment_count": item.get("comment_count"),
                "references": references(item, path), "redactions": counts,
            }
            if counter["malformed"]:
                meta["export_malformed_lines"] = counter["malformed"]
            meta = {k: v for k, v in meta.items() if v not in (None, [], "")}
            meta["redactions"] = counts
            docs.append(SourceDocument(path=f"{path}#{ident}", kind="work_item", title=title, text=red, meta=meta))
    except WorkItemError as exc:
        if not docs:
            return Skip(path, exc.reason, exc.detail)
    if not docs:
        return Skip(path, "too-small", f"no work items in the file ({counter['malformed']} malformed lines)")
    if counter["malformed"]:
        for d in docs:
            d.meta["export_malformed_lines"] = counter["malformed"]
    return docs


def _notebook(path: str, text: str, kind: str, source: SourceConfig, git_dates: GitDates | None
              ) -> list[SourceDocument] | Skip:
    """A notebook's markdown and code cells as a prose document (outputs dropped: see sources.notebooks)."""
    from kb_assets.sources.notebooks import NotebookError, render_notebook

    try:
        rendered, nb_meta = render_notebook(text)
    except NotebookError as exc:
        return Skip(path, "bad-notebook", str(exc))
    docs = _prose(path, rendered, kind, source, git_dates)
    if not isinstance(docs, Skip):
        for doc in docs:
            doc.meta.update(nb_meta)
    return docs


def _prose(path: str, text: str, kind: str, source: SourceConfig, git_dates: GitDates | None
           ) -> list[SourceDocument] | Skip:
    marker = generated_marker(text, head_lines=5) if kind in ("doc", "readme", "session") else None
    if marker:
        return Skip(path, "generated", f"generated-file marker: {marker!r}")
    text, cut_lines = truncate_long_lines(text, source.max_line_chars)
    red, counts = redact(text, config_style=config_style_for(path))
    front, body, fm_error = split_front_matter(red)
    meta: dict[str, Any] = {}
    pep = is_pep(body)
    if pep and source.auto_kind and kind in ("doc", "session"):
        kind = "adr"
    if len(body.strip()) < source.min_chars:
        return Skip(path, "too-small", f"{len(body.strip())} characters after front matter (< min_chars "
                                       f"{source.min_chars})")
    lines = body.split("\n")
    title = None
    if pep:
        meta.update(parse_pep(body, path))
        title = meta.pop("title", None)
    elif kind == "adr":
        meta.update(parse_adr(body, path, front))
        title = meta.pop("title", None)
    if kind == "agents_md":
        body, sections = render_sections(body)
        meta["sections"] = sections
    # Common front matter fields.
    fm_title = front.get("title") or (front.get("name") if kind == "memory" else None)
    if isinstance(fm_title, str) and fm_title.strip() and not title:
        title = fm_title.strip()
    for key in ("status", "author", "supersedes", "superseded_by", "type", "description", "summary"):
        v = front.get(key)
        if v not in (None, "", []) and key not in meta:
            meta[key] = v if isinstance(v, (str, int, float, bool)) else as_list(v)
            if key == "author" and isinstance(meta[key], list):
                meta["authors"] = meta[key]
                meta[key] = ", ".join(meta[key])
    tags = as_list(front.get("tags") or front.get("labels") or front.get("keywords") or front.get("categories"))
    if tags and not meta.get("tags"):
        meta["tags"] = tags
    if kind == "memory":
        for key in ("name", "description", "type"):
            if isinstance(front.get(key), str):
                meta["memory_" + key if key == "type" else key] = front[key]
        meta.pop("type", None)
    # Dates.
    date_source = None
    for key in ("date", "created", "updated"):
        d = normalize_date(front.get(key))
        if d:
            meta[key] = d
            date_source = date_source or "front_matter"
    if meta.get("date") or meta.get("created"):
        date_source = date_source or "document"
    if not meta.get("date"):
        d = meta.get("created") or date_from_name(path)
        if d:
            meta["date"] = d
            date_source = date_source or ("document" if meta.get("created") else "file_name")
    gd = git_dates.get(path) if git_dates else None
    if gd:
        first, last = normalize_date(gd[0]), normalize_date(gd[1])
        meta.setdefault("created", first)
        meta.setdefault("updated", last)
        if not meta.get("date"):
            meta["date"] = first
            date_source = "git"
    if date_source:
        meta["date_source"] = date_source
    if not title:
        title = first_title(lines) or (f"README ({path.rsplit('/', 1)[0]})" if kind == "readme" and "/" in path
                                           else title_from_path(path))
    if fm_error:
        meta["front_matter_error"] = fm_error
    if cut_lines:
        meta["long_lines_cut"] = cut_lines
    meta["redactions"] = counts
    meta = {k: v for k, v in meta.items() if v is not None}
    return [SourceDocument(path=path, kind=kind, title=str(title)[:500], text=body, meta=meta)]
