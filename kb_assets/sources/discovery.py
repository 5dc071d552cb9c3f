"""Discovery: which files a source has, each with a cheap change signature, and why others are skipped.

How a source is listed
- Root inside a git work tree (and not in a git-ignored folder): git decides what exists.
  * content "HEAD": `git ls-tree -r -l HEAD` under root. sig = the blob id. Untracked and modified
    working-tree files are invisible: what is indexed is what is committed.
  * content "worktree": `git ls-files --cached --others --exclude-standard` under root (tracked files plus
    untracked files that are not ignored). sig = f"{size}:{mtime_ns}" from stat. Files deleted from the
    working tree but still in the index are omitted (they are gone).
- Otherwise the folder is walked (os.walk, followlinks=False, visited real folders tracked by (dev, inode)
  so bind-mount loops end). "HEAD" on a folder that is not a git work tree falls back to this walk and the
  Listing has commit None.

Filters, in order: cache/tool folders (.git, __pycache__, .mypy_cache, ...) are dropped silently; exclude
globs, then include globs (see globs.py; an empty include takes everything) drop silently; then recorded
skips: vendored folders (one Skip per folder, not per file; an include pattern that names the folder
overrides), lock files and generated-by-name files, binary extensions, not-code (kind code only),
symlinks whose target leaves the root, symlink loops / sockets / submodules (not-regular-file), and files
over the size bound (too-large, decided from stat or the tree's blob size: nothing is read).
Content checks (binary sniff, UTF-8, generated markers, line length, too-small) happen in readers.

Size bound: source.max_file_bytes; for transcript and work_item sources that did not set it explicitly,
512 MB and 64 MB (transcripts are streamed line by line; a 2 MB default would skip most of them).

changes_since: committed changes only (`git diff --name-status -z -M old HEAD`, limited to root). It returns
None — the caller then does a full listing — when old_commit is unknown (force-push + gc), when old_commit
is not an ancestor of the new tip (force-push, history rewrite), when root is not
a git work tree, or when the source reads the working tree ("worktree" mode: uncommitted edits, untracked
files and reverted edits are not in any diff; a full listing with size:mtime signatures is cheap and exact).

Memory sources are opt-in: a source of kind "memory" is listed only when `enabled: true` was written
explicitly; otherwise the listing is empty, incomplete (nothing is pruned) and carries one Skip "disabled".
"""
from __future__ import annotations

import os
import posixpath
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kb_assets.models import Skip
from kb_assets.sources import classify
from kb_assets.sources.globs import GlobSet
from kb_assets.sources.roots import TooManyFiles, check_root, is_never_read, max_files_for
from kb_assets.sources.gitutil import (
    GitError, commit_exists, head_commit as _head_commit, root_is_ignored, run_git, work_tree_top, z_split,
    cat_blobs, iter_log_names, current_branch, is_ancestor, refused_repository, resolve_commit,
)

if TYPE_CHECKING:  # no runtime import: kb_assets.config imports nothing from here, and vice versa
    from kb_assets.config import SourceConfig

TRANSCRIPT_DEFAULT_MAX_BYTES = 512 * 1024 * 1024
WORK_ITEM_DEFAULT_MAX_BYTES = 64 * 1024 * 1024


@dataclass
class FileEntry:
    path: str   # POSIX, relative to the source root
    sig: str    # git blob id at HEAD, or f"{size}:{mtime_ns}" in worktree mode


@dataclass
class Listing:
    files: list[FileEntry]
    skips: list[Skip]
    commit: str | None
    complete: bool


@dataclass
class GitChanges:
    added: list[str] = field(default_factory=list)
    modified: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    renamed: list[tuple[str, str]] = field(default_factory=list)   # (old path, new path)


def stat_sig(st: os.stat_result) -> str:
    """A working-tree file's signature "size:mtime_ns" (a git-tracked file at a commit has its blob id)."""
    return f"{st.st_size}:{st.st_mtime_ns}"


def head_commit(root: Path) -> str | None:
    """The commit HEAD points at, or None (not a git repository, or no commit yet)."""
    return _head_commit(Path(root))


def tip_ref(root: Path, source: SourceConfig) -> str:
    """The ref a content-HEAD source indexes: HEAD, or the configured branch (local, or <remote>/<branch>
    after the sensor's fetch). Without `branch:` the checkout's current branch is meant."""
    if not source.branch and not source.remote:
        return "HEAD"
    branch = source.branch or current_branch(root) or "HEAD"
    if source.remote:
        return f"refs/remotes/{source.remote}/{branch}"
    return f"refs/heads/{branch}" if branch != "HEAD" else "HEAD"


def tip_commit(root: Path, source: SourceConfig) -> str | None:
    """The commit a content-HEAD source indexes (see tip_ref), or None."""
    ref = tip_ref(Path(root), source)
    return head_commit(root) if ref == "HEAD" else resolve_commit(Path(root), ref)


def source_enabled(source: SourceConfig) -> bool:
    """Memory sources need an explicit `enabled: true`; other sources just `enabled`."""
    if not source.enabled:
        return False
    if source.kind == "memory":
        return "enabled" in source.model_fields_set
    return True


def effective_max_bytes(source: SourceConfig, kind: str | None = None) -> int:
    kind = kind or source.kind
    if "max_file_bytes" not in source.model_fields_set:
        if kind == "transcript":
            return max(source.max_file_bytes, TRANSCRIPT_DEFAULT_MAX_BYTES)
        if kind == "work_item":
            return max(source.max_file_bytes, WORK_ITEM_DEFAULT_MAX_BYTES)
    return source.max_file_bytes


class _Collector:
    def __init__(self, root: Path, source: SourceConfig):
        self.root = root
        self.realroot = Path(os.path.realpath(root))
        # realpath() results are normalised absolute paths: a string prefix test is _inside() without
        # building a Path per file
        self._realroot_str = str(self.realroot)
        self._realroot_prefix = self._realroot_str.rstrip(os.sep) + os.sep
        self.source = source
        self.globs = GlobSet(source.include, source.exclude)
        self.include_mentions = frozenset(
            seg for p in source.include for seg in p.split("/") if seg in classify.VENDORED_DIRS
        )
        self.files: list[FileEntry] = []
        self.skips: dict[str, Skip] = {}
        self.complete = True
        self.max_files = max_files_for(source)
        # Only a root that contains them can reach /proc, /sys or /dev (the walk follows no symlink).
        self.guard_pseudo = self._realroot_str == "/" or any(p.startswith(self._realroot_prefix)
                                                             for p in ("/proc/", "/sys/", "/dev/"))
        self._real_dirs: dict[str, str] = {}     # folder -> its realpath (see _realpath)

    def add(self, entry: FileEntry) -> None:
        self.files.append(entry)
        if self.max_files is not None and len(self.files) > self.max_files:
            raise TooManyFiles(self.source, self.max_files)

    def skip(self, s: Skip) -> None:
        self.skips.setdefault(s.path, s)

    def wanted(self, path: str) -> str | None:
        """The file's kind when the path passes the filters; None when dropped (a Skip may be recorded)."""
        if classify.cache_dir(path) is not None:
            return None
        if self.globs.excluded(path) or not self.globs.included(path):
            return None
        kind = classify.kind_for(path, self.source.kind, self.source.auto_kind)
        s = classify.name_skip(path, kind=kind, include_mentions=self.include_mentions)
        if s is not None:
            self.skip(s)
            return None
        return kind

    def size_ok(self, path: str, size: int, kind: str) -> bool:
        limit = effective_max_bytes(self.source, kind)
        if size > limit:
            self.skip(Skip(path, "too-large", f"{size:,} bytes is over max_file_bytes ({limit:,})"))
            return False
        return True

    def _realpath(self, full: str, lst: os.stat_result) -> str:
        """os.path.realpath(full, strict=True), with each folder resolved once: a file that is no symlink is its
        folder's realpath plus its name. realpath() lstat()s every component of the path, in Python: listing the
        3,000-file synthetic source took 60-80 ms with it per file, 41-61 ms this way (the PEPs: 17-26 -> 11-15 ms),
        in every pass (docs/BENCHMARKS.md, "Small passes: connections handed on")."""
        if stat.S_ISLNK(lst.st_mode):
            return os.path.realpath(full, strict=True)
        folder, name = os.path.split(full)
        real = self._real_dirs.get(folder)
        if real is None:
            real = self._real_dirs[folder] = os.path.realpath(folder, strict=True)
        return os.path.join(real, name)

    def consider_worktree_file(self, path: str) -> None:
        """stat-based entry for a root-relative path (git worktree mode, walk mode, list_paths)."""
        kind = self.wanted(path)
        if kind is None:
            return
        full = os.path.join(self.root, *path.split("/"))
        try:
            lst = os.lstat(full)
        except FileNotFoundError:
            return  # deleted from the working tree: gone, not skipped
        except OSError as exc:
            self.skip(Skip(path, "unreadable", f"cannot stat: {exc.strerror or exc}"))
            return
        try:
            real = self._realpath(full, lst)
        except FileNotFoundError:
            self.skip(Skip(path, "not-regular-file", "broken symlink (its target does not exist)"))
            return
        except (OSError, RuntimeError) as exc:
            self.skip(Skip(path, "not-regular-file", f"symlink loop or unresolvable path ({exc})"))
            return
        if not (real == self._realroot_str or real.startswith(self._realroot_prefix)):   # _inside, on strings
            self.skip(Skip(path, "symlink-outside-root", f"resolves to {real}, outside the source root"))
            return
        if self.guard_pseudo and is_never_read(real):
            self.skip(Skip(path, "system-file", f"{real}: /proc, /sys and /dev are never read"))
            return
        try:
            st = os.stat(real)
        except OSError as exc:
            self.skip(Skip(path, "unreadable", f"cannot stat: {exc.strerror or exc}"))
            return
        if not stat.S_ISREG(st.st_mode):
            what = "folder" if stat.S_ISDIR(st.st_mode) else "special file (fifo, socket or device)"
            if stat.S_ISDIR(st.st_mode) and stat.S_ISLNK(lst.st_mode):
                what = "symlink to a folder (not followed)"
            elif stat.S_ISDIR(st.st_mode):
                what = "folder (a git submodule or nested repository)"
            self.skip(Skip(path, "not-regular-file", what))
            return
        if not self.size_ok(path, st.st_size, kind):
            return
        self.add(FileEntry(path, stat_sig(st)))

    def listing(self, commit: str | None) -> Listing:
        files = sorted(self.files, key=lambda e: e.path)
        return Listing(files=files, skips=sorted(self.skips.values(), key=lambda s: s.path),
                       commit=commit, complete=self.complete)


def _inside(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def _git_mode(root: Path, source: SourceConfig) -> bool:
    """Listed by git: the source lets it (use_git) and root is in a work tree that does not ignore it."""
    return source.use_git and work_tree_top(root) is not None and not root_is_ignored(root)


def list_source(root: Path, source: SourceConfig) -> Listing:
    """Every file of the source with its signature, the skips with reasons, the commit, and whether the
    listing is complete (an incomplete listing must not be used to prune)."""
    root = Path(root)
    if not source_enabled(source):
        why = ("memory sources are opt-in: set `enabled: true` explicitly to index them"
               if source.kind == "memory" and source.enabled else "the source is disabled (enabled: false)")
        return Listing([], [Skip(".", "disabled", why)], None, False)
    if not root.is_dir():
        return Listing([], [Skip(".", "unreadable", f"source root {root} is not a folder")], None, False)
    check_root(root, source)     # never list / or the home folder by accident (kb.yaml says it first)
    col = _Collector(root, source)
    refused = refused_repository(root) if source.use_git else None
    if refused:   # a repository git will not read: say so, index nothing, prune nothing
        return Listing([], [Skip(".", "unreadable", refused)], None, False)
    if _git_mode(root, source):
        try:
            if source.content == "HEAD":
                commit = tip_commit(root, source)
                if commit is None:  # a repository without commits has no committed files
                    return col.listing(None)
                _list_head(col, commit, None)
                return col.listing(commit)
            out = run_git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
            for path in sorted(set(z_split(out.stdout))):
                col.consider_worktree_file(path)
            return col.listing(head_commit(root))
        except GitError as exc:
            return Listing([], [Skip(".", "unreadable", str(exc)[:500])], None, False)
    _walk(col)
    return col.listing(None)


def list_paths(root: Path, source: SourceConfig, paths: list[str]) -> Listing:
    """Entries and skips for some paths only (e.g. the added/modified of GitChanges), as list_source would
    give them. Paths that do not exist are left out. Always complete=False: never prune from it."""
    root = Path(root)
    col = _Collector(root, source)
    col.complete = False
    if not source_enabled(source) or not root.is_dir():
        return col.listing(None)
    paths = sorted({p.strip("/") for p in paths if p and p.strip("/")})
    if source.content == "HEAD" and _git_mode(root, source):
        commit = tip_commit(root, source)
        if commit is None:
            return col.listing(None)
        for i in range(0, len(paths), 200):
            _list_head(col, commit, paths[i:i + 200])
        return col.listing(commit)
    for p in paths:
        col.consider_worktree_file(p)
    return col.listing(head_commit(root) if _git_mode(root, source) else None)


def _list_head(col: _Collector, commit: str, only: list[str] | None) -> None:
    # Run inside root with a "." pathspec (or the given paths): ls-tree prints paths relative to root.
    args = ["ls-tree", "-r", "-z", "-l", commit, "--", *(only if only is not None else ["."])]
    out = run_git(col.root, *args)
    blobs: dict[str, tuple[str, str, int]] = {}   # path -> (mode, sha, size)
    for rec in z_split(out.stdout):
        meta, _, path = rec.partition("\t")
        parts = meta.split()
        if len(parts) < 4 or not path:
            continue
        mode, typ, sha, size = parts[0], parts[1], parts[2], parts[3]
        if typ == "commit":
            if col.wanted(path) is not None:
                col.skip(Skip(path, "not-regular-file", "git submodule (its files belong to another repository)"))
            continue
        if typ != "blob":
            continue
        blobs[path] = (mode, sha, int(size) if size.isdigit() else 0)
    links = {p: v for p, v in blobs.items() if v[0] == "120000"}
    targets = cat_blobs(col.root, sorted({v[1] for v in links.values()})) if links else {}
    for path, (mode, sha, size) in sorted(blobs.items()):
        kind = col.wanted(path)
        if kind is None:
            continue
        if mode == "120000":
            target = targets.get(sha, b"").decode("utf-8", "surrogateescape")
            resolved = _resolve_tree_link(path, target, blobs, targets)
            if resolved is None:
                col.skip(Skip(path, "symlink-outside-root", f"symlink to {target!r} leaves the source root"))
                continue
            if resolved == "":
                col.skip(Skip(path, "not-regular-file", f"symlink to {target!r}: not a committed file "
                                                          "(folder, missing file or loop)"))
                continue
            _m, sha, size = blobs[resolved]
        if mode == "160000":
            continue
        if not col.size_ok(path, size, kind):
            continue
        col.add(FileEntry(path, sha))


def _resolve_tree_link(path: str, target: str, blobs: dict[str, tuple[str, str, int]],
                       targets: dict[str, bytes]) -> str | None:
    """Root-relative path of a committed symlink's final target; None when it leaves root; "" when it is
    not a regular committed file under root (folder, missing, loop)."""
    seen = {path}
    current, tgt = path, target
    for _ in range(40):
        if not tgt or tgt.startswith("/"):
            return None
        joined = posixpath.normpath(posixpath.join(posixpath.dirname(current), tgt))
        if joined == ".." or joined.startswith("../"):
            return None
        if joined not in blobs:
            return ""
        mode, sha, _ = blobs[joined]
        if mode != "120000":
            return joined
        if joined in seen:
            return ""
        seen.add(joined)
        current, tgt = joined, targets.get(sha, b"").decode("utf-8", "surrogateescape")
        if not tgt:
            return ""   # a chained link whose blob we did not fetch: treat as unreadable
    return ""


def _walk(col: _Collector) -> None:
    root = col.root
    visited: set[tuple[int, int]] = set()
    broad_include = not col.source.include or any(p.startswith("**") for p in col.source.include)

    def onerror(exc: OSError) -> None:
        col.complete = False
        rel = _rel(root, getattr(exc, "filename", "") or "")
        col.skip(Skip(rel or ".", "unreadable", f"cannot list folder: {exc.strerror or exc}"))

    for dirpath, dirnames, filenames in os.walk(root, topdown=True, onerror=onerror, followlinks=False):
        try:
            st = os.stat(dirpath)
            key = (st.st_dev, st.st_ino)
        except OSError:
            dirnames[:] = []
            continue
        if key in visited:
            dirnames[:] = []
            continue
        visited.add(key)
        reldir = _rel(root, dirpath)
        keep: list[str] = []
        for d in sorted(dirnames):
            rel = f"{reldir}/{d}" if reldir else d
            full = os.path.join(dirpath, d)
            if d in classify.CACHE_DIRS or col.globs.dir_excluded(rel):
                continue
            if col.guard_pseudo and is_never_read(os.path.realpath(full)):
                continue      # /proc, /sys, /dev: never entered, not even listed as skipped
            if os.path.islink(full):
                # Not followed (a folder symlink is either outside the root or a duplicate inside it).
                if col.globs.included(rel + "/x") or not col.source.include:
                    try:
                        real = os.path.realpath(full, strict=True)
                        inside = _inside(Path(real), col.realroot)
                    except (OSError, RuntimeError):
                        col.skip(Skip(rel, "not-regular-file", "symlink loop or broken folder symlink"))
                        continue
                    if not inside:
                        col.skip(Skip(rel, "symlink-outside-root", f"folder symlink to {real}, outside the root"))
                    else:
                        col.skip(Skip(rel, "not-regular-file", "symlink to a folder inside the root (not followed)"))
                continue
            if (d in classify.VENDORED_DIRS or d.endswith(".egg-info")) and d not in col.include_mentions:
                if broad_include:
                    col.skip(Skip(rel, "vendored", f"third-party or build folder {rel}/ is not indexed"))
                continue
            keep.append(d)
        dirnames[:] = keep
        for f in sorted(filenames):
            rel = f"{reldir}/{f}" if reldir else f
            col.consider_worktree_file(rel)


def _rel(root: Path, p: str) -> str:
    if not p:
        return ""
    r = os.path.relpath(p, root)
    return "" if r == "." else Path(r).as_posix()


def changes_since(root: Path, source: SourceConfig, old_commit: str) -> GitChanges | None:
    """Committed changes under root between old_commit and HEAD (include/exclude applied), or None when a
    full listing is needed (see the module docstring)."""
    root = Path(root)
    if source.content != "HEAD" or not _git_mode(root, source) or not source_enabled(source):
        return None
    if not commit_exists(root, old_commit):
        return None
    head = tip_commit(root, source)
    if head is None:
        return None
    if head == old_commit or head.startswith(old_commit):
        return GitChanges()
    if not is_ancestor(root, old_commit, head):
        return None     # force-push / history rewrite: a full listing, not a diff across histories
    try:
        out = run_git(root, "diff", "--name-status", "-z", "-M", "--no-ext-diff", "--relative",
                      old_commit, head, "--", ".")
    except GitError:
        return None
    col = _Collector(root, source)
    keep = lambda p: classify.cache_dir(p) is None and col.globs.wants(p)  # noqa: E731
    changes = GitChanges()
    toks = out.stdout.decode("utf-8", "surrogateescape").split("\0")
    i = 0
    while i < len(toks):
        status = toks[i]
        if not status:
            i += 1
            continue
        code = status[0]
        if code in "RC":
            old, new = toks[i + 1], toks[i + 2]
            i += 3
            if code == "C":
                if keep(new):
                    changes.added.append(new)
                continue
            ko, kn = keep(old), keep(new)
            if ko and kn:
                changes.renamed.append((old, new))
            elif ko:
                changes.deleted.append(old)
            elif kn:
                changes.added.append(new)
            continue
        path = toks[i + 1]
        i += 2
        if not keep(path):
            continue
        if code == "A":
            changes.added.append(path)
        elif code == "D":
            changes.deleted.append(path)
        else:  # M, T (type change), U (unmerged), X
            changes.modified.append(path)
    return changes


def git_file_dates(root: Path, source: SourceConfig | None = None) -> dict[str, tuple[str, str]]:
    """{root-relative path: (first commit date, last commit date)} (ISO 8601 author dates) from ONE
    `git log --name-only` over the history under root. Empty when root is not a git work tree.
    Pass the result to read_entry(..., git_dates=...) as the last fallback for document dates."""
    root = Path(root)
    if work_tree_top(root) is None:
        return {}
    globs = GlobSet(source.include, source.exclude) if source is not None else None
    dates: dict[str, list[str]] = {}
    try:
        for date, path in iter_log_names(root):
            if globs is not None and not globs.wants(path):
                continue
            d = dates.get(path)
            if d is None:
                dates[path] = [date, date]   # newest first: this is the last change...
            else:
                d[0] = date                  # ...and each older commit moves the first date back
    except GitError:
        return {}
    return {p: (v[0], v[1]) for p, v in dates.items()}
