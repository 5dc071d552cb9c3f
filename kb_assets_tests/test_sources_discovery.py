"""Discovery: git-aware listing, filters, hostile trees, changes_since, git dates."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from kb_assets.config import SourceConfig
from kb_assets.sources.discovery import (
    changes_since, git_file_dates, head_commit, list_paths, list_source,
)
from kb_assets.sources.globs import compile_glob

GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "T", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "T", "GIT_COMMITTER_EMAIL": "t@example.com"}


def git(cwd: Path, *args: str, env: dict | None = None) -> str:
    out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env or GIT_ENV, check=True)
    return out.stdout.strip()


def commit(cwd: Path, msg: str, date: str | None = None) -> str:
    env = dict(GIT_ENV)
    if date:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = date
    git(cwd, "add", "-A", env=env)
    git(cwd, "commit", "-q", "-m", msg, env=env)
    return git(cwd, "rev-parse", "HEAD")


def src(root: Path, **kw) -> SourceConfig:
    kw.setdefault("kind", "doc")
    return SourceConfig(key="t", root=str(root), **kw)


def write(p: Path, text: str | bytes) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text, encoding="utf-8")
    return p


BODY = "Some words about a decision that matter to the team. " * 4


# --- globs ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("pattern,path,expected", [
    ("**/*.md", "a.md", True), ("**/*.md", "x/y/a.md", True), ("*.md", "x/a.md", False),
    ("docs/**", "docs/a/b.txt", True), ("docs/**", "docsx/a", False), ("vendor", "vendor/a/b.go", True),
    ("docs/old/", "docs/old/x.md", True), ("docs/decisions/*.md", "docs/decisions/x/1.md", False),
    ("*", ".cursorrules", True), ("[!a]*.md", "a.md", False), ("**/node_modules", "x/node_modules/y.js", True),
    ("a/**/b", "a/b", True), ("a/**/b", "a/x/y/b", True),
])
def test_glob_semantics(pattern, path, expected):
    assert bool(compile_glob(pattern).match(path)) is expected


# --- folder walk (no git) ---------------------------------------------------------------------------

def test_walk_filters_and_skips(tmp_path):
    root = tmp_path / "tree"
    write(root / "docs/a.md", BODY)
    write(root / "docs/old/b.md", BODY)
    write(root / "node_modules/pkg/readme.md", BODY)
    write(root / "vendor/lib/x.md", BODY)
    write(root / "package-lock.json", "{}")
    write(root / "img.png", b"\x89PNG\r\n\x1a\n" + b"\0" * 100)
    write(root / "__pycache__/x.md", BODY)
    write(root / ".git/HEAD", "ref: x")  # not a real repo: still never listed
    listing = list_source(root, src(root, exclude=["docs/old"]))
    assert [e.path for e in listing.files] == ["docs/a.md"]
    skips = {s.path: s.reason for s in listing.skips}
    assert skips == {"node_modules": "vendored", "vendor": "vendored", "package-lock.json": "generated",
                     "img.png": "binary"}
    assert all(s.detail for s in listing.skips)
    assert listing.commit is None and listing.complete
    sig = listing.files[0].sig
    size, mtime = sig.split(":")
    assert int(size) == len(BODY.encode())


def test_include_names_vendored_folder(tmp_path):
    root = tmp_path / "tree"
    write(root / "vendor/acme/notes.md", BODY)
    listing = list_source(root, src(root, include=["vendor/acme/**"]))
    assert [e.path for e in listing.files] == ["vendor/acme/notes.md"]


def test_symlink_loop_outside_link_and_special_files(tmp_path):
    outside = write(tmp_path / "secret.md", BODY)
    root = tmp_path / "tree"
    write(root / "ok.md", BODY)
    (root / "loop").mkdir()
    os.symlink("../loop", root / "loop" / "again")          # folder symlink loop
    os.symlink("self.md", root / "self.md")                  # file symlink to itself
    os.symlink(str(outside), root / "escape.md")             # file outside the root
    os.symlink(str(tmp_path), root / "up")                   # folder outside the root
    os.symlink("ok.md", root / "alias.md")                   # inside: listed with the target's signature
    os.mkfifo(root / "pipe.md")
    listing = list_source(root, src(root))
    paths = [e.path for e in listing.files]
    assert paths == ["alias.md", "ok.md"]
    assert listing.files[0].sig == listing.files[1].sig
    skips = {s.path: s.reason for s in listing.skips}
    assert skips["escape.md"] == "symlink-outside-root"
    assert skips["up"] == "symlink-outside-root"
    assert skips["self.md"] == "not-regular-file"
    assert skips["pipe.md"] == "not-regular-file"
    assert skips["loop/again"] == "not-regular-file"


def test_too_large_is_decided_without_reading(tmp_path):
    root = tmp_path / "tree"
    root.mkdir()
    big = root / "huge.md"
    with open(big, "wb") as f:           # sparse 30 MB file: created instantly
        f.truncate(30 * 1024 * 1024)
    listing = list_source(root, src(root))
    assert listing.files == []
    assert [(s.path, s.reason) for s in listing.skips] == [("huge.md", "too-large")]
    assert "31,457,280 bytes" in listing.skips[0].detail


def test_transcript_sources_have_a_larger_default_bound(tmp_path):
    root = tmp_path / "tree"
    root.mkdir()
    with open(root / "s.jsonl", "wb") as f:
        f.truncate(30 * 1024 * 1024)
    assert [e.path for e in list_source(root, src(root, kind="transcript")).files] == ["s.jsonl"]
    explicit = src(root, kind="transcript", max_file_bytes=1_000_000)
    assert [s.reason for s in list_source(root, explicit).skips] == ["too-large"]


def test_deeply_nested_folders(tmp_path):
    root = tmp_path / "tree"
    deep = root.joinpath(*[f"d{i}" for i in range(60)])
    write(deep / "deep.md", BODY)
    listing = list_source(root, src(root))
    assert len(listing.files) == 1 and listing.files[0].path.endswith("d59/deep.md")


def test_code_source_skips_non_code(tmp_path):
    root = tmp_path / "tree"
    write(root / "app.py", "print('hi')\n" * 20)
    write(root / "data.csv", "a,b\n1,2\n")
    write(root / "notes.txt", BODY)
    write(root / "api_pb2.py", "x = 1\n")
    write(root / "bundle.min.js", "var a=1;")
    write(root / "Cargo.lock", "x")
    write(root / "bin/tool", "#!/usr/bin/env python3\nprint(1)\n")   # no extension: the reader decides
    listing = list_source(root, src(root, kind="code"))
    assert [e.path for e in listing.files] == ["app.py", "bin/tool"]
    assert {s.path: s.reason for s in listing.skips} == {
        "data.csv": "not-code", "notes.txt": "not-code", "api_pb2.py": "generated",
        "bundle.min.js": "generated", "Cargo.lock": "generated"}


def test_memory_sources_are_opt_in(tmp_path):
    root = tmp_path / "mem"
    write(root / "note.md", BODY)
    implicit = SourceConfig(key="m", kind="memory", root=str(root))
    listing = list_source(root, implicit)
    assert listing.files == [] and not listing.complete
    assert listing.skips[0].reason == "disabled" and "enabled: true" in listing.skips[0].detail
    explicit = SourceConfig(key="m", kind="memory", root=str(root), enabled=True)
    assert [e.path for e in list_source(root, explicit).files] == ["note.md"]


def test_missing_root_is_incomplete(tmp_path):
    listing = list_source(tmp_path / "nope", src(tmp_path / "nope"))
    assert not listing.complete and listing.skips[0].reason == "unreadable"


# --- git --------------------------------------------------------------------------------------------

@pytest.fixture
def repo(tmp_path) -> Path:
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    write(r / "docs/a.md", "A " + BODY)
    write(r / "docs/b.md", "B " + BODY)
    write(r / "docs/c.md", "C " + BODY)
    write(r / "src/app.py", "print('x')\n")
    write(r / ".gitignore", "ignored/\n*.log\n")
    write(r / "ignored/x.md", BODY)
    write(r / "debug.log", "x")
    commit(r, "first", "2024-01-02T10:00:00+00:00")
    return r


def test_git_worktree_and_head_listing(repo):
    write(repo / "docs/new.md", "N " + BODY)                # untracked, not ignored
    write(repo / "docs/a.md", "A changed " + BODY)           # modified, uncommitted
    (repo / "docs/c.md").unlink()                            # deleted in the worktree only
    wt = list_source(repo, src(repo, include=["docs/**"]))
    assert [e.path for e in wt.files] == ["docs/a.md", "docs/b.md", "docs/new.md"]
    assert all(":" in e.sig for e in wt.files)
    assert wt.commit == head_commit(repo) and wt.complete

    head = list_source(repo, src(repo, include=["docs/**"], content="HEAD"))
    assert [e.path for e in head.files] == ["docs/a.md", "docs/b.md", "docs/c.md"]
    blob_a = git(repo, "rev-parse", "HEAD:docs/a.md")
    assert head.files[0].sig == blob_a
    assert head.commit == git(repo, "rev-parse", "HEAD")


def test_git_subfolder_root_and_ignored_root(repo):
    sub = repo / "docs"
    listing = list_source(sub, src(sub, content="HEAD"))
    assert [e.path for e in listing.files] == ["a.md", "b.md", "c.md"]
    ignored = repo / "ignored"
    walked = list_source(ignored, src(ignored))       # a git-ignored folder is walked instead
    assert [e.path for e in walked.files] == ["x.md"] and walked.commit is None


def test_use_git_false_walks_a_work_tree_and_needs_worktree_content(repo):
    """use_git: false lists the folder as a plain folder: git-ignored files too, no commit, not a git source
    for the sensors; with content: HEAD it is a configuration error (HEAD is git's)."""
    from pydantic import ValidationError

    from kb_assets.config import KbConfig
    from kb_assets.sources.watch import is_git_source

    write(repo / "docs/new.md", "N " + BODY)                # untracked
    walked = list_source(repo, src(repo, include=["docs/**", "ignored/**"], use_git=False))
    assert [e.path for e in walked.files] == ["docs/a.md", "docs/b.md", "docs/c.md", "docs/new.md", "ignored/x.md"]
    assert walked.commit is None and walked.complete
    by_git = list_source(repo, src(repo, include=["docs/**", "ignored/**"]))
    assert "ignored/x.md" not in [e.path for e in by_git.files] and by_git.commit == head_commit(repo)
    cfg = KbConfig.model_validate({"sources": [src(repo, use_git=False).model_dump()]})
    assert not is_git_source(cfg, cfg.sources[0])
    with pytest.raises(ValidationError, match="use_git: false lists the working tree"):
        src(repo, use_git=False, content="HEAD")


def test_committed_symlinks_in_head_mode(repo, tmp_path):
    os.symlink("a.md", repo / "docs/alias.md")
    os.symlink("../../outside.md", repo / "docs/escape.md")
    commit(repo, "links")
    listing = list_source(repo / "docs", src(repo / "docs", content="HEAD"))
    paths = {e.path: e.sig for e in listing.files}
    assert paths["alias.md"] == paths["a.md"]
    assert {s.path: s.reason for s in listing.skips} == {"escape.md": "symlink-outside-root"}


def test_changes_since_and_unreachable_commit(repo):
    cfg = src(repo, include=["docs/**"], content="HEAD")
    first = head_commit(repo)
    write(repo / "docs/a.md", "A modified " + BODY)
    git(repo, "mv", "docs/b.md", "docs/b2.md")
    (repo / "docs/c.md").unlink()
    write(repo / "docs/d.md", "An unrelated new document about caching and queues.\n" * 3)
    write(repo / "src/other.py", "x = 2\n")                 # outside the include: not reported
    second = commit(repo, "second")
    ch = changes_since(repo, cfg, first)
    assert ch is not None
    assert ch.modified == ["docs/a.md"]
    assert ch.renamed == [("docs/b.md", "docs/b2.md")]
    assert ch.deleted == ["docs/c.md"]
    assert ch.added == ["docs/d.md"]
    assert changes_since(repo, cfg, second) == type(ch)()     # nothing since HEAD

    part = list_paths(repo, cfg, ch.added + ch.modified + ["docs/gone.md"])
    assert [e.path for e in part.files] == ["docs/a.md", "docs/d.md"] and not part.complete

    # worktree mode: always a full listing
    assert changes_since(repo, src(repo, include=["docs/**"]), first) is None
    # force-reset to a new root commit, expire the reflog and gc: the old commits are gone
    git(repo, "checkout", "-q", "--orphan", "rewritten")
    commit(repo, "rewritten history")
    git(repo, "branch", "-D", "main")
    git(repo, "reflog", "expire", "--expire=now", "--all")
    git(repo, "gc", "-q", "--prune=now")
    assert subprocess.run(["git", "cat-file", "-e", f"{first}^{{commit}}"], cwd=repo).returncode != 0
    assert changes_since(repo, cfg, first) is None
    assert changes_since(repo, cfg, "not-a-sha") is None


def test_not_git_has_no_commit_and_no_changes(tmp_path):
    root = tmp_path / "plain"
    write(root / "a.md", BODY)
    assert head_commit(root) is None
    assert changes_since(root, src(root, content="HEAD"), "0" * 40) is None
    listing = list_source(root, src(root, content="HEAD"))    # HEAD on a plain folder: walk, no commit
    assert [e.path for e in listing.files] == ["a.md"] and listing.commit is None


def test_git_file_dates_one_log(repo):
    write(repo / "docs/a.md", "A again " + BODY)
    commit(repo, "later", "2024-03-04T10:00:00+00:00")
    dates = git_file_dates(repo, src(repo, include=["docs/**"]))
    assert dates["docs/a.md"][0].startswith("2024-01-02") and dates["docs/a.md"][1].startswith("2024-03-04")
    assert dates["docs/b.md"][0].startswith("2024-01-02") and dates["docs/b.md"][1].startswith("2024-01-02")
    assert "src/app.py" not in dates
    sub = git_file_dates(repo / "docs")
    assert set(sub) == {"a.md", "b.md", "c.md"}


def test_a_path_through_a_symlinked_folder_resolves_as_realpath_does(tmp_path):
    """Each folder is resolved once (_Collector._realpath): a file reached through a symlinked folder is still
    judged by where it really is, outside the root or inside it."""
    outside = write(tmp_path / "secret.md", BODY)
    root = tmp_path / "tree"
    write(root / "real" / "deep" / "ok.md", BODY)
    os.symlink(str(tmp_path), root / "up")                   # a folder outside the root
    os.symlink("real", root / "inner")                       # a folder inside it
    listing = list_paths(root, src(root), ["up/secret.md", "inner/deep/ok.md", "real/deep/ok.md"])
    assert [e.path for e in listing.files] == ["inner/deep/ok.md", "real/deep/ok.md"]
    assert {s.path: s.reason for s in listing.skips} == {"up/secret.md": "symlink-outside-root"}
    assert outside.exists()
