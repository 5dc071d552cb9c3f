"""What the sensors look at, without Dagster: a git source's tip on its branch (after an optional fetch),
whether history was rewritten since the indexed commit, the listing signature of a source that is not git,
and the pushes recorded by the webhook (POST /hooks/git)."""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kb_assets.sources import discovery
from kb_assets.sources.gitutil import GitError, current_branch, fetch, is_ancestor, remote_url

if TYPE_CHECKING:
    import psycopg

    from kb_assets.config import KbConfig, SourceConfig


@dataclass
class Tip:
    source: str
    ref: str
    commit: str | None
    error: str | None = None      # the fetch failed: commit is the last fetched state


def is_git_source(cfg: KbConfig, source: SourceConfig) -> bool:
    """Listed by git (its root is inside a work tree that does not ignore it)."""
    root = cfg.source_root(source)
    return root.is_dir() and discovery._git_mode(root, source)


def source_branch(root: Path, source: SourceConfig) -> str | None:
    return source.branch or current_branch(root)


def git_tip(cfg: KbConfig, source: SourceConfig, *, do_fetch: bool) -> Tip:
    """The commit the source would be indexed at; fetches <remote>/<branch> first when asked and set."""
    root = cfg.source_root(source)
    error = None
    if do_fetch and source.remote:
        branch = source_branch(root, source)
        if branch is None:
            error = "detached HEAD and no `branch:` set: nothing to fetch"
        else:
            try:
                fetch(root, source.remote, branch)
            except GitError as exc:
                error = str(exc)
    if source.content == "HEAD":
        return Tip(source.key, discovery.tip_ref(root, source), discovery.tip_commit(root, source), error)
    return Tip(source.key, "HEAD", discovery.head_commit(root), error)


def history_rewritten(cfg: KbConfig, source: SourceConfig, old: str | None, new: str) -> bool:
    """True when old (the last commit seen) is not an ancestor of new: a force-push or rewrite."""
    return old is not None and old != new and not is_ancestor(cfg.source_root(source), old, new)


def listing_signature(cfg: KbConfig, source: SourceConfig) -> str:
    """sha256 over the source's listing (paths and size:mtime signatures, skips): changes when a file is
    added, removed, resized or touched. For folders that are not git (memory folders, exports)."""
    listing = discovery.list_source(cfg.source_root(source), source)
    h = hashlib.sha256()
    for e in listing.files:
        h.update(f"{e.path}\0{e.sig}\n".encode("utf-8", "surrogateescape"))
    for s in listing.skips:
        h.update(f"skip\0{s.path}\0{s.reason}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


# ---------------------------------------------------------------- pushes recorded by the webhook
@dataclass
class Push:
    id: int
    delivery_id: str
    provider: str
    repository: str | None
    repo_urls: list[str]
    ref: str | None
    after_sha: str | None
    forced: bool


_SCP_LIKE = re.compile(r"^(?:[^@/]+@)?([^:/]+):(?!//)(.+)$")     # git@github.com:owner/repo.git


def normalize_repo_url(url: str) -> str:
    """One spelling for the URLs of one repository: host/path, lower-case host, no user, no .git, no
    trailing slash (https://…, ssh://git@…, git@host:path); local paths become real absolute paths."""
    u = url.strip()
    if not u:
        return ""
    if "://" in u:
        scheme, rest = u.split("://", 1)
        if scheme == "file":
            return _norm_path(rest)
        hostpart, _, path = rest.partition("/")
        host = hostpart.rsplit("@", 1)[-1].split(":", 1)[0].lower()   # drop credentials and port
        return f"{host}/{_strip_git(path)}"
    if os.path.isabs(u) or u.startswith("."):
        return _norm_path(u)
    m = _SCP_LIKE.match(u)
    if m:
        return f"{m.group(1).lower()}/{_strip_git(m.group(2))}"
    return _strip_git(u)


def _strip_git(path: str) -> str:
    path = path.strip("/")
    return path[:-4] if path.endswith(".git") else path


def _norm_path(p: str) -> str:
    return _strip_git(os.path.realpath(p))


def pending_pushes(conn: psycopg.Connection, after_id: int) -> list[Push]:
    rows = conn.execute(
        "SELECT id, delivery_id, provider, repository, repo_urls, ref, after_sha, forced FROM git_pushes"
        " WHERE id > %s ORDER BY id LIMIT 1000", (after_id,)).fetchall()
    return [Push(*r) for r in rows]


def prune_pushes(conn: psycopg.Connection, keep_days: int = 30) -> int:
    """Forget pushes older than keep_days (the table would grow forever; replays of older deliveries are
    then recorded again, which only requests a run the run_key dedupes)."""
    return conn.execute("DELETE FROM git_pushes WHERE received_at < now() - make_interval(days => %s)",
                        (keep_days,)).rowcount


def push_matches(push: Push, cfg: KbConfig, source: SourceConfig) -> bool:
    """The push went to the source's remote, on the source's branch."""
    if not source.remote or not push.ref:
        return False
    root = cfg.source_root(source)
    url = remote_url(root, source.remote)
    if url is None or normalize_repo_url(url) not in {normalize_repo_url(u) for u in push.repo_urls}:
        return False
    branch = source_branch(root, source)
    return branch is not None and push.ref == f"refs/heads/{branch}"
