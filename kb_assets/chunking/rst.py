"""reStructuredText: sections from title adornments, blocks by paragraph; PEP headers.

A section title is a non-indented text line after a blank line (or the start), underlined by one repeated
punctuation character (at least as long as the title, or 4+ characters), optionally with a matching
overline. Levels follow the order in which adornment styles first appear, as docutils does. A transition
(an adornment line between blank lines) and simple-table borders ("=====  =====") are not titles.

A PEP starts with an RFC-822 style header ("PEP: 8", "Title: ...", continuation lines indented) ended by
a blank line: it becomes the first section, and its title ("PEP 8: Style Guide for Python Code") is the
root of every heading path.
"""
from __future__ import annotations

import re

from kb_assets.chunking.core import Lines, Section, clipped, heading_path

_ADORN = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
_HEADER_FIELD = re.compile(r"^[A-Za-z][A-Za-z0-9-]*:(?:\s|$)")


def _adornment(line: str) -> tuple[str, int] | None:
    s = line.rstrip()
    if len(s) < 2 or s[0] not in _ADORN or s.count(s[0]) != len(s):
        return None
    return s[0], len(s)


def _rfc822_header(lines: list[str]) -> tuple[int, str] | None:
    """(lines in the header, title) for a PEP-style header at the top, else None."""
    if not lines or not _HEADER_FIELD.match(lines[0]):
        return None
    fields: dict[str, str] = {}
    key = None
    j = 0
    while j < len(lines) and lines[j].strip():
        line = lines[j]
        if _HEADER_FIELD.match(line):
            k, _, v = line.partition(":")
            key = k.strip().lower()
            fields[key] = v.strip()
        elif line[:1].isspace() and key:
            fields[key] += " " + line.strip()
        else:
            return None
        j += 1
        if j > 200:
            return None
    if len(fields) < 2:
        return None
    title = fields.get("title", "")
    if fields.get("pep"):
        title = f"PEP {fields['pep']}: {title}" if title else f"PEP {fields['pep']}"
    return j, title


_ADORN_LINE = re.compile(r"^([!-/:-@\[-`{-~])\1+[ \t\r]*$", re.M)


def rst_titles(raw: list[str], start: int, lines: Lines) -> list[tuple[int, int, int, str]]:
    """(first line, end line, level, title) of every section title from line `start` on."""
    styles: list[tuple[str, bool]] = []
    out: list[tuple[int, int, int, str]] = []
    n = len(raw)
    consumed = start
    text = lines.text
    for m in _ADORN_LINE.finditer(text, lines.starts[start] if start < lines.count else len(text)):
        j = lines.line_of(m.start())
        if j < consumed:
            continue
        ch = m.group(1)
        # overline + title + underline
        if (j + 2 < n and (j == start or not raw[j - 1].strip()) and raw[j + 1].strip()
                and _adornment(raw[j + 1]) is None):
            under = _adornment(raw[j + 2])
            if under is not None and under[0] == ch:
                out.append(_title(styles, (ch, True), j, j + 3, raw[j + 1]))
                consumed = j + 3
                continue
        # title + underline
        t = j - 1
        if t < consumed or t < start:
            continue
        line = raw[t]
        if not line.strip() or line[0].isspace() or _adornment(line) is not None:
            continue
        if t > start and raw[t - 1].strip():
            continue
        ulen = len(m.group().rstrip())
        if ulen >= len(line.rstrip()) or ulen >= 4:
            out.append(_title(styles, (ch, False), t, j + 1, line))
            consumed = j + 1
    return out


def _title(styles: list[tuple[str, bool]], style: tuple[str, bool], a: int, b: int, text: str):
    if style not in styles:
        styles.append(style)
    return a, b, styles.index(style) + 1, text.strip()


def rst_sections(text: str, lines: Lines) -> list[Section]:
    raw = text.split("\n")
    sections: list[Section] = []
    root: list[str] = []
    start = 0
    header = _rfc822_header(raw)
    if header is not None:
        end, title = header
        if title:
            root = [title]
        r = lines.char_range(0, end)
        if r:
            sections.append(Section(heading_path(root), [r]))
        start = end
    stack: list[tuple[int, str]] = []
    heading = heading_path(root)
    head = None
    for first, end, level, title in rst_titles(raw, start, lines):
        _emit(sections, lines, heading, head, start, first)
        while stack and stack[-1][0] >= level:
            stack.pop()
        stack.append((level, title))
        heading = heading_path(root + [t for _, t in stack])
        head = lines.char_range(first, end)
        if head is not None and clipped(title):
            head = None                          # a very long heading keeps its line in the text
            start = first
        else:
            start = end
    _emit(sections, lines, heading, head, start, lines.count)
    return sections


def _emit(sections: list[Section], lines: Lines, heading: str, head, a: int, b: int) -> None:
    blocks = lines.paragraphs(a, b)
    if blocks or head:
        sections.append(Section(heading, blocks, head=head))
