"""Shared text helpers for readers: dates, front matter, markdown headings and marker sections."""
from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# --- dates -----------------------------------------------------------------------------------------

# The one date parser lives in sources/dates.py (re-exported here for the readers).
from kb_assets.sources.dates import normalize_date  # noqa: E402,F401


def _mk(y: int, m: int, d: int) -> str | None:
    try:
        return dt.date(y, m, d).isoformat()
    except ValueError:
        return None


_NAME_DATE_RE = re.compile(r"(?<!\d)((?:19|20)\d{2})[-_.]?([01]\d)[-_.]?([0-3]\d)(?!\d)")


def date_from_name(path: str) -> str | None:
    """Date in a file name: 2026-01-31-topic.md, 20260131_notes.md, notes-2026-01-31.md."""
    name = path.rsplit("/", 1)[-1]
    for m in _NAME_DATE_RE.finditer(name):
        d = _mk(int(m.group(1)), int(m.group(2)), int(m.group(3)))
        if d:
            return d
    return None


# --- front matter ----------------------------------------------------------------------------------

FRONT_MATTER_MAX = 64 * 1024


_FRONT_OPEN = re.compile(r"---[ \t\r]*(?:\n|$)")
_FRONT_CLOSE = re.compile(r"^(?:---|\.\.\.)[ \t\r]*$", re.M)


def front_matter_end(text: str) -> int:
    """Where a leading front-matter block ends: the offset just past its closing line, 0 when there is none.

    The one rule for readers and chunker: a '---' line at the very top, closed by the next '---' or '...'
    line (YAML's document end) within FRONT_MATTER_MAX characters. Whether the YAML inside is valid does not
    matter here: the block is the block (split_front_matter reports bad YAML; the chunker keeps it apart)."""
    opening = _FRONT_OPEN.match(text)
    if not opening:
        return 0
    closing = _FRONT_CLOSE.search(text, opening.end(), min(len(text), FRONT_MATTER_MAX))
    if not closing:
        return 0
    newline = text.find("\n", closing.end())
    return len(text) if newline < 0 else newline + 1


def split_front_matter(text: str) -> tuple[dict[str, Any], str, str | None]:
    """(metadata, body, error). YAML front matter as front_matter_end finds it, loaded by python-frontmatter's
    YAML handler (yaml.SafeLoader). Bad YAML leaves the text untouched and returns the error."""
    end = front_matter_end(text)
    if not end:
        return {}, text, None
    closing = _FRONT_CLOSE.search(text, 3, end)
    try:
        from frontmatter.default_handlers import YAMLHandler

        data = YAMLHandler().load(text[3:closing.start()])
    except Exception as exc:  # yaml errors, odd types
        return {}, text, f"front matter is not valid YAML: {str(exc).splitlines()[0][:200]}"
    meta = data if isinstance(data, dict) else {}
    return json_safe(meta), text[end:].strip(), None


def json_safe(value: Any, depth: int = 0, budget: list[int] | None = None) -> Any:
    """Plain JSON values only, bounded (YAML aliases cannot blow up the stored metadata)."""
    if budget is None:
        budget = [2000]
    budget[0] -= 1
    if budget[0] < 0 or depth > 6:
        return None
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()
    if isinstance(value, str):
        return value[:5000]
    if isinstance(value, dict):
        return {str(k)[:200]: json_safe(v, depth + 1, budget) for k, v in list(value.items())[:200]}
    if isinstance(value, (list, tuple, set)):
        return [json_safe(v, depth + 1, budget) for v in list(value)[:500]]
    return str(value)[:1000]


def as_list(value: Any) -> list[str]:
    """Tags and similar: a YAML list, or a comma/semicolon separated string."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        items = [str(v).strip() for v in value if v is not None and str(v).strip()]
    else:
        items = [p.strip() for p in re.split(r"[,;]", str(value)) if p.strip()]
    out: list[str] = []
    for it in items:
        it = it.strip("`'\" ")
        if it and it not in out:
            out.append(it[:100])
    return out[:100]


# --- RFC 822 style headers (PEPs) ------------------------------------------------------------------

_HEADER_FIELD_RE = re.compile(r"^([A-Za-z][A-Za-z0-9-]*):(?:\s|$)")


def rfc822_header(lines: list[str], start: int = 0, max_lines: int = 200) -> tuple[list[tuple[str, str]], int] | None:
    """A "Key: value" header from line `start` (a PEP's "PEP: 8", "Title: ...", continuation lines indented),
    ended by a blank line or the end: ([(key as written, value), ...] in order, continuations joined; the line
    after it), or None when a line is neither a field nor a continuation, the header runs past max_lines, or it
    has fewer than two distinct keys. The one header parser of the index: the PEP reader, the reST chunker and
    the extractive signposter read a header through it."""
    fields: list[list[str]] = []
    j = start
    n = len(lines)
    while j < n and lines[j].strip():
        line = lines[j]
        m = _HEADER_FIELD_RE.match(line)
        if m:
            fields.append([m.group(1), line[m.end(1) + 1:].strip()])
        elif line[:1].isspace() and fields:
            fields[-1][1] = (fields[-1][1] + " " + line.strip()).strip()
        else:
            return None
        j += 1
        if j - start > max_lines:
            return None
    if len({k.lower() for k, _ in fields}) < 2:
        return None
    return [(k, v) for k, v in fields], j


def header_dict(fields: list[tuple[str, str]]) -> dict[str, str]:
    """{lower-cased key: value} of `rfc822_header` fields (a repeated key: its last value)."""
    return {k.lower(): v for k, v in fields}


# --- markdown structure ----------------------------------------------------------------------------

@dataclass
class Heading:
    line: int      # 1-based
    level: int
    text: str


def headings(lines: list[str]) -> list[Heading]:
    """ATX and setext headings outside fenced code blocks and HTML comments (line based, no recursion)."""
    return list(iter_headings(lines))


def iter_headings(lines: list[str]) -> Iterator[Heading]:
    """headings(), one at a time: the chunker's heading parser over the chunker's view of the text
    (chunking/markdown.view_blocks: markdown-it's block rules, front matter and lone CRs blanked, lines split on
    "\\n" as `lines` are), so the readers, the titles and the chunks' heading paths see the same headings, and
    the documents stage scans each text once for the readers and documents.blocks."""
    from kb_assets.chunking.markdown import _NOT_SETEXT, view_blocks

    try:
        blocks = view_blocks("\n".join(lines))[0]
    except Exception:      # hostile input: no headings rather than no document
        return
    for kind, a, b, level, title, _comment in blocks:
        if kind == "heading":
            yield Heading(a + 1, level, title.strip())
        elif kind == "setext":
            text = " ".join(lines[k].strip() for k in range(a, b - 1))
            if text and not _NOT_SETEXT.match(text) and len(text) < 300:
                yield Heading(b - 1, level, text)


def clean_inline(text: str) -> str:
    """Heading text without markdown decoration: links -> their text, emphasis and code marks removed."""
    t = re.sub(r"!\[([^\]]*)\]\([^)]*\)", r"\1", text)
    t = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", t)
    t = re.sub(r"<[^>]{1,200}>", "", t)
    t = t.replace("`", "").replace("**", "").replace("__", "")
    t = re.sub(r"(?<!\w)[*_](\S.*?)[*_](?!\w)", r"\1", t)
    return re.sub(r"\s+", " ", t).strip()


def first_title(lines: list[str], hs: list[Heading] | None = None) -> str | None:
    """The first level-1 heading with text, else the first heading with text."""
    if hs is None:
        # One pass that stops at the first level-1 heading (usually line 1) instead of listing them all.
        fallback = None
        for h in iter_headings(lines):
            if h.level == 1 and h.text:
                return clean_inline(h.text)
            if fallback is None and h.text:
                fallback = h
        return clean_inline(fallback.text) if fallback is not None else None
    for h in hs:
        if h.level == 1 and h.text:
            return clean_inline(h.text)
    for h in hs:
        if h.text:
            return clean_inline(h.text)
    return None


def slugify(text: str) -> str:
    s = re.sub(r"[^\w\s-]", "", text.lower(), flags=re.UNICODE)
    return re.sub(r"[\s_-]+", "-", s).strip("-")[:80] or "section"


def title_from_path(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    stem = name.rsplit(".", 1)[0] if "." in name[1:] else name
    stem = re.sub(r"[-_]+", " ", stem).strip()
    return stem[:1].upper() + stem[1:] if stem else name
