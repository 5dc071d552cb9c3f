"""Is a result stale? Cheap checks against the source on disk (standard library only).

- A git source: its HEAD is read from the .git files (no subprocess, ~0.1 ms). If HEAD moved since the
  source was indexed, `git diff --name-only <indexed>..HEAD` (one subprocess per source and commit pair,
  cached for the life of the process) says which paths changed; only those results are stale. If the diff
  cannot be computed (shallow clone, rewritten history) every result of that source is stale.
- Any source whose stored file signature is "size:mtime_ns": the file is stat-ed; a different size or
  mtime, or a missing file, makes the result stale (catches uncommitted edits of working-tree sources and
  folder sources without git).
"""
from __future__ import annotations

import os
import re
import subprocess
import threading
from pathlib import Path

_SIG_STAT = re.compile(r"^(?:racy:)?(\d+):(\d+)$")   # racy: see pipeline/source_state.py
_HEX40 = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")

_diff_cache: dict[tuple[str, str, str], frozenset[str] | None] = {}
_lock = threading.Lock()


def _git_dir(root: Path) -> Path | None:
    """The .git directory governing `root` (walks up; follows `gitdir:` files of worktrees/submodules)."""
    p = root
    for _ in range(64):
        dot = p / ".git"
        if dot.is_dir():
            return dot
        if dot.is_file():
            try:
                line = dot.read_text(encoding="utf-8").strip()
            except OSError:
                return None
            if line.startswith("gitdir:"):
                g = Path(line[7:].strip())
                return g if g.is_absolute() else (p / g).resolve()
            return None
        if p.parent == p:
            return None
        p = p.parent
    return None


def git_head(root: str | os.PathLike[str]) -> str | None:
    """The commit HEAD points at, read from the repository files; None if not a git checkout."""
    gd = _git_dir(Path(root))
    if gd is None:
        return None
    try:
        head = (gd / "HEAD").read_text(encoding="utf-8").strip()
    except OSError:
        return None
    if _HEX40.match(head):
        return head
    if not head.startswith("ref:"):
        return None
    ref = head[4:].strip()
    common = gd
    cd = gd / "commondir"                      # linked worktrees keep refs in the common dir
    if cd.is_file():
        try:
            c = Path(cd.read_text(encoding="utf-8").strip())
            common = c if c.is_absolute() else (gd / c).resolve()
        except OSError:
            pass
    for base in (gd, common):
        f = base / ref
        if f.is_file():
            try:
                v = f.read_text(encoding="utf-8").strip()
                return v if _HEX40.match(v) else None
            except OSError:
                return None
    packed = common / "packed-refs"
    try:
        with packed.open(encoding="utf-8") as fh:
            for line in fh:
                if line.endswith(" " + ref + "\n") or line.rstrip("\n").endswith(" " + ref):
                    sha = line.split(" ", 1)[0]
                    return sha if _HEX40.match(sha) else None
    except OSError:
        return None
    return None


def changed_paths(root: str, old: str, new: str) -> frozenset[str] | None:
    """Paths (relative to root) changed between two commits; None when git cannot tell."""
    key = (str(root), old, new)
    with _lock:
        if key in _diff_cache:
            return _diff_cache[key]
    try:
        out = subprocess.run(
            ["git", "-c", "core.quotepath=off", "diff", "--name-only", "--relative", "--no-renames", "-z",
             old, new, "--", "."],
            cwd=root, capture_output=True, timeout=10)
        result = (frozenset(p.decode("utf-8", "surrogateescape") for p in out.stdout.split(b"\0") if p)
                  if out.returncode == 0 else None)
    except (OSError, subprocess.TimeoutExpired):
        result = None
    with _lock:
        _diff_cache[key] = result
    return result


class Freshness:
    """Per-call cache: one HEAD read per source root, one diff per (root, indexed, HEAD)."""

    def __init__(self) -> None:
        self._heads: dict[str, str | None] = {}

    def head(self, root: str) -> str | None:
        if root not in self._heads:
            self._heads[root] = git_head(root) if root and os.path.isdir(root) else None
        return self._heads[root]

    def is_stale(self, *, root: str | None, source_commit: str | None, path: str, file_sig: str | None) -> bool:
        if not root:
            return False
        file_path = path.split("#", 1)[0]
        m = _SIG_STAT.match(file_sig or "")
        if m:
            try:
                st = os.stat(os.path.join(root, file_path))
            except OSError:
                from kb_assets.sources.safe_names import listed_name

                if "[REDACTED:" in file_path:
                    return False      # indexed under a redacted name: the file's own name is not known
                raw = listed_name(file_path)   # a name escaped for storage (not UTF-8): stat the real one
                try:
                    st = os.stat(os.path.join(root, raw)) if raw is not None else None
                except OSError:
                    st = None
                if st is None:
                    return True                              # gone since it was indexed
            if st.st_size != int(m.group(1)) or st.st_mtime_ns != int(m.group(2)):
                return True
        if source_commit:
            head = self.head(root)
            if head and head != source_commit:
                changed = changed_paths(root, source_commit, head)
                return True if changed is None else file_path in changed
        return False
