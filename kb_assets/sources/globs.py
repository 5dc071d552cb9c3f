"""Include/exclude globs, relative to a source root, with `**`.

Semantics (documented for kb.yaml users):
- Paths are POSIX and relative to the source root; patterns are too (a leading "./" or "/" is ignored).
- `*` matches any characters except "/", `?` one character except "/", `[abc]` / `[!abc]` a class.
- `**` as a whole path segment matches zero or more segments: `**/*.md` matches `a.md` and `x/y/a.md`;
  `docs/**` matches everything under docs/.
- Hidden files are not special: `*` matches `.cursorrules`.
- A pattern that matches a folder also matches everything under it: exclude `vendor` or `docs/old/`
  drops the whole folder; include `docs` takes the whole folder.
- A pattern without "/" only matches at the root (glob semantics, not .gitignore semantics): use
  `**/node_modules` to match a folder at any depth.

Python 3.11 has no `glob.translate`, so the translation is ours (small, tested).
"""
from __future__ import annotations

import re
from functools import lru_cache


class GlobError(ValueError):
    pass


def _translate_segment(seg: str) -> str:
    out: list[str] = []
    i, n = 0, len(seg)
    while i < n:
        c = seg[i]
        if c == "*":
            while i + 1 < n and seg[i + 1] == "*":
                i += 1
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = seg.find("]", i + 2 if i + 1 < n and seg[i + 1] in "!^" else i + 1)
            if j < 0:
                raise GlobError(f"unclosed '[' in {seg!r}")
            body = seg[i + 1:j]
            if body[:1] in ("!", "^"):
                body = "^" + body[1:].replace("\\", "\\\\")
                out.append("(?!/)[" + body + "]")
            else:
                out.append("[" + body.replace("\\", "\\\\") + "]")
            i = j
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def translate_glob(pattern: str) -> str:
    """Regex source (anchored) for a root-relative glob; also matches descendants of a matched folder."""
    if not pattern or "\0" in pattern:
        raise GlobError(f"bad glob {pattern!r}")
    p = pattern.strip()
    while p.startswith("./"):
        p = p[2:]
    p = p.lstrip("/")
    p = p.rstrip("/")
    if not p:
        return r"(?s:.*)\Z"
    segs = p.split("/")
    parts: list[str] = []
    for k, seg in enumerate(segs):
        last = k == len(segs) - 1
        if seg == "**":
            if last:
                parts.append("(?:.*)")          # everything below (or nothing)
            else:
                parts.append("(?:[^/]+/)*")     # zero or more whole segments
        elif seg == "":
            continue
        else:
            parts.append(_translate_segment(seg) + ("" if last else "/"))
    body = "".join(parts)
    if body.endswith("/"):
        body = body[:-1]
    # A folder match includes its descendants.
    return r"(?s:" + body + r")(?:/.*)?\Z"


@lru_cache(maxsize=1024)
def compile_glob(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(translate_glob(pattern))
    except re.error as exc:
        raise GlobError(f"bad glob {pattern!r}: {exc}") from exc


class GlobSet:
    """include/exclude decision for root-relative POSIX paths."""

    def __init__(self, include: list[str] | tuple[str, ...], exclude: list[str] | tuple[str, ...]):
        self.include = [compile_glob(p) for p in include]
        self.exclude = [compile_glob(p) for p in exclude]
        self.include_patterns = tuple(include)

    def excluded(self, path: str) -> bool:
        return any(rx.match(path) for rx in self.exclude)

    def included(self, path: str) -> bool:
        return not self.include or any(rx.match(path) for rx in self.include)

    def wants(self, path: str) -> bool:
        return self.included(path) and not self.excluded(path)

    def dir_excluded(self, dirpath: str) -> bool:
        """A folder every file of which is excluded (so a walk need not enter it)."""
        return any(rx.match(dirpath) for rx in self.exclude)

    def mentions_segment(self, segment: str) -> bool:
        """True when an include pattern names this folder literally (e.g. include 'vendor/acme/**')."""
        return any(segment in p.split("/") for p in self.include_patterns)
