"""Markdown (and markdown-rendered work items / sessions): sections by heading, blocks by paragraph.

Headings come from markdown-it-py's block rules, without inline parsing, lists or block quotes
(`block_structure`: a line scanner that gives what that parser gives, at a tenth of its cost), so '#' lines
inside fenced code, indented code or HTML blocks are not headings, and setext headings ("Title\\n=====") are.
Only top-level headings open sections (a '#' line inside a list or a block quote does not). Paragraphs are
split on blank lines, never inside a fence, indented code or HTML block. YAML front matter is a section of its
own. Should the scanner ever fail on hostile input, the caller falls back to plain paragraphs.
"""
from __future__ import annotations

import re
import threading

from kb_assets.chunking.core import Lines, Section, clipped, heading_path
from kb_assets.models import BLOCKS_VERSION  # noqa: F401  (re-exported: chunking's name for it)

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


# A block: (kind, first line, end line (exclusive), heading level, ATX heading title, html block opens with "<!--").
# kind: "heading" (ATX), "setext", "fence", "code_block", "html_block"; lines are 0-based lines of the parsed text.
Block = tuple[str, int, int, int, str, bool]


def block_structure_markdown_it(text: str) -> list[Block]:
    """The blocks that matter here, from markdown-it-py's block parser configured as `_parser` says (the reference
    `block_structure` reproduces; also the fallback when markdown-it's internals it reuses are missing)."""
    tokens = _parser().parse(text)
    out: list[Block] = []
    for i, t in enumerate(tokens):
        tt = t.type
        if tt == "heading_open":
            if t.level == 0 and t.map:
                if t.markup in ("=", "-"):
                    out.append(("setext", t.map[0], t.map[1], int(t.tag[1:]), "", False))
                else:
                    nxt = tokens[i + 1] if i + 1 < len(tokens) else None
                    title = nxt.content if nxt is not None and nxt.type == "inline" else ""
                    out.append(("heading", t.map[0], t.map[1], int(t.tag[1:]), title, False))
        elif tt in ("fence", "code_block", "html_block"):
            if t.map:
                comment = tt == "html_block" and t.level == 0 and t.content.lstrip().startswith("<!--")
                out.append((tt, t.map[0], t.map[1], 0, "", comment))
    return out


_FROM_MARKDOWN_IT: list = []      # [mdTrim, HTML_SEQUENCES], or [None, None] for another markdown-it-py layout


def _markdown_it_parts() -> list:
    """markdown-it-py's trim and HTML-block patterns, imported on the first scan: importing markdown_it costs
    ~13 ms, and a pass that scans no markdown (a delete, a rename) imports this module for its constants."""
    if not _FROM_MARKDOWN_IT:
        try:
            from markdown_it.common.utils import mdTrim
            from markdown_it.rules_block.html_block import HTML_SEQUENCES
            _FROM_MARKDOWN_IT[:] = [mdTrim, HTML_SEQUENCES]
        except ImportError:        # another markdown-it-py layout: use the parser itself
            _FROM_MARKDOWN_IT[:] = [None, None]
    return _FROM_MARKDOWN_IT

_CRLF = re.compile(r"\r\n?")


def block_structure(text: str) -> list[Block]:
    """`_block_scan(text)`, the last two texts' scans kept per thread: within the documents stage the readers
    (titles, sections, ADR fields) and the stored documents.blocks ask for the same text's scan in a row, and
    one scan serves them all (issue 13: parse once)."""
    memo = getattr(_local, "scans", None)
    if memo is None:
        memo = _local.scans = []
    for i, (seen, blocks) in enumerate(memo):
        if seen == text:
            if i:
                memo.insert(0, memo.pop(i))
            return list(blocks)
    blocks = _block_scan(text)
    memo.insert(0, (text, blocks))
    del memo[2:]
    return list(blocks)


def _block_scan(text: str) -> list[Block]:
    """`block_structure_markdown_it(text)`, computed directly: a line scanner for exactly the block rules that
    parser runs (indented code, fences, thematic breaks, HTML blocks, ATX and setext headings, paragraphs: no
    containers, so every block is at the top level and a block's extent depends on its own lines only). It
    follows markdown-it-py's rules line for line and reuses its HTML-block patterns, at ~1/10 of the parse's cost.
    kb_assets_tests/test_chunking_markdown_blocks.py holds it to markdown-it on corpora and random documents."""
    _md_trim, seqs = _markdown_it_parts()
    if seqs is None:
        return block_structure_markdown_it(text)
    # markdown-it's normalize step: CR LF / CR become LF, NUL becomes U+FFFD
    if "\r" in text:
        text = _CRLF.sub("\n", text)
    if "\0" in text:
        text = text.replace("\0", "\ufffd")
    if not text:
        return []
    raw = text.split("\n")
    if text.endswith("\n") or not raw[-1].strip(" \t"):
        raw.pop()           # no line after a final LF; a final line of spaces and tabs only is not a line either
    n = len(raw)
    body = [line.lstrip(" \t") for line in raw]          # the line from its first non-space (tShift)
    ind = [len(line) - len(b) for line, b in zip(raw, body)]   # indent in columns (sCount)
    if "\t" in text:
        for i, line in enumerate(raw):
            if ind[i] and "\t" in line[:ind[i]]:
                col = 0
                for ch in line[:ind[i]]:
                    col += 4 - col % 4 if ch == "\t" else 1
                ind[i] = col
    out: list[Block] = []

    def fence_open(i: int):
        """(marker, run length) when line i opens a fence, else None (the fence rule in silent mode)."""
        b = body[i]
        if len(b) < 3:
            return None
        m = b[0]
        k = len(b) - len(b.lstrip(m))
        if k < 3 or (m == "`" and "`" in b[k:]):
            return None
        return m, k

    def is_hr(b: str) -> bool:
        m = b[0]
        return b.count(m) >= 3 and not b.replace(m, "").strip(" \t")

    def atx_level(b: str) -> int:
        k = len(b) - len(b.lstrip("#"))
        if k > 6 or (k < len(b) and b[k] not in " \t"):
            return 0
        return k

    def terminates(i: int) -> bool:
        """Whether line i (non-empty, indent < 4) ends a paragraph: fence, hr, html_block, heading (silent)."""
        b = body[i]
        c = b[0]
        if c == "`" or c == "~":
            return fence_open(i) is not None
        if c == "*" or c == "-" or c == "_":
            return is_hr(b)
        if c == "<":
            for open_re, _close, can_end in seqs:
                if open_re.search(b):
                    return can_end
            return False
        if c == "#":
            return atx_level(b) > 0
        return False

    line = 0
    while line < n:
        while line < n and not body[line]:
            line += 1
        if line >= n:
            break
        b = body[line]
        c = b[0]
        if ind[line] >= 4:                                   # indented code
            last = nxt = line + 1
            while nxt < n:
                if not body[nxt]:
                    nxt += 1
                elif ind[nxt] >= 4:
                    nxt += 1
                    last = nxt
                else:
                    break
            out.append(("code_block", line, last, 0, "", False))
            line = last
            continue
        if c == "`" or c == "~":
            f = fence_open(line)
            if f is not None:
                m, k = f
                nxt = line + 1
                found = False
                while nxt < n:
                    nb = body[nxt]
                    if nb[:1] == m and ind[nxt] < 4:
                        r = len(nb) - len(nb.lstrip(m))
                        if r >= k and not nb[r:].strip(" \t"):
                            found = True
                            break
                    nxt += 1
                end = nxt + 1 if found else nxt
                out.append(("fence", line, end, 0, "", False))
                line = end
                continue
        if (c == "*" or c == "-" or c == "_") and is_hr(b):
            line += 1
            continue
        if c == "<":
            seq = None
            for candidate in seqs:
                if candidate[0].search(b):
                    seq = candidate
                    break
            if seq is not None:
                close = seq[1]
                nxt = line + 1
                if not close.search(b):
                    while nxt < n:
                        nb = body[nxt]
                        if close.search(nb):
                            if nb:
                                nxt += 1
                            break
                        nxt += 1
                out.append(("html_block", line, nxt, 0, "", b.startswith("<!--")))
                line = nxt
                continue
        if c == "#":
            level = atx_level(b)
            if level:
                rest = b[level:].rstrip(" \t")
                cut = rest.rstrip("#")
                if cut and cut[-1] in " \t":
                    rest = cut
                out.append(("heading", line, line + 1, level, _md_trim(rest), False))
                line += 1
                continue
        # setext heading or paragraph: runs to a blank line, an underline or a line that interrupts it
        nxt = line + 1
        setext = 0
        while nxt < n:
            nb = body[nxt]
            if not nb:
                break
            if ind[nxt] > 3:                                  # lazy continuation
                nxt += 1
                continue
            m = nb[0]
            if (m == "=" or m == "-") and not nb.lstrip(m).strip(" \t"):
                setext = 1 if m == "=" else 2
                break
            if terminates(nxt):
                break
            nxt += 1
        if setext:
            out.append(("setext", line, nxt + 1, setext, "", False))
            line = nxt + 1
        else:
            line = nxt
    return out


def _front_matter_lines(text: str, lines: Lines) -> int:
    """Number of lines of a leading front-matter block (0 when there is none), as the readers' one front-matter
    parser bounds it (sources/textutil.front_matter_end), valid YAML or not."""
    from kb_assets.sources.textutil import front_matter_end

    end = front_matter_end(text)
    return lines.line_of(end - 1) + 1 if end else 0


def _parse_view(text: str, lines: Lines) -> tuple[str, int, bool]:
    """(the text the block scanner reads, front-matter lines blanked in it, whether lone CRs were blanked):
    front matter is a section of its own, and markdown-it counts a lone CR as a line break, we do not. Lines
    of the view are lines of `text` (as `Lines` counts them), so its blocks are in the stored text's lines."""
    fm = _front_matter_lines(text, lines)
    parse_text = text
    if fm:
        rest = text[lines.starts[fm]:] if fm < lines.count else ""
        parse_text = "\n" * fm + rest if fm < lines.count else "\n" * (lines.count - 1)
    lone_cr = False
    if "\r" in parse_text:
        blanked = _LONE_CR.sub(" ", parse_text)
        lone_cr = blanked != parse_text
        parse_text = blanked
    return parse_text, fm, lone_cr


def view_blocks(text: str) -> tuple[list[Block], int, bool]:
    """(`block_structure` of the chunker's view of `text`, front-matter lines blanked, lone CRs blanked): the
    one scan of a markdown text in the documents stage, for the readers (textutil.headings) and documents.blocks
    alike. Its lines are lines of `text` split on "\\n". A text with neither front matter nor a lone CR is its
    own view (no extra work); for the others the last two views are kept per thread, so the readers and the
    stored scan share one scan there too. Raises what the scanner raises."""
    if "\r" not in text and not text.startswith("---"):
        return block_structure(text), 0, False
    memo = getattr(_local, "views", None)
    if memo is None:
        memo = _local.views = []
    for seen, view in memo:
        if seen == text:
            return list(view[0]), view[1], view[2]
    lines = Lines(text)
    parse_text, fm, lone_cr = _parse_view(text, lines)
    view = (block_structure(parse_text), fm, lone_cr)
    memo.insert(0, (text, view))
    del memo[2:]
    return list(view[0]), fm, lone_cr


def stored_blocks(text: str) -> dict:
    """The stored form of `block_structure` over the chunker's view of `text`: {"v", "md": [[kind, first line,
    end line, level, ATX title, html comment], ...], "fm": front-matter lines blanked, "cr": lone CRs blanked}
    ("md" absent when the scanner failed: readers of it then fall back to their own scan, which fails alike)."""
    try:
        blocks, fm, lone_cr = view_blocks(text)
    except Exception:
        lines = Lines(text)
        _parse_text, fm, lone_cr = _parse_view(text, lines)
        return {"v": BLOCKS_VERSION, "fm": fm, "cr": lone_cr}
    return {"v": BLOCKS_VERSION, "fm": fm, "cr": lone_cr, "md": [list(b) for b in blocks]}


def blocks_from_stored(stored) -> list[Block] | None:
    """The blocks of a documents.blocks value, or None when it holds none usable (NULL, older version, failed)."""
    if not isinstance(stored, dict) or stored.get("v") != BLOCKS_VERSION or not isinstance(stored.get("md"), list):
        return None
    return [(k, a, b, lv, t, c) for k, a, b, lv, t, c in stored["md"]]


def markdown_sections(text: str, lines: Lines, *, markers: bool = False,
                      stored: dict | None = None) -> list[Section] | None:
    """Sections of a markdown text, or None when the parser fails.

    markers: an HTML comment at the top level (`<!-- BEGIN ... -->` in CLAUDE.md / AGENTS.md) also starts a
    section, under the current heading.
    stored: the text's documents.blocks (`stored_blocks(text)`, written by the documents stage): its blocks
    are used instead of scanning again; without it (a row stored before migration 008) the text is scanned.
    """
    blocks = blocks_from_stored(stored)
    if blocks is not None:
        fm = int(stored.get("fm") or 0)
    else:
        try:
            blocks, fm, _lone_cr = view_blocks(text)
        except Exception:   # anything can happen on hostile input: it must not take the document down
            return None

    events: list[tuple[int, int, int, str]] = []    # (first line, end line, level or 0 for a marker, title)
    protected_lines: list[tuple[int, int]] = []
    for kind, a, b, level, title, comment in blocks:
        if kind == "heading":
            events.append((a, b, level, title))
        elif kind == "setext":                       # the title is every line above the underline
            title = " ".join(lines.line(k).strip() for k in range(a, b - 1))
            if _NOT_SETEXT.match(title):
                continue     # "- item\n---": a list (or quote) followed by a rule, not a heading
            events.append((a, b, level, title))
        else:                                        # fence, code_block, html_block
            protected_lines.append((a, b))
            if markers and comment:
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
