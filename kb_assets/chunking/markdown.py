"""Markdown (and markdown-rendered work items / sessions): sections by heading, blocks by paragraph.

Headings come from markdown-it-py's block parser (inline parsing is switched off: it is not needed and
costs half the time), so '#' lines inside fenced code, indented code or HTML blocks are not headings, and
setext headings ("Title\\n=====") are. Only top-level headings open sections (a '#' line inside a list
or a block quote does not). Paragraphs are split on blank lines, never inside a fence, indented code or
HTML block. YAML front matter is a section of its own. When the parser fails (it has a nesting limit,
but anything can happen on hostile input) the caller falls back to plain paragraphs.
"""
from __future__ import annotations

import re
import threading
from bisect import bisect_left

from kb_assets.chunking.core import Lines, Section, clipped, heading_path

_FRONT_END = re.compile(r"^(?:---|\.\.\.)[ \t\r]*$", re.M)
_LONE_CR = re.compile(r"\r(?!\n)")
_MAX_NESTING = 20
_NOT_SETEXT = re.compile(r"\s*(?:[-*+]|\d{1,9}[.)]|>)(?:\s|$)")
_local = threading.local()

# Quick test for text without a markdown extension (README, session notes, memory files).
_LOOKS_MD = re.compile(r"^(?:#{1,6}[ \t]+\S|```|~~~|[-*+][ \t]+\S|\d{1,3}[.)][ \t]+\S|>[ \t]?\S|\S.*\n(?:=+|-+)[ \t]*$)"
                       r"|\[[^\]\n]+\]\([^)\s]+\)", re.M)


def looks_like_markdown(text: str) -> bool:
    return _LOOKS_MD.search(text, 0, 200_000) is not None


def _parser():
    md = getattr(_local, "md", None)
    if md is None:
        from markdown_it import MarkdownIt

        md = MarkdownIt("commonmark", {"maxNesting": _MAX_NESTING})
        # Only top-level headings matter: without the list and block quote rules a '#' line inside them is a
        # paragraph (or, indented 2-3 spaces in a list item, a heading — harmless), and hostile nesting costs
        # nothing; inline parsing is never needed. Fences, indented code and HTML blocks are still recognised.
        md.disable(["inline", "text_join", "list", "blockquote", "reference"], ignoreInvalid=True)
        _local.md = md
    return md


def _front_matter_lines(text: str, lines: Lines) -> int:
    """Number of lines of a leading '---' ... '---' YAML block (0 when there is none)."""
    if not text.startswith("---") or lines.count < 2 or lines.line(0).rstrip() != "---":
        return 0
    m = _FRONT_END.search(text, lines.starts[1], min(len(text), lines.starts[min(lines.count - 1, 300)] + 400))
    if not m:
        return 0
    return lines.line_of(m.start()) + 1


def markdown_sections(text: str, lines: Lines, *, markers: bool = False) -> list[Section] | None:
    """Sections of a markdown text, or None when the parser fails.

    markers: an HTML comment at the top level (`<!-- BEGIN ... -->` in CLAUDE.md / AGENTS.md) also starts a
    section, under the current heading.
    """
    fm = _front_matter_lines(text, lines)
    parse_text = text
    if fm:
        rest = text[lines.starts[fm]:] if fm < lines.count else ""
        parse_text = "\n" * fm + rest if fm < lines.count else "\n" * (lines.count - 1)
    if "\r" in parse_text:
        parse_text = _LONE_CR.sub(" ", parse_text)   # markdown-it counts a lone CR as a line break; we do not
    parse_text, orig = _compress(parse_text, lines.count)
    try:
        tokens = _parser().parse(parse_text)
    except Exception:   # RecursionError included: hostile nesting must not take the document down
        return None

    events: list[tuple[int, int, int, str]] = []    # (first line, end line, level or 0 for a marker, title)
    protected_lines: list[tuple[int, int]] = []
    for i, t in enumerate(tokens):
        tt = t.type
        if tt == "heading_open":
            if t.level == 0 and t.map:
                a, b = orig(t.map[0]), orig(t.map[1])
                if t.markup in ("=", "-"):           # setext: the title is every line above the underline
                    title = " ".join(lines.line(k).strip() for k in range(a, b - 1))
                    if _NOT_SETEXT.match(title):
                        continue     # "- item\n---": a list (or quote) followed by a rule, not a heading
                else:
                    nxt = tokens[i + 1] if i + 1 < len(tokens) else None
                    title = nxt.content if nxt is not None and nxt.type == "inline" else ""
                events.append((a, b, int(t.tag[1:]), title))
        elif tt in ("fence", "code_block", "html_block"):
            if t.map:
                a, b = orig(t.map[0]), orig(t.map[1])
                protected_lines.append((a, b))
                if markers and tt == "html_block" and t.level == 0 and t.content.lstrip().startswith("<!--"):
                    events.append((a, a, 0, ""))

    protected = _char_ranges(lines, protected_lines)
    sections: list[Section] = []
    if fm:
        r = lines.char_range(0, fm)
        if r:
            sections.append(Section("", [r]))
    stack: list[tuple[int, str]] = []
    heading = ""
    head = None
    start = fm
    for first, end, level, title in events:
        if first < start:
            continue
        _emit(sections, lines, heading, head, start, first, protected)
        if level:
            while stack and stack[-1][0] >= level:
                stack.pop()
            stack.append((level, title))
            heading = heading_path([t for _, t in stack])
            head = lines.char_range(first, end)
            if head is not None and clipped(title):
                head = None                      # a very long heading keeps its line in the text
                start = first
            else:
                start = end
        else:
            head = None
            start = first
    _emit(sections, lines, heading, head, start, lines.count, protected)
    return sections


# A run of "plain" lines (starting with a letter or digit, no '>') after a plain line: every line after the
# first is a paragraph continuation (or fence / HTML block content) in every context markdown-it can be in
# here (lists and block quotes are off), and none can end a fence or an HTML block. Dropping them before
# parsing changes no heading, fence or HTML block, and spares the parser most of its per-line work.
_PLAIN_RUN = re.compile(r"^[^\W_][^>\n]*\n(?:[^\W_][^>\n]*\n)+", re.M)


def _compress(text: str, n_lines: int):
    """(text without the continuation lines of plain runs, map from its line numbers to the original's)."""
    firsts: list[int] = []     # compressed line index of each run's kept line
    removed: list[int] = [0]   # lines removed by runs so far (prefix sums)
    pieces: list[str] = []
    pos = 0
    line = 0                   # original line number at `pos`
    for m in _PLAIN_RUN.finditer(text):
        line += text.count("\n", pos, m.start())
        n = text.count("\n", m.start(), m.end())
        first_end = text.index("\n", m.start()) + 1
        pieces.append(text[pos:first_end])
        firsts.append(line - removed[-1])
        removed.append(removed[-1] + n - 1)
        line += n
        pos = m.end()
    if not firsts:
        return text, lambda c: min(c, n_lines)
    pieces.append(text[pos:])

    def orig(c: int) -> int:
        return min(n_lines, c + removed[bisect_left(firsts, c)])

    return "".join(pieces), orig


def _char_ranges(lines: Lines, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    n = len(lines.text)
    for a, b in sorted(spans):
        s = lines.starts[a] if a < lines.count else n
        e = lines.starts[b] if b < lines.count else n
        if out and s < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _emit(sections: list[Section], lines: Lines, heading: str, head, a: int, b: int, protected) -> None:
    blocks = lines.paragraphs(a, b, protected)
    if blocks or head:
        sections.append(Section(heading, blocks, head=head))


def text_sections(text: str, lines: Lines) -> list[Section]:
    """Plain text: one section, blocks are blank-line separated paragraphs."""
    blocks = lines.paragraphs(0, lines.count)
    return [Section("", blocks)] if blocks else []
