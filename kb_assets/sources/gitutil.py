"""Small, safe wrappers around the git command line (no git library: git itself is the reference).

Every call runs with GIT_OPTIONAL_LOCKS=0 so that reading never rewrites the index (memory folders and
other read-only sources stay untouched), without a terminal prompt, and with a timeout.
"""
from __future__ import annotations

import os
import re
import subprocess
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

GIT_TIMEOUT = 600
_SHA_RE = re.compile(r"^[0-9a-f]{40}(?:[0-9a-f]{24})?$")


def git_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({"GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C", "LANG": "C"})
    for k in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):  # never aim at another repository
        env.pop(k, None)
    return env


class GitError(Exception):
    pass


def run_git(cwd: Path | str, *args: str, check: bool = True, timeout: float = GIT_TIMEOUT,
            input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    try:
        proc = subprocess.run(
            ["git", "-c", "core.quotePath=false", *args], cwd=str(cwd), capture_output=True,
            env=git_env(), timeout=timeout, input=input,
        )
    except FileNotFoundError as exc:  # git is not installed, or cwd is gone
        raise GitError(f"cannot run git in {cwd}: {exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise GitError(f"git {' '.join(args[:3])} timed out after {timeout}s in {cwd}") from exc
    if check and proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise GitError(f"git {' '.join(args[:3])} failed in {cwd}: {err[-1] if err else proc.returncode}")
    return proc


def is_sha(s: str) -> bool:
    return bool(_SHA_RE.match(s))


def outside_any_repository(path: Path | str) -> bool:
    """True when git can find no repository for `path`: no folder from it up to / holds a `.git` entry or
    a `HEAD` file (what a bare repository or a git directory has). git's discovery walks up the same
    folders (GIT_DIR and GIT_WORK_TREE are never passed on: git_env), so asking it there only costs a
    process — four of them, ~5 ms each, on every small pass of a folder source. False means "ask git"."""
    try:
        p = Path(path).resolve()
    except (OSError, RuntimeError):
        return False
    for folder in (p, *p.parents):
        if os.path.lexists(folder / ".git") or os.path.lexists(folder / "HEAD"):
            return False
    return True


def work_tree_top(root: Path) -> Path | None:
    """The top of the git work tree that contains root, or None (not git, bare, inside .git, no git)."""
    if outside_any_repository(root):
        return None
    try:
        p = run_git(root, "rev-parse", "--is-inside-work-tree", "--show-toplevel", check=False, timeout=30)
    except GitError:
        return None
    if p.returncode != 0:
        return None
    lines = p.stdout.decode("utf-8", "surrogateescape").splitlines()
    if len(lines) < 2 or lines[0].strip() != "true":
        return None
    return Path(lines[1].strip())


def root_is_ignored(root: Path) -> bool:
    """True when root sits in a git-ignored folder (its files are then listed by walking)."""
    if outside_any_repository(root):
        return False
    try:
        p = run_git(root, "check-ignore", "-q", ".", check=False, timeout=30)
    except GitError:
        return False
    return p.returncode == 0


def head_commit(root: Path) -> str | None:
    if outside_any_repository(root):
        return None
    try:
        p = run_git(root, "rev-parse", "--verify", "-q", "HEAD^{commit}", check=False, timeout=30)
    except GitError:
        return None
    sha = p.stdout.decode().strip()
    return sha if p.returncode == 0 and is_sha(sha) else None


def commit_exists(root: Path, sha: str) -> bool:
    if not sha or not re.match(r"^[0-9a-fA-F]{4,64}$", sha):
        return False
    try:
        p = run_git(root, "cat-file", "-e", f"{sha}^{{commit}}", check=False, timeout=30)
    except GitError:
        return False
    return p.returncode == 0


def z_split(data: bytes) -> list[str]:
    return [s for s in data.decode("utf-8", "surrogateescape").split("\0") if s]


class BlobReader:
    """read_blob for many blobs through one `git cat-file --batch` process (HEAD-mode reading: one git
    process per file cost more than everything else the documents stage does). Started on first use.

    `upcoming`: the shas the caller expects to ask for, in order (a hint: asking for others, or skipping
    some, is fine). Up to `window` of them are requested ahead, so git reads the next blobs while the caller
    works on this one. Any answer other than a blob (missing object, another object type) is handed to
    read_blob, and so is every read after a failure of the batch process: results and error messages stay
    exactly read_blob's. Not thread-safe; close() when done."""

    def __init__(self, root: Path, upcoming: Iterable[str] = (), window: int = 16):
        self.root = root
        self.proc: subprocess.Popen[bytes] | None = None
        self.failed = False
        self.window = window
        self.upcoming = [s for s in upcoming if is_sha(s)]
        self.next_hint = 0                      # index in upcoming of the next sha not yet requested
        self.pending: deque[str] = deque()      # requested, answer not read yet (git answers in order)

    def __enter__(self) -> BlobReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read(self, sha: str, limit: int) -> bytes | None:
        """The blob's bytes, or None when it is larger than limit (never holds more than limit+64 KB)."""
        got: object = _FALLBACK
        if not self.failed and is_sha(sha):
            try:
                got = self._read(sha, limit)
            except (OSError, ValueError, GitError):
                self.close()       # out of step or dead: plain read_blob from now on
                self.failed = True
                got = _FALLBACK
        return read_blob(self.root, sha, limit) if got is _FALLBACK else got  # type: ignore[return-value]

    def _read(self, sha: str, limit: int) -> object:
        if self.proc is None:
            self.proc = subprocess.Popen(["git", "cat-file", "--batch"], cwd=str(self.root), stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=git_env())
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        if sha in self.pending:
            while self.pending[0] != sha:       # asked ahead but skipped by the caller
                self._answer(stdout, self.pending.popleft(), -1)
        else:
            while self.pending:
                self._answer(stdout, self.pending.popleft(), -1)
            hint = self._find_hint(sha)
            if hint >= 0:
                self.next_hint = hint + 1
            stdin.write(sha.encode("ascii") + b"\n")
            self.pending.append(sha)
        # ask for the next ones before reading this answer: git works while the caller does
        while len(self.pending) < self.window and self.next_hint < len(self.upcoming):
            nxt = self.upcoming[self.next_hint]
            self.next_hint += 1
            stdin.write(nxt.encode("ascii") + b"\n")
            self.pending.append(nxt)
        stdin.flush()
        return self._answer(stdout, self.pending.popleft(), limit)

    def _find_hint(self, sha: str, lookahead: int = 64) -> int:
        end = min(len(self.upcoming), self.next_hint + lookahead)
        for i in range(self.next_hint, end):
            if self.upcoming[i] == sha:
                return i
        return -1

    def _answer(self, stdout: IO[bytes], sha: str, limit: int) -> object:
        """Read git's answer for sha: its bytes, None when over limit, _FALLBACK when not a blob. limit -1:
        read past it (an answer nobody wants any more)."""
        header = stdout.readline()
        if not header.endswith(b"\n"):
            raise GitError("git cat-file --batch ended")
        parts = header.split()
        if len(parts) == 2 and parts[0] == sha.encode("ascii") and parts[1] == b"missing":
            return _FALLBACK
        if len(parts) != 3 or parts[0] != sha.encode("ascii") or not parts[2].isdigit():
            raise GitError(f"unexpected git cat-file --batch answer {header[:100]!r}")
        size = int(parts[2])
        if parts[1] != b"blob" or size > limit:
            self._skip(stdout, size + 1)      # the object and its newline: keep the stream in step
            return _FALLBACK if parts[1] != b"blob" else None
        data = stdout.read(size + 1)
        if len(data) != size + 1 or not data.endswith(b"\n"):
            raise GitError("git cat-file --batch: short read")
        return data[:-1]

    @staticmethod
    def _skip(stream: IO[bytes], n: int) -> None:
        while n > 0:
            chunk = stream.read(min(n, 65536))
            if not chunk:
                raise GitError("git cat-file --batch: short read")
            n -= len(chunk)

    def close(self) -> None:
        proc, self.proc = self.proc, None
        self.pending.clear()
        if proc is None:
            return
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream:
                    stream.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


_FALLBACK = object()


def cat_blobs(root: Path, shas: list[str]) -> dict[str, bytes]:
    """Contents of several (small) blobs in one `git cat-file --batch` call (symlink targets)."""
    if not shas:
        return {}
    p = run_git(root, "cat-file", "--batch", input=("\n".join(shas) + "\n").encode())
    out: dict[str, bytes] = {}
    data, pos = p.stdout, 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:
            break
        header = data[pos:nl].decode("utf-8", "replace").split()
        pos = nl + 1
        if len(header) == 3:
            size = int(header[2])
            out[header[0]] = data[pos:pos + size]
            pos += size + 1
    return out


def read_blob(root: Path, sha: str, limit: int) -> bytes | None:
    """The blob's bytes, or None when it is larger than limit (never holds more than limit+64 KB)."""
    proc = subprocess.Popen(["git", "cat-file", "blob", sha], cwd=str(root), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=git_env())
    assert proc.stdout is not None
    chunks: list[bytes] = []
    total = 0
    too_big = False
    try:
        while True:
            chunk = proc.stdout.read(65536)
            if not chunk:
                break
            total += len(chunk)
            if total > limit:
                too_big = True
                break
            chunks.append(chunk)
    finally:
        if too_big:
            proc.kill()
        proc.stdout.close()
        err = proc.stderr.read() if proc.stderr else b""
        if proc.stderr:
            proc.stderr.close()
        rc = proc.wait()
    if too_big:
        return None
    if rc != 0:
        raise GitError(f"git cat-file blob {sha} failed: {err.decode('utf-8', 'replace').strip()[:200]}")
    return b"".join(chunks)


def iter_log_names(root: Path) -> Iterator[tuple[str, str]]:
    """(author date ISO, path relative to root) for every file touched by every commit reachable from HEAD,
    newest first, streamed from one `git log` process."""
    proc = subprocess.Popen(
        ["git", "-c", "core.quotePath=false", "log", "--relative", "--no-renames", "--name-only",
         "--format=%x01%aI", "-z", "--", "."],
        cwd=str(root), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=git_env(),
    )
    assert proc.stdout is not None
    date = ""
    buf = b""
    try:
        while True:
            chunk = proc.stdout.read(1 << 16)
            if not chunk:
                break
            buf += chunk
            *items, buf = buf.split(b"\0")
            for raw in items:
                tok = raw.decode("utf-8", "surrogateescape").lstrip("\n")
                if not tok:
                    continue
                if tok.startswith("\x01"):
                    # "\x01<date>" possibly followed by "\n" and the first name when a commit has names
                    head, _, rest = tok[1:].partition("\n")
                    date = head.strip()
                    rest = rest.strip("\n")
                    if rest:
                        yield date, rest
                else:
                    yield date, tok
        tail = buf.decode("utf-8", "surrogateescape").strip("\n")
        if tail and not tail.startswith("\x01"):
            yield date, tail
    finally:
        proc.stdout.close()
        proc.wait()


# ---------------------------------------------------------------- branches and remotes (git-merge sensors)
def current_branch(root: Path) -> str | None:
    """The checked-out branch's short name, or None (detached HEAD, not git)."""
    try:
        p = run_git(root, "symbolic-ref", "-q", "--short", "HEAD", check=False, timeout=30)
    except GitError:
        return None
    name = p.stdout.decode("utf-8", "replace").strip()
    return name if p.returncode == 0 and name else None


def resolve_commit(root: Path, ref: str) -> str | None:
    try:
        p = run_git(root, "rev-parse", "--verify", "-q", f"{ref}^{{commit}}", check=False, timeout=30)
    except GitError:
        return None
    sha = p.stdout.decode().strip()
    return sha if p.returncode == 0 and is_sha(sha) else None


def is_ancestor(root: Path, old: str, new: str) -> bool:
    """True when old is reachable from new (a fast-forward); False after a force-push / history rewrite
    or when old is unknown here."""
    if not commit_exists(root, old):
        return False
    try:
        p = run_git(root, "merge-base", "--is-ancestor", old, new, check=False, timeout=60)
    except GitError:
        return False
    return p.returncode == 0


def fetch(root: Path, remote: str, branch: str, timeout: float = 120) -> None:
    """`git fetch <remote> <branch>` into refs/remotes/<remote>/<branch> (forced: a rewritten remote branch
    must replace ours). Raises GitError with git's last line."""
    run_git(root, "fetch", "--quiet", "--no-tags", remote,
            f"+refs/heads/{branch}:refs/remotes/{remote}/{branch}", timeout=timeout)


def remote_url(root: Path, remote: str) -> str | None:
    try:
        p = run_git(root, "remote", "get-url", remote, check=False, timeout=30)
    except GitError:
        return None
    url = p.stdout.decode("utf-8", "replace").strip()
    return url if p.returncode == 0 and url else None


def refused_repository(root: Path) -> str | None:
    """git's refusal of a repository that exists but belongs to another user ("dubious ownership": a
    bind-mounted checkout in a container), as one line with the fix; None when git reads it or there is no
    repository. Without this check such a root looks like a plain folder and is walked: content HEAD
    ignored, untracked files indexed, no commit, and the sensor never fires."""
    if outside_any_repository(root):
        return None
    try:
        p = run_git(root, "rev-parse", "--git-dir", check=False, timeout=30)
    except GitError:
        return None
    err = p.stderr.decode("utf-8", "replace")
    if p.returncode != 0 and "dubious ownership" in err:
        return (f"git refuses {root}: dubious ownership (the repository belongs to another user) — run "
                f"`git config --global --add safe.directory {root}` (the kb image sets safe.directory '*')")
    return None

