"""reStructuredText: sections from title adornments, blocks by paragraph; PEP headers.

A section title is a non-indented text line after a blank line, the start or another title, underlined by one
repeated punctuation character (at least as long as the title, or 4+ characters), optionally with a matching
overline. docutils (the reference reST parser) finds the same titles and levels on every PEP of the shared
corpus (kb_assets_tests/test_chunking_rst_docutils.py); it is ~50x dearer, so the documents stage parses with
this and stores the result (documents.blocks "rst"). Levels follow the order in which adornment styles first appear, as docutils does. A transition
(an adornment line between blank lines) and simple-table borders ("=====  =====") are not titles.

A PEP starts with an RFC-822 style header ("PEP: 8", "Title: ...", continuation lines indented) ended by
a blank line: it becomes the first section, and its title ("PEP 8: Style Guide for Python Code") is the
root of every heading path.
"""
from __future__ import annotations

import re

from kb_assets.chunking.core import Lines, Section, clipped, heading_path

_ADORN = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


def _adornment(line: str) -> tuple[str, int] | None:
    s = line.rstrip()
    if len(s) < 2 or s[0] not in _ADORN or s.count(s[0]) != len(s):
        return None
    return s[0], len(s)


def _rfc822_header(lines: list[str]) -> tuple[int, str, list[tuple[str, str]]] | None:
    """(lines in the header, title, its fields) for a PEP-style header at the top, else None."""
    from kb_assets.sources.textutil import header_dict, rfc822_header

    header = rfc822_header(lines)
    if header is None:
        return None
    pairs, end = header
    fields = header_dict(pairs)
    title = fields.get("title", "")
    if fields.get("pep"):
        title = f"PEP {fields['pep']}: {title}" if title else f"PEP {fields['pep']}"
    return end, title, pairs


# An adornment line: one punctuation character repeated (a single one only underlines a one-character title).
_ADORN_LINE = re.compile(r"^([!-/:-@\[-`{-~])\1*[ \t\r]*$", re.M)


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
        ulen = len(m.group().rstrip())
        # overline + title + underline
        if (ulen > 1 and j + 2 < n and (j == start or not raw[j - 1].strip()) and raw[j + 1].strip()
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
        if t > start and t != consumed and raw[t - 1].strip():
            continue        # a title follows a blank line, or the previous title's underline (as in docutils)
        if ulen >= len(line.rstrip()) or ulen >= 4:
            out.append(_title(styles, (ch, False), t, j + 1, line))
            consumed = j + 1
    return out


def _title(styles: list[tuple[str, bool]], style: tuple[str, bool], a: int, b: int, text: str):
    if style not in styles:
        styles.append(style)
    return a, b, styles.index(style) + 1, text.strip()


# documents.blocks for a reST document (the documents stage's one parse, read by the chunker and the extractive
# signposter): {"v": BLOCKS_VERSION, "rst": {"hdr": [header lines, title, [[key, value], ...]] or null,
# "titles": [[first line, end line, level, title], ...] from the header's end on}}.

def rst_structure(text: str, lines: Lines | None = None) -> dict:
    """The header and section titles of a reST text, in the stored form (lines of `text` split on "\\n")."""
    lines = lines or Lines(text)
    raw = text.split("\n")
    header = _rfc822_header(raw)
    start = header[0] if header is not None else 0
    return {"hdr": [header[0], header[1], [list(p) for p in header[2]]] if header is not None else None,
            "titles": [list(t) for t in rst_titles(raw, start, lines)]}


def rst_from_stored(stored) -> dict | None:
    """The "rst" part of a documents.blocks value, or None when it holds none usable (NULL, older version)."""
    from kb_assets.chunking.markdown import BLOCKS_VERSION

    if not isinstance(stored, dict) or stored.get("v") != BLOCKS_VERSION:
        return None
    rst = stored.get("rst")
    if not isinstance(rst, dict) or not isinstance(rst.get("titles"), list):
        return None
    return rst


def rst_sections(text: str, lines: Lines, stored: dict | None = None) -> list[Section]:
    """Sections of a reST text. stored: its documents.blocks (`rst_structure` as the documents stage wrote it):
    read instead of parsing again; without it (a row written before BLOCKS_VERSION 2) the text is parsed."""
    rst = rst_from_stored(stored)
    if rst is None:
        rst = rst_structure(text, lines)
    sections: list[Section] = []
    root: list[str] = []
    start = 0
    header = rst.get("hdr")
    if header:
        end, title = int(header[0]), header[1]
        if title:
            root = [title]
        r = lines.char_range(0, end)
        if r:
            sections.append(Section(heading_path(root), [r]))
        start = end
    stack: list[tuple[int, str]] = []
    heading = heading_path(root)
    head = None
    for first, end, level, title in rst["titles"]:
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
