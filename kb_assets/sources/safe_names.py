"""What a listed file is called in the index: its path made storable and secret-free.

Listings hold paths as the file system gives them: str with surrogateescape for bytes that are not UTF-8
(`caf\\udce9.md` for the bytes `caf\\xe9.md`). PostgreSQL text cannot hold those, so the stored path —
documents.path, hence ids, signposts, status — escapes each such byte as `\\xNN` (and any other lone
surrogate as `\\uNNNN`). The file is still read through its listed (raw) path; only the name in the index
changes. Control characters stay in the stored path (they are valid text); displays escape them (see
`printable`).

A path that holds a secret (a token pasted into a file name) is stored redacted, `[REDACTED:<type>]` in
place of the value, through the same detectors as texts: the file's (redacted) content stays findable,
the token never reaches the index. Two files whose stored names coincide are kept apart by a `~N`
suffix in listing order (as duplicate work-item ids are).
"""
from __future__ import annotations

import re
from collections.abc import Collection, Iterable

_SURROGATE_RE = re.compile("[\ud800-\udfff]")
_CONTROL_RE = re.compile("[\x00-\x1f\x7f]")


def has_surrogates(s: str) -> bool:
    return _SURROGATE_RE.search(s) is not None


def _escape_surrogate(m: re.Match[str]) -> str:
    cp = ord(m.group())
    if 0xDC80 <= cp <= 0xDCFF:          # surrogateescape: the original byte
        return f"\\x{cp - 0xDC00:02x}"
    return f"\\u{cp:04x}"


def escape_surrogates(s: str) -> str:
    """`caf\\udce9.md` -> `caf\\xe9.md` (a backslash escape per undecodable byte or lone surrogate)."""
    return _SURROGATE_RE.sub(_escape_surrogate, s) if has_surrogates(s) else s


def clean_text(s: str) -> str:
    """Text for storage: lone surrogates (a JSON "\\ud800" escape, say) become U+FFFD, NUL is dropped."""
    if has_surrogates(s):
        s = _SURROGATE_RE.sub("\ufffd", s)
    return s.replace("\x00", "") if "\x00" in s else s


def clean_json_value(value):
    """clean_text over every string (keys too) of a JSON-like value."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(k) if isinstance(k, str) else k: clean_json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json_value(v) for v in value]
    return value


def printable(s: str) -> str:
    """One display line: control characters (a newline in a file name) shown as escapes."""
    if _CONTROL_RE.search(s) is None:
        return s
    return _CONTROL_RE.sub(lambda m: {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(m.group(),
                                                                           f"\\x{ord(m.group()):02x}"), s)


def safe_paths(paths: Iterable[str]) -> dict[str, str]:
    """{listed path: stored path} for the paths whose stored form differs (escaped or redacted).

    One redaction pass over all the paths joined by newlines (a listing has up to max_files paths; one
    pass costs about what one file's redaction does); paths holding a newline are redacted one by one.
    """
    paths = list(paths)
    if not paths:      # every listed path already known by its stored name (a delete): nothing to import either
        return {}
    from kb_assets.sources.redaction import redact

    escaped = [escape_surrogates(p) for p in paths]
    out = {p: e for p, e in zip(paths, escaped) if e != p}
    joinable = [(p, e) for p, e in zip(paths, escaped) if "\n" not in e]
    if joinable:
        red, counts = redact("\n".join(e for _p, e in joinable))
        if counts:
            lines = red.split("\n")
            if len(lines) == len(joinable):
                for (p, e), r in zip(joinable, lines):
                    if r != e:
                        out[p] = r
            else:       # a secret span crossed a line: take the paths one by one
                for p, e in joinable:
                    r = redact(e)[0]
                    if r != e:
                        out[p] = r
    for p, e in zip(paths, escaped):
        if "\n" in e:
            r = redact(e)[0]
            if r != e:
                out[p] = r
    return out


def stored_path(path: str) -> str:
    """The stored form of one path (see safe_paths; no collision handling)."""
    return safe_paths([path]).get(path, path)


def assign_names(paths: Iterable[str], *, clean: Collection[str] = ()) -> dict[str, str]:
    """{listed path: stored path} for the listed paths whose stored name differs, collisions resolved:
    a stored name already taken (by a file that keeps its own name, or by an earlier file in sorted
    order) gets `~2`, `~3`, ...

    `clean`: paths known to keep their own name (the index holds them under it, stored by this same code):
    not scanned again; the result is the same as with none given."""
    paths = sorted(set(paths))
    changed = safe_paths([p for p in paths if p not in clean] if clean else paths)
    if not changed:
        return {}
    taken = {p for p in paths if p not in changed}
    out: dict[str, str] = {}
    for p in paths:
        if p not in changed:
            continue
        base = name = changed[p]
        n = 1
        while name in taken:
            n += 1
            name = f"{base}~{n}"
        taken.add(name)
        out[p] = name
    return out


_ESCAPE_RE = re.compile(r"\\x([89a-f][0-9a-f])|\\u(d[89a-f][0-9a-f]{2})")


def listed_name(stored: str) -> str | None:
    """The listed (file-system) name behind a stored one, when it can be known: the escapes undone;
    None for a redacted name (the secret is not kept anywhere) or a name that was not changed."""
    if "[REDACTED:" in stored:
        return None
    if "\\x" not in stored and "\\u" not in stored:
        return None
    raw = _ESCAPE_RE.sub(lambda m: chr(0xDC00 + int(m.group(1), 16)) if m.group(1) else chr(int(m.group(2), 16)),
                         stored)
    return raw if raw != stored else None
