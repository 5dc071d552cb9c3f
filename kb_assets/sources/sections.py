"""CLAUDE.md / AGENTS.md and similar agent files: addressable sections by headings and marker comments.

Sections (meta['sections'], line numbers 1-based in the document text):
- every heading starts a section that runs to the line before the next heading of the same or a higher
  level: {name: slug (unique), heading: "Parent > Child", start_line, end_line, level, source: "heading"}
- every marker block is a section: `<!-- name-start -->` … `<!-- name-end -->` (also `name:start`,
  `name_begin`) and `<!-- BEGIN name -->` … `<!-- END name -->` (also START/END):
  {name, heading, start_line (the start marker), end_line (the end marker), source: "marker"}

The text is kept whole (the chunker splits it on headings). A marker block whose first non-blank line is
not a heading gets a rendered heading line right after its start marker ("## <name>", one level below the
enclosing heading), so the chunker sees the block as its own section; when the block ends inside a heading's
section and text follows it before the next heading, a "<enclosing heading> (continued)" heading is rendered
after the end marker so that text is not attributed to the marker block. These rendered lines are the only
changes to the file's text.
"""
from __future__ import annotations

import re
from typing import Any

from kb_assets.sources.textutil import clean_inline, headings, slugify

# <!-- BEGIN name -->, <!-- START name: any description -->, <!-- name-start -->, <!-- name:begin -->
_START_RE = re.compile(
    r"^\s*<!--\s*(?:(?:BEGIN|START)[\s:_-]+([\w.:/-]{1,80}?)(?:[\s,(:][^>]*)?|([\w.:/-]{1,80}?)[-_: ](?:start|begin))"
    r"\s*-->\s*$", re.IGNORECASE)
_END_RE = re.compile(
    r"^\s*<!--\s*(?:END[\s:_-]+([\w.:/-]{1,80}?)(?:[\s,(:][^>]*)?|([\w.:/-]{1,80}?)[-_: ]end)\s*-->\s*$",
    re.IGNORECASE)
_ATX = re.compile(r"^ {0,3}#{1,6}(?:\s|$)")


def _markers(lines: list[str]) -> list[tuple[str, int, int]]:
    """(name, start index, end index) of well-formed marker blocks (0-based line indexes)."""
    open_: dict[str, int] = {}
    out: list[tuple[str, int, int]] = []
    for i, line in enumerate(lines):
        if "<!--" not in line:
            continue
        m = _START_RE.match(line)
        if m:
            name = (m.group(1) or m.group(2)).strip()
            open_.setdefault(name.lower(), i)
            continue
        m = _END_RE.match(line)
        if m:
            name = (m.group(1) or m.group(2)).strip()
            s = open_.pop(name.lower(), None)
            if s is not None:
                out.append((name, s, i))
    return sorted(out, key=lambda t: t[1])


def render_sections(text: str) -> tuple[str, list[dict[str, Any]]]:
    lines = text.split("\n")
    blocks = _markers(lines)
    synthetic: set[int] = set()
    if blocks:
        lines, synthetic = _insert_marker_headings(lines, blocks)
        blocks = _markers(lines)
    all_hs = headings(lines)
    # Rendered headings (marker blocks, "(continued)") are for the chunker; they are not sections and do
    # not end the real sections around them.
    hs = [h for h in all_hs if h.line not in synthetic]
    sections: list[dict[str, Any]] = []
    used: dict[str, int] = {}

    def unique(name: str) -> str:
        base = slugify(name)
        n = used.get(base, 0) + 1
        used[base] = n
        return base if n == 1 else f"{base}-{n}"

    for name, _s, _e in blocks:        # marker names first: they are the names people address
        unique(name)
    stack: list[tuple[int, str]] = []
    for i, h in enumerate(hs):
        text_h = clean_inline(h.text)
        while stack and stack[-1][0] >= h.level:
            stack.pop()
        stack.append((h.level, text_h))
        end = len(lines)
        for h2 in hs[i + 1:]:
            if h2.level <= h.level:
                end = h2.line - 1
                break
        sections.append({"name": unique(text_h or "section"), "heading": " > ".join(t for _, t in stack),
                         "start_line": h.line, "end_line": max(h.line, end), "level": h.level,
                         "source": "heading"})
    for name, s, e in blocks:
        inner = next((h for h in all_hs if s < h.line - 1 < e), None)
        sections.append({"name": slugify(name), "heading": clean_inline(inner.text) if inner else name,
                         "start_line": s + 1, "end_line": e + 1, "level": inner.level if inner else None,
                         "source": "marker"})
    sections.sort(key=lambda d: (d["start_line"], d["source"] != "marker"))
    return "\n".join(lines), sections


def _insert_marker_headings(lines: list[str], blocks: list[tuple[str, int, int]]) -> tuple[list[str], set[int]]:
    hs = headings(lines)
    inserts: dict[int, list[str]] = {}     # insert after this index
    for name, s, e in blocks:
        enclosing = None
        for h in hs:
            if h.line - 1 < s:
                enclosing = h
            else:
                break
        level = min(6, (enclosing.level + 1) if enclosing else 2)
        first = next((ln for ln in lines[s + 1:e] if ln.strip()), None)
        if first is None or not _ATX.match(first):
            label = re.sub(r"[-_]+", " ", name).strip() or name
            inserts.setdefault(s, []).append("#" * level + " " + label)
            if enclosing is not None:
                nxt = next((h for h in hs if h.line - 1 > e), None)
                tail = lines[e + 1:(nxt.line - 1) if nxt else len(lines)]
                if any(t.strip() and "<!--" not in t for t in tail):
                    inserts.setdefault(e, []).append(
                        "#" * enclosing.level + " " + clean_inline(enclosing.text) + " (continued)")
    out: list[str] = []
    synthetic: set[int] = set()
    for i, line in enumerate(lines):
        out.append(line)
        if i in inserts:
            for extra in inserts[i]:
                out.append(extra)
                synthetic.add(len(out))      # 1-based line number of the rendered heading
    return out, synthetic
