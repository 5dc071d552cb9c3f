"""The offline signposter: no LLM, no key, deterministic.

It derives the signpost schema from the document itself:
- summary: title + the first meaningful paragraph of Abstract / Summary / Context / Overview ... (metadata tables,
  badges, status and date lines skipped), cut at a sentence or word boundary;
- key_decisions: from Decision / Decision Outcome / Resolution sections (MADR "Chosen option: X, because Y",
  bullet lists, the section's lead statement), "We will ..." statements outside the context, and "we chose /
  decided / have chosen ... (because ...)" sentences anywhere; each with a rationale (the because-clause, the
  following sentence, a Rationale section, the Consequences' or the Context's first sentence);
- status and tags: documents.meta first, else YAML front matter, a metadata table, "Key: value" header fields
  (PEP style), MADR "* Status:" bullets, or a "## Status" section;
- artifacts: file paths mentioned (plus meta["files_touched"] for transcripts);
- components: backticked identifiers, CamelCase identifiers, capitalised names and acronyms used repeatedly;
- work_types: from the kind and keywords.
Code files get purpose (module docstring / leading comment), key functions with their first doc line (Python via
ast, other languages via regex), SQL tables referenced and HTTP routes.
"""
from __future__ import annotations

import ast
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import PurePosixPath
from typing import Any, Iterable

from kb_assets.signposts.base import SignpostInput
from kb_assets.sources.python_ast import parse_python

SUMMARY_CHARS = 300
MAX_DECISIONS = 8
MAX_COMPONENTS = 15
MAX_ARTIFACTS = 30
MAX_WORK_TYPES = 5


# The signposter's class and its version live apart, in a module that imports none of the heuristics below
# (a pass with nothing to signpost needs only its name and version): re-exported here, their home before.
from kb_assets.signposts.extractive_signposter import ALGORITHM_VERSION, ExtractiveSignposter  # noqa: E402,F401


# ================================================================================================ text helpers

_WS = re.compile(r"\s+")
_MD_IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")
_MD_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")
_MD_REFLINK = re.compile(r"\[([^\]]+)\]\[[^\]]*\]")
_AUTOLINK = re.compile(r"<(?:https?|mailto):[^>]+>")
_HTML_TAG = re.compile(r"</?(?:a|b|i|u|s|em|strong|br|p|div|span|img|sup|sub|code|pre|details|summary|table|thead|"
                       r"tbody|tr|td|th|ul|ol|li|hr|kbd|small|font|center|h[1-6]|picture|source|video|iframe|"
                       r"figure|figcaption|blockquote|dl|dt|dd|abbr|mark|del|ins|section|article|nav|header|"
                       r"footer|main)\b[^>]*>", re.I)
_HTML_COMMENT = re.compile(r"<!--.*?-->", re.S)
_MD_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|>])")
_RST_ROLE = re.compile(r":([a-z:]+):`([^`<]*?)\s*(?:<[^>]*>)?`")
_RST_LINK = re.compile(r"`([^`<]+?)\s*<[^>]+>`_{1,2}")
_RST_REF = re.compile(r"`([^`]+)`_{1,2}")
_DOUBLE_BACKTICK = re.compile(r"``([^`]+)``")
_BACKTICK = re.compile(r"`([^`\n]+)`")
_BOLD = re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1")
# The lookbehind comes after the opening marker (same condition: the character before the marker is no word or
# marker character), so the pattern starts with a literal the regex engine scans for instead of trying every position.
_ITALIC_STAR = re.compile(r"\*(?<![\w*]\*)(?=\S)([^*\n]+?)(?<=\S)\*(?![\w*])")
_ITALIC_UNDER = re.compile(r"_(?<![\w_]_)(?=\S)([^_\n]+?)(?<=\S)_(?![\w_])")


def _role(m: re.Match) -> str:
    role, text = m.group(1), m.group(2).strip()
    if role in ("pep", "rfc") and text.isdigit():
        return f"{role.upper()} {text}"
    return text.lstrip("~!.")


def clean_inline(text: str) -> str:
    """Markdown / reST inline markup → plain prose."""
    # Each substitution runs only when the text holds a character its pattern needs (an `in` scan is far cheaper
    # than a regex pass, and most paragraphs have no markup): the result is the same as running all of them.
    if "<!--" in text:
        text = _HTML_COMMENT.sub(" ", text)
    if "[" in text:
        if "![" in text:
            text = _MD_IMAGE.sub(" ", text)
        if "](" in text:
            text = _MD_LINK.sub(r"\1", text)
        if "][" in text:
            text = _MD_REFLINK.sub(r"\1", text)
    if "<" in text:
        text = _AUTOLINK.sub(" ", text)
    if "`" in text:
        if ":`" in text:
            text = _RST_ROLE.sub(_role, text)
        if "`_" in text:
            text = _RST_LINK.sub(r"\1", text)
        if "``" in text:
            text = _DOUBLE_BACKTICK.sub(r"\1", text)
        if "`_" in text:
            text = _RST_REF.sub(r"\1", text)
        if "`" in text:
            text = _BACKTICK.sub(r"\1", text)
    if "**" in text or "__" in text:
        text = _BOLD.sub(r"\2", text)
    if "*" in text:
        text = _ITALIC_STAR.sub(r"\1", text)
    if "_" in text:
        text = _ITALIC_UNDER.sub(r"\1", text)
    if "<" in text:
        text = _HTML_TAG.sub(" ", text)
    if "\\" in text:
        text = _MD_ESCAPE.sub(r"\1", text)
    return " ".join(text.split())     # = _WS.sub(" ", text).strip(): str and re agree on what is whitespace


_ABBREV = ("e.g.", "i.e.", "etc.", "vs.", "cf.", "Dr.", "Mr.", "Ms.", "approx.", "no.", "No.", "Fig.", "al.")
_SENT_END = re.compile(r"(?<=[.!?])[\"')\]]?\s+(?=[\"'(\[]?[A-Z0-9*_`])")


def split_sentences(text: str) -> list[str]:
    parts = _SENT_END.split(text)
    out: list[str] = []
    for p in parts:
        p = p.strip()
        if not p:
            continue
        if out and out[-1].endswith(_ABBREV):
            out[-1] = out[-1] + " " + p
        else:
            out.append(p)
    return out


def shorten(text: str, limit: int) -> str:
    """Cut at a sentence boundary if one falls late enough, else at a word boundary with an ellipsis."""
    text = _WS.sub(" ", text).strip()
    if len(text) <= limit:
        return text
    window = text[: limit + 1]
    best = -1
    for m in re.finditer(r"[.!?](?=\s|$)", window):
        if m.end() <= limit:
            best = m.end()
    if best >= limit * 0.45:
        return text[:best].strip()
    cut = text[: limit - 1]
    sp = cut.rfind(" ")
    if sp > limit * 0.5:
        cut = cut[:sp]
    return cut.rstrip(" ,;:-(—") + "…"


def _title_case_status(s: str) -> str:
    return s.title() if s.isupper() or s.islower() else s


# ================================================================================================ structure

@dataclass
class Section:
    title: str
    level: int
    lines: list[str] = field(default_factory=list)

    @cached_property
    def key(self) -> str:
        t = clean_inline(self.title).lower()
        t = re.sub(r"^[\d.\s]+", "", t)          # "2. Decision" → "decision"
        return re.sub(r"[^a-z0-9 ;&/-]", "", t).strip()

    def paragraphs(self) -> list[str]:
        return paragraphs(self.lines)


@dataclass
class ParsedDoc:
    title: str
    header: dict[str, str]            # front matter / header fields / metadata table, lower-cased keys
    preamble: list[str]               # lines before the first section heading (after the title)
    sections: list[Section]
    prose_lines: list[str]            # body lines outside code blocks and headings (for entity counting)

    def find(self, *names: str, prefix: bool = True) -> Section | None:
        for name in names:
            for s in self.sections:
                k = s.key
                if k == name or (prefix and k.startswith(name + " ")) or (prefix and k.startswith(name + ":")):
                    return s
        return None


_FENCE = re.compile(r"^\s*(```|~~~)")
_ATX = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_HEADER_FIELD = re.compile(r"^([A-Z][A-Za-z-]{1,30}):\s*(.*)$")
_TABLE_ROW = re.compile(r"^\s*\|(.+)\|\s*$")
_TABLE_SEP = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$")
_BULLET_FIELD = re.compile(r"^\s*[*-]\s+\**(status|date|deciders|tags|technical story|authors?)\**\s*:\s*(.+)$", re.I)
_META_KEYS = {"status", "date", "tags", "author", "authors", "deciders", "type", "topic", "created", "keywords",
              "category", "categories", "labels", "superseded-by", "supersedes", "resolution", "title"}


def _parse_front_matter(lines: list[str]) -> tuple[dict[str, str], int]:
    """A leading YAML block, read by the readers' one front-matter parser (sources/textutil.split_front_matter);
    the documents stage has already taken it off stored texts, so this sees one only in a text given directly."""
    from kb_assets.sources.textutil import front_matter_end, split_front_matter

    text = "\n".join(lines)
    end = front_matter_end(text)
    if not end:
        return {}, 0
    data, _body, _error = split_front_matter(text)
    out: dict[str, str] = {}
    for k, v in data.items():
        if isinstance(v, (list, tuple)):
            v = ", ".join(str(x) for x in v)
        out[str(k).strip().lower()] = str(v) if v is not None else ""
    return out, text.count("\n", 0, end) + (0 if text[end - 1] == "\n" else 1)


_SIGNPOST_HEADER_KEY = re.compile(r"[A-Z][A-Za-z-]{1,30}")


def _parse_header_fields(lines: list[str], start: int, stored: dict | None = None) -> tuple[dict[str, str], int]:
    """PEP / RFC-822 style 'Key: value' lines (with indented continuations) at the top of the document, from the
    index's one header parser (sources/textutil.rfc822_header), taken as a metadata header when its keys are
    capitalised words and one of them is a metadata key. stored: the reST structure of the documents stage
    (documents.blocks "rst"), whose header was parsed from line 0 by that parser: used when the header starts
    there, instead of parsing again."""
    from kb_assets.sources.textutil import header_dict, rfc822_header

    i = start
    while i < len(lines) and not lines[i].strip():
        i += 1
    if stored is not None and i == 0:
        hdr = stored.get("hdr")
        header = ([(k, v) for k, v in hdr[2]], int(hdr[0])) if hdr else None
    else:
        header = rfc822_header(lines, i, max_lines=len(lines))
    if header is None:
        return {}, start
    pairs, j = header
    if not all(_SIGNPOST_HEADER_KEY.fullmatch(k) for k, _ in pairs):
        return {}, start
    out = header_dict(pairs)
    if any(k in _META_KEYS for k in out):
        return out, j
    return {}, start


def _split_cells(line: str) -> list[str]:
    m = _TABLE_ROW.match(line)
    inner = m.group(1) if m else line.strip().strip("|")
    return [c.strip() for c in inner.split("|")]


def _markdown_headings(lines: list[str], stored: dict | None = None) -> dict[int, tuple[str, int, int]]:
    """{0-based line: (title, level, lines consumed)} from the one heading parser of the index (the chunker's
    markdown-it block scanner, also the readers' textutil.headings), for a markdown document.

    stored: the text's documents.blocks (the documents stage's scan, over the chunker's view of the text). It is
    this scan's result exactly when that view blanked nothing (no front matter, no lone CR: CRLF is normalised
    by the scanner itself, as here), and is used then instead of scanning again."""
    from kb_assets.chunking.markdown import _NOT_SETEXT, block_structure, blocks_from_stored

    out: dict[int, tuple[str, int, int]] = {}
    blocks = blocks_from_stored(stored) if stored and not stored.get("fm") and not stored.get("cr") else None
    if blocks is None:
        try:
            blocks = block_structure("\n".join(lines))
        except Exception:
            return out
    for kind, a, b, level, title, _comment in blocks:
        if kind == "heading":
            out[a] = (title.strip(), level, 1)
        elif kind == "setext":
            t = " ".join(lines[k].strip() for k in range(a, b - 1))
            if t and not _NOT_SETEXT.match(t):
                out[a] = (t, level, b - a)
    return out


def _rst_headings(lines: list[str], start: int, stored: dict | None = None) -> dict[int, tuple[str, int, int]]:
    """{0-based line: (title, level, lines consumed)} of the reST section titles from line `start` on, from the
    index's one adornment parser (the chunker's chunking/rst.rst_titles: docutils' rules, levels in order of
    first appearance, an overlined style distinct from the same underline alone). stored: the documents stage's
    reST structure (documents.blocks "rst"), its titles from the header's end on: used when that is `start`."""
    from kb_assets.chunking.core import Lines
    from kb_assets.chunking.rst import rst_titles

    if stored is not None and start == (int(stored["hdr"][0]) if stored.get("hdr") else 0):
        titles = stored["titles"]
    else:
        text = "\n".join(lines)
        try:
            titles = rst_titles(lines, start, Lines(text))
        except Exception:
            return {}
    return {first: (title, level, end - first) for first, end, level, title in titles}


def parse_document(text: str, fallback_title: str = "", *, markdown: bool = False, rst: bool = False,
                   blocks: dict | None = None) -> ParsedDoc:
    """markdown: headings come from the index's one markdown heading parser; rst (a reST document, as the
    chunker shapes it): the reST titles of the chunker's adornment parser only; else ATX lines (transcript turns)
    and those reST titles. blocks: the text's documents.blocks (the documents stage's parse), read instead of
    parsing where it is this parse exactly."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    # the stored reST structure counts lines of the text split on "\n" only: it is these lines without a CR
    rst_stored = None
    if not markdown and "\r" not in text:
        from kb_assets.chunking.rst import rst_from_stored

        rst_stored = rst_from_stored(blocks)
    header, pos = _parse_front_matter(lines)
    fields, pos2 = _parse_header_fields(lines, pos, rst_stored if pos == 0 else None)
    header.update({k: v for k, v in fields.items() if k not in header})
    pos = pos2

    title = header.get("title", "")
    sections: list[Section] = []
    preamble: list[str] = []
    prose: list[str] = []
    in_fence = False
    fence_mark = ""
    i = pos
    current: Section | None = None
    md_heads = _markdown_headings(lines, blocks) if markdown else None
    rst_heads = {} if markdown else _rst_headings(lines, pos, rst_stored)

    def add_line(line: str) -> None:
        (current.lines if current is not None else preamble).append(line)

    while i < len(lines):
        line = lines[i]
        fm = _FENCE.match(line)
        if fm:
            if not in_fence:
                in_fence, fence_mark = True, fm.group(1)
            elif fm.group(1) == fence_mark:
                in_fence = False
            add_line(line)
            i += 1
            continue
        if in_fence:
            add_line(line)
            i += 1
            continue
        heading: tuple[str, int] | None = None
        consumed = 1
        m = None if md_heads is not None or rst else _ATX.match(line)
        if md_heads is not None:
            if i in md_heads:
                title_text, level, consumed = md_heads[i]
                heading = (title_text, level)
        elif m:
            heading = (m.group(2), len(m.group(1)))
        elif i in rst_heads:
            title_text, level, consumed = rst_heads[i]
            heading = (title_text, level)
        if heading:
            htext = clean_inline(heading[0])
            if not title and heading[1] == 1 and not sections and not any(l.strip() for l in preamble
                                                                          if not _is_meta_line(l)):
                title = htext
            else:
                current = Section(htext, heading[1])
                sections.append(current)
            i += consumed
            continue
        add_line(line)
        if line.strip() and not line.startswith(("    ", "\t")):
            prose.append(line)
        i += 1

    # A metadata table near the top (NATS style |Metadata|Value|) or MADR "* Status: x" bullets.
    for block in (preamble, sections[0].lines if sections else []):
        for key, value in _table_fields(block).items():
            header.setdefault(key, value)
        for line in block[:40]:
            bm = _BULLET_FIELD.match(line)
            if bm:
                header.setdefault(bm.group(1).lower(), clean_inline(bm.group(2)))
    for line in preamble[:10]:
        m = re.match(r"^\s*\**(Date|Status)\**\s*:\s*(.+)$", line, re.I)
        if m:
            header.setdefault(m.group(1).lower(), clean_inline(m.group(2)))
    if not title:
        title = fallback_title
    return ParsedDoc(title=title, header=header, preamble=preamble, sections=sections, prose_lines=prose)


def _table_fields(lines: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    rows = [l for l in lines[:60] if _TABLE_ROW.match(l) and not _TABLE_SEP.match(l)]
    for row in rows:
        cells = _split_cells(row)
        if len(cells) == 2:
            key = clean_inline(cells[0]).lower().rstrip(":")
            if key in _META_KEYS and key != "title":
                out.setdefault(key, clean_inline(cells[1]))
    return out


def _is_meta_line(line: str) -> bool:
    s = line.strip()
    return (not s or s.startswith(("|", "<!--", "[![", "![", "---")) or bool(_TABLE_SEP.match(s))
            or bool(re.match(r"^\**(date|status|author|authors|deciders|tags)\**\s*:", s, re.I)))


def paragraphs(lines: list[str]) -> list[str]:
    """Prose paragraphs: blank-line separated, code blocks / tables / directives / indented blocks dropped."""
    out: list[str] = []
    buf: list[str] = []
    in_fence = False
    fence_mark = ""
    literal = False            # reST literal block after '::'

    def flush() -> None:
        nonlocal buf
        if buf:
            out.append("\n".join(buf))
        buf = []

    for line in lines:
        fm = _FENCE.match(line)
        if fm:
            flush()
            if not in_fence:
                in_fence, fence_mark = True, fm.group(1)
            elif fm.group(1) == fence_mark:
                in_fence = False
            continue
        if in_fence:
            continue
        if not line.strip():
            flush()
            continue
        if literal:
            if line.startswith((" ", "\t")):
                continue
            literal = False
        if line.startswith(("    ", "\t")) and not buf and not line.lstrip().startswith(("-", "*", "+")):
            continue            # indented block: code or quote
        buf.append(line)
        if line.rstrip().endswith("::"):
            literal = True
            flush()
    flush()
    return out


_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)]|#\.)\s+")


def _is_meaningful(par: str) -> bool:
    first = par.lstrip()
    if first.startswith(("|", "<", "[![", "![", "..", ">", "```", "~~~", "{", "=", "+--")):
        return False
    if _TABLE_SEP.match(first.split("\n", 1)[0]):
        return False
    lines = par.split("\n")
    if all(_is_meta_line(l) or _HEADER_FIELD.match(l.strip()) for l in lines):
        return False
    plain = clean_inline(par)
    if len(plain) < 40 or len(re.findall(r"[A-Za-z]{2,}", plain)) < 6:
        return False
    if plain.lower().startswith(("table of contents", "contents")):
        return False
    return True


def _prose(par: str) -> str:
    lines = [_LIST_ITEM.sub("", l) for l in par.split("\n")]
    return clean_inline(" ".join(lines))


# ================================================================================================ metadata

_STATUS_WORDS = (
    "partially implemented", "not implemented", "implemented", "accepted", "proposed", "superseded", "deprecated",
    "rejected", "draft", "approved", "final", "active", "withdrawn", "deferred", "completed", "complete",
    "in progress", "amended", "obsolete", "retired", "provisional", "april fool!", "on hold", "abandoned",
    "replaced", "open", "closed", "done", "declined", "postponed", "experimental", "stable", "living",
)


def normalise_status(raw: str) -> str:
    """The status as a reader needs it: the canonical word (the one normaliser of the readers,
    sources/decisions.normalize_status), the document's own word beside it when it differs ("Implemented
    (Done)"), and a relation it states ("Superseded by ADR-12")."""
    from kb_assets.sources.decisions import normalize_status as canonical_status

    s = clean_inline(raw).strip(" .:-*")
    if not s:
        return ""
    low = s.lower()
    for w in _STATUS_WORDS:
        if low.startswith(w):
            rest = s[len(w):]
            m = re.match(r"^\s+(by|in favou?r of|with)\s+(.{1,60}?)(?:[.;(]|$)", rest, re.I)
            head = _title_case_status(s[: len(w)])
            canon = canonical_status(head) if not w.startswith("not ") else None
            if canon and canon.lower() != head.lower():
                head = f"{canon} ({head})"
            if m and w in ("superseded", "amended", "replaced", "deprecated"):
                return f"{head} {m.group(1).lower()} {m.group(2).strip()}"
            return head
    first = split_sentences(s)[0] if s else s
    return shorten(first, 60)


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (list, tuple, set)):
        items = [str(v) for v in value]
    else:
        items = re.split(r"[,;]", str(value))
    return [clean_inline(i).strip(" #[]\"'").lower() for i in items if clean_inline(i).strip(" #[]\"'")]


def extract_status(doc: ParsedDoc, meta: dict) -> str:
    raw = clean_inline(str(meta.get("status_raw") or "")).strip()
    for key in ("status", "state"):
        if meta.get(key):
            status = normalise_status(str(meta[key]))
            # the ADR's own word beside the normalised one: "Accepted (Approved)"
            if raw and status and status.split()[0].lower() not in raw.lower():
                status = f"{status} ({shorten(raw, 40)})"
            by = meta.get("superseded_by")
            if isinstance(by, (list, tuple)):
                by = by[0] if by else ""
            if by and status.lower().startswith("superseded") and " by " not in status:
                status = f"{status} by {PurePosixPath(str(by)).name}"
            return status
    if doc.header.get("status"):
        return normalise_status(doc.header["status"])
    sec = doc.find("status")
    if sec:
        pars = [_prose(p) for p in sec.paragraphs() if _prose(p)]
        if pars:
            status = normalise_status(pars[0])
            # "Accepted" followed by "Amended by [17. ...](...)": keep the relation, it matters to a reader
            for extra in pars[1:3]:
                if re.match(r"^(amended by|amends|superseded by|supersedes|replaced by|replaces)\b", extra, re.I):
                    status = f"{status}; {shorten(extra, 80)}"
                    break
            return status
    return ""


def extract_tags(doc: ParsedDoc, meta: dict) -> list[str]:
    tags: list[str] = []
    for key in ("tags", "labels", "keywords", "topics", "categories"):
        if meta.get(key):
            tags += _as_list(meta[key])
    if not tags:
        for key in ("tags", "keywords", "labels", "categories", "category"):
            if doc.header.get(key):
                tags += _as_list(doc.header[key])
    for key in ("topic", "type"):           # PEP headers: Topic: Packaging, Type: Standards Track
        if doc.header.get(key) and len(doc.header[key]) < 40:
            tags += _as_list(doc.header[key])
    seen: list[str] = []
    for t in tags:
        if t and t not in seen:
            seen.append(t)
    return seen


# ================================================================================================ summary

_LEAD_SECTIONS_FIRST = ("abstract", "summary", "tl;dr", "tldr", "executive summary", "synopsis")
_LEAD_SECTIONS = ("context and problem statement", "context", "problem statement", "overview", "introduction",
                  "motivation", "background", "purpose", "description", "problem", "goal", "goals",
                  "context and motivation")
_SKIP_LEAD = ("status", "metadata", "table of contents", "contents", "release history", "revision history",
              "copyright", "references", "footnotes", "version history", "update history")


def _first_meaningful(pars: Iterable[str]) -> str:
    for par in pars:
        if _is_meaningful(par) and not _LIST_ITEM.match(par):
            return _prose(par)
    return ""


def extract_lead(doc: ParsedDoc) -> str:
    for names in (_LEAD_SECTIONS_FIRST, _LEAD_SECTIONS):
        for name in names:
            sec = doc.find(name)
            if sec:
                lead = _first_meaningful(sec.paragraphs())
                if lead:
                    return lead
    lead = _first_meaningful(paragraphs(doc.preamble))
    if lead:
        return lead
    for sec in doc.sections:
        if sec.key.startswith(_SKIP_LEAD):
            continue
        lead = _first_meaningful(sec.paragraphs())
        if lead:
            return lead
    # nothing but lists: take the first list paragraph
    for sec in [Section("", 0, doc.preamble)] + doc.sections:
        for par in sec.paragraphs():
            if _LIST_ITEM.match(par) and len(_prose(par)) >= 30:
                return _prose(par)
    return ""


def make_summary(title: str, lead: str, limit: int = SUMMARY_CHARS) -> str:
    title = clean_inline(title)
    lead = clean_inline(lead)
    if not lead:
        return shorten(title, limit)
    if not title or lead.lower().startswith(title.lower()):
        return shorten(lead, limit)
    sep = " — " if not title.endswith((".", ":", "?", "!")) else " "
    head = title + sep
    if len(head) > limit * 0.6:
        head = shorten(title, int(limit * 0.5)) + " — "
    return head + shorten(lead, limit - len(head))


# ================================================================================================ decisions

_DECISION_SECTIONS = ("decision outcome", "decision", "decisions", "the decision", "decision made", "resolution",
                      "outcome", "chosen option", "what we decided", "agreed approach")
_DESIGN_SECTIONS = ("design", "proposal", "proposed solution", "proposed design", "solution", "approach",
                    "specification", "basic design", "solution overview")
_RATIONALE_SECTIONS = ("rationale", "justification", "reasoning", "why")
_CONSEQUENCE_SECTIONS = ("consequences", "positive consequences", "positive", "pros", "benefits", "implications")
_CONTEXT_SECTIONS = ("context and problem statement", "context", "problem statement", "context and motivation",
                     "motivation", "background", "problem")
_NO_HARVEST = ("context", "status", "problem", "background", "motivation", "prior art", "considered options",
               "options", "alternatives", "rejected", "references", "open questions", "questions", "history",
               "revision history", "release history", "footnotes", "copyright", "scenarios", "examples",
               "negative consequences", "negatives", "risks", "drawbacks", "cons")

_CHOSEN = re.compile(r"chosen option:?\s*[\"“']?(.+?)[\"”']?\s*(?:,\s*because|because)\s+(.+)$", re.I | re.S)
_CHOSEN_NOBECAUSE = re.compile(r"chosen option:?\s*[\"“']?(.+?)[\"”']?\s*[.,]?$", re.I | re.S)
_WE_WILL = re.compile(r"^(?:therefore,?\s+|so,?\s+|thus,?\s+|going forward,?\s+|instead,?\s+|in future,?\s+)?"
                      r"(we\s+(?:will|shall|are going to|'ll)\s+(?!not\s+be\s+able|need\s+to\s+decide|"
                      r"likely|probably|possibly|also\s+need|have\s+to\s+decide|see\b|look\b|discuss|describe|"
                      r"explain|cover|explore|refer)\S.+)", re.I)
_WE = re.compile("we", re.I)          # in every match of _WE_WILL and _WE_DECIDED
_WE_DECIDED = re.compile(r"\bwe(?:'ve|\s+have)?\s+(?:decided|chosen|chose|agreed|opted|selected|settled)\b", re.I)
_DECISION_VERB = re.compile(r"\b(?:will|shall|must|decided|chose|chosen|adopt\w*|use|using|replace\w*|retire\w*|"
                            r"deprecate\w*|migrate\w*|move|switch\w*|introduc\w*|standardi[sz]e\w*)\b", re.I)
_THIS_PROPOSES = re.compile(r"^(?:this\s+is\s+a\s+proposal\s+(?:for|to)\b|"
                            r"this\s+(?:pep|adr|rfc|document|proposal|design|record|change)\s+"
                            r"(?:proposes|recommends|introduces|specifies|defines|deprecates|adds|removes|"
                            r"establishes|standardi[sz]es)\b)", re.I)
_BECAUSE = re.compile(r"^(.{12,}?)[,;]?\s+(because|so that|in order to)\s+(.{8,})$", re.I | re.S)
_STATUS_ONLY = re.compile(r"^(?:implemented|accepted|approved|agreed|done|merged|completed|adopted|rejected|"
                          r"proposed|see above|n/?a|tbd)\b[\w\s,.-]{0,40}$", re.I)
# A rationale is a reason the document gives: a sentence with one of these cues (not the Context's opening, not a
# downside listed among the consequences, not another decision).
_REASON_CUE = re.compile(
    r"\b(?:because|since|so that|in order to|due to|given (?:that|the)|otherwise|the reason|motivat\w*|"
    r"(?:this|which|that|it) (?:means|allows?|lets|gives|makes|keeps|avoids|reduces|ensures|enables|removes|"
    r"simplifies|conforms|provides|will (?:allow|let|make|mean|reduce|give|enable|remove|simplify|improve))|"
    r"to (?:avoid|ensure|allow|reduce|keep|make|simplify|prevent|remove|enable|improve|support|speed)|"
    r"benefit\w*|advantage\w*|easier|simpler|cheaper|faster|safer|quicker|more (?:reliable|secure|efficient|"
    r"flexible|robust|consistent|maintainable)|less (?:work|code|complex\w*|effort|expensive|risk\w*|error)|"
    r"reduc\w+|avoid\w*|enabl\w+|ensur\w+|improv\w+|conform\w*|standard|recommended|policy|mature|"
    r"well[- ]known|widely|familiar|proven|burden|unnecessary|too (?:slow|complex|expensive|unreliable|costly)|"
    r"no longer|deprecat\w+|maintained|supported by|compatib\w+|quickly|able to|less|fewer|no risk|"
    r"ergonomic\w*|workaround|decreas\w+|widespread|wide adoption|popular|built-in|has (?:native )?support|"
    r"supports|offers|comes with|out of the box)\b", re.I)
# Within the Decision section itself, only an explicit reason ("because", "so that", "this allows") is one: its
# other sentences are mostly more of the design.
_STRONG_REASON = re.compile(
    r"\b(?:because|since|so that|in order to|due to|given (?:that|the)|the reason|motivat\w*|benefit\w*|"
    r"advantage\w*|(?:this|which|that|it|doing so) (?:means|allows?|lets|gives|makes|keeps|avoids|reduces|ensures|"
    r"enables|removes|simplifies|will (?:allow|let|make|mean|reduce|give|enable|remove|simplify|improve)))\b", re.I)
_DOWNSIDE = re.compile(
    r"\b(?:harder|more difficult|difficult|risk\w*|might|may (?:find|need|have|be|not)|will (?:have|need) to|"
    r"need to|slow(?:er|ly)?|cost(?:s|ly)? more|drawbacks?|downsides?|cannot|can't|won't|not (?:be )?able|"
    r"only supports?|supports? .{0,40}\bonly\b|limitation\w*|lose|loss|breaking|overhead|bugs?|"
    r"more (?:work|effort)|larger|worse|may (?:take|cause|require|break|result)|(?:a )?long time)\b", re.I)
# The problem a decision answers, as the context states it: a reason too (but never the context's opening
# sentence, which the summary already shows).
_PROBLEM_CUE = re.compile(
    r"\b(?:needs?|needed|require[sd]?|requirement|problem\w*|issue\w*|there (?:is|was) no|no way|not possible|"
    r"impossible|cannot|can't|unable|lack\w*|missing|want\w*|goal|hard to|difficult|painful|error[- ]prone|"
    r"confus\w+|inconsisten\w+|ambiguous|expensive|slow|manual\w*|duplicat\w+|fragile|brittle|workaround|"
    r"not ergonomic)\b", re.I)
_NOT_A_DECISION = re.compile(
    r"^(?:we\s+(?:have\s+)?(?:discussed|considered|looked at|evaluated|explored|investigated|identified|"
    r"outlined|reviewed|compared)\b|it (?:must|should) be noted\b|note:|for example\b)", re.I)


_IMPERATIVE = re.compile(r"^(?:use|pick|adopt|keep|move|add|remove|create|replace|prefer|choose|switch|stop|start|"
                         r"run|deploy|store|make|provide|define|introduce|retain|manage|migrate)\b", re.I)
_BENEFIT_SUBJECT = re.compile(r"^(?:this|it|that|these|doing so|which|because|since|as|so|\w+ing)\b", re.I)


def _is_decision_like(sentence: str) -> bool:
    """Another decision, not a reason for one: "X will be Y", "Pick Z", "To do A, we will B"."""
    if _THIS_PROPOSES.match(sentence) or _WE_WILL.match(sentence) or _WE_DECIDED.search(sentence):
        return True
    if _IMPERATIVE.match(sentence):
        return True
    if not re.search(r"\bwe\s+(?:will|shall|must)\b", sentence, re.I) and re.search(
            r"\b(?:will|would|should)\s+(?:be\s+able|allow|make|reduce|simplif\w*|improve|enable|let|help|"
            r"mean|remove\s+the\s+need|avoid|give)\b", sentence, re.I):
        return False                   # "the frontend-lb will be able to be removed": a benefit, not a decision
    return _main_clause_modal(sentence) and not _BENEFIT_SUBJECT.match(sentence)


def _is_reason(sentence: str, *, downside_ok: bool = False) -> bool:
    if not sentence or _is_decision_like(sentence):
        return False
    if not _REASON_CUE.search(sentence):
        return False
    if downside_ok:
        return True
    # "harder for others to use but make rapid iteration easier": what comes after "but" is the point
    last = re.split(r"\b(?:but|however|although|though|yet)\b", sentence)[-1]
    return bool(_REASON_CUE.search(last)) and not _DOWNSIDE.search(re.sub(r"\bno risk\b", "", last, flags=re.I))


def _main_clause_modal(sentence: str) -> bool:
    """"will / must / shall" in the sentence's own clause, not in a "which will allow" aside."""
    head = re.split(r",?\s+(?:which|that|who|where)\s+", sentence, maxsplit=1)[0]
    return bool(re.search(r"\b(?:will|must|shall)\b", head)) and not _HEDGE.search(sentence)


_RATIONALE_LEAD = re.compile(r"^(?:this|that|it)\s+(?:was|is|has been)\s+(?:driven|motivated|needed|required|"
                             r"because|due)\b|^(?:because|the reason|the motivation)\b", re.I)
_HEDGE = re.compile(r"\b(?:if we|whether|might|could we|should we|would we)\b", re.I)
_PRONOUN_ONLY = re.compile(r"^we\s+(?:have\s+)?(?:decided|chose|chosen|opted|agreed)\s+(?:not\s+)?"
                           r"(?:to\s+)?(?:\w+\s+){0,3}(?:it|them|this|that|these|those)\.?$", re.I)
_STOP = set("""a an the this that these those it its we our us you they them their to of in on at by for from with
as is are was were be been being has have had do does did will would should could can may might must shall and or
but not no so if then than also such which who what when where why how all any each other into over under about
more most less very just only new use using used""".split())


@dataclass
class _Cand:
    decision: str
    rationale: str = ""
    primary: bool = False      # the statement that opens a Decision section


def _split_because(sentence: str) -> tuple[str, str]:
    m = _BECAUSE.match(sentence)
    if not m:
        return sentence, ""
    word = m.group(2).lower()
    rationale = m.group(3).strip().rstrip(".")
    if word in ("so that", "in order to"):
        rationale = f"{word} {rationale}"
    elif rationale.lower().startswith("of "):
        rationale = "because " + rationale
    rationale = rationale[:1].upper() + rationale[1:]
    return m.group(1).strip().rstrip(",;") + ".", rationale + "."


def _sentences_of(sec: Section | None, *, first_paragraph_only: bool = False, lists: bool = False) -> list[str]:
    """Prose sentences of a section (list paragraphs contribute their first item when lists=True)."""
    if not sec:
        return []
    out: list[str] = []
    for par in sec.paragraphs():
        if _LIST_ITEM.match(par):
            if lists:
                first_item = _LIST_ITEM.sub("", par.split("\n")[0])
                txt = clean_inline(first_item)
                if len(txt) >= 20:
                    out.append(txt)
                    if first_paragraph_only:
                        break
            continue
        if not _is_meaningful(par):
            continue
        out += split_sentences(_prose(par))
        if first_paragraph_only:
            break
    return [s for s in out if len(s) >= 20]


def _content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z][a-z0-9-]{3,}", text.lower()) if w not in _STOP}


def _proper_terms(text: str) -> set[str]:
    return {w for w in re.findall(r"\b[A-Z][\w-]*[A-Za-z0-9]\b", text) if w not in _COMMON_CAPS}


def _matching_sentence(decision: str, pool: list[str]) -> str:
    """The pool sentence that best shares the decision's distinctive terms (a rationale by association)."""
    terms = _proper_terms(decision)
    words = _content_words(decision)
    best, best_score = "", 0.0
    for s in pool:
        if _HEDGE.search(s) or s.endswith((":", "?")):
            continue
        score = 2.0 * len(terms & _proper_terms(s)) + 0.5 * len(words & _content_words(s))
        if re.search(r"\b(?:because|benefit|advantage|better|simpler|cheaper|faster|widespread|mature|reduc\w*|"
                     r"avoid\w*|allow\w*|enabl\w*|ensur\w*)\b", s, re.I):
            score += 1.0
        if score > best_score:
            best, best_score = s, score
    return best if best_score >= 3.0 else ""


def _bullet_items(par: str) -> list[str]:
    items: list[str] = []
    for l in par.split("\n"):
        if _LIST_ITEM.match(l) and (len(l) - len(l.lstrip())) <= 1:
            items.append(_LIST_ITEM.sub("", l))
        elif items:
            items[-1] += " " + l.strip()
    return [clean_inline(i) for i in items]


def _is_decision_bullet(text: str) -> bool:
    words = re.findall(r"[A-Za-z]{2,}", text)
    if len(words) < 4 or len(text.split()) < 3 or text.endswith((":", ",", ";")):
        return False
    letters = sum(c.isalpha() for c in text)
    return letters >= 0.6 * len(text.replace(" ", ""))


def _decision_section_candidates(sec: Section) -> list[_Cand]:
    out: list[_Cand] = []
    pars = sec.paragraphs()
    # MADR: Chosen option: "X", because Y
    for par in pars:
        text = _prose(par)
        m = _CHOSEN.search(text)
        if m:
            out.append(_Cand(f"Chosen option: {m.group(1).strip()}", shorten(m.group(2).strip(), 300), True))
        elif text.lower().startswith("chosen option"):
            m2 = _CHOSEN_NOBECAUSE.search(split_sentences(text)[0])
            if m2:
                out.append(_Cand(f"Chosen option: {m2.group(1).strip()}", "", True))
    if out:
        return out
    prev_intro = ""            # the paragraph before a list, e.g. "We have decided to:" / "Where:"
    seen_prose = False
    list_ok = False            # inside a list that was accepted as a list of decisions
    for par in pars:
        if not par.strip():
            continue
        if _LIST_ITEM.match(par.split("\n")[0]):
            if not list_ok:
                list_ok = not out or bool(re.search(r"\b(?:to|will|shall|following(?:\s+\w+)?|decided|agreed|"
                                                    r"made|are|is)\s*:$", prev_intro, re.I))
                # "We discussed three options:" introduces the options weighed, not what was decided
                if _NOT_A_DECISION.match(prev_intro) or re.search(r"\b(?:options|alternatives|approaches|"
                                                                   r"choices)\b[^.]*:$", prev_intro, re.I):
                    list_ok = False
            if list_ok:
                for text in _bullet_items(par):
                    if _is_decision_bullet(text):
                        d, r = _split_because(split_sentences(text)[0] if len(text) > 300 else text)
                        out.append(_Cand(shorten(d, 300), r, primary=not out))
            continue
        list_ok = False
        prose = _prose(par)
        prev_intro = prose
        if len(prose) < 8:
            continue
        sents = split_sentences(prose)
        first_prose = not seen_prose
        seen_prose = True
        for idx, s in enumerate(sents):
            # only the section's very first sentence is taken as its decision unconditionally
            opening = not out and idx == 0 and first_prose
            if not (opening or _WE_WILL.match(s) or _WE_DECIDED.search(s)
                    or (len(out) < 3 and _main_clause_modal(s))):
                continue
            if _NOT_A_DECISION.match(s):
                continue
            if s.endswith(":"):
                if not opening:
                    continue
                s = s.rstrip(":") + "."        # "The data portion of ADR 0010 will now be:" is the decision
            d, r = _split_because(s)
            if not r and idx + 1 < len(sents):
                nxt = sents[idx + 1]
                if not nxt.endswith(":") and _is_reason(nxt):
                    r = nxt
            out.append(_Cand(shorten(d, 300), shorten(r, 300) if r else "", primary=opening))
        if len(out) >= MAX_DECISIONS:
            break
    return out


def _harvest(doc: ParsedDoc, skip: set[int]) -> list[_Cand]:
    """'We will ...' outside context-like sections; 'we decided / chose / have chosen ...' anywhere."""
    out: list[_Cand] = []
    blocks: list[tuple[str, list[str]]] = [("", doc.preamble)] + [(s.key, s.lines) for s in doc.sections]
    for idx, (key, lines) in enumerate(blocks):
        if idx - 1 in skip or key.startswith("tool"):       # transcript tool calls / outputs are not prose
            continue
        no_will = any(key == n or key.startswith(n + " ") for n in _NO_HARVEST)
        consequence = any(key == n or key.startswith(n + " ") for n in _CONSEQUENCE_SECTIONS)
        for par in paragraphs(lines):
            prose = _prose(par)
            if not _WE.search(prose):      # both patterns below need "we": most paragraphs are not split at all
                continue
            sents = split_sentences(prose)
            for i, s in enumerate(sents):
                if len(s) < 20 or len(s) > 600 or "?" in s:
                    continue
                wd = _WE_DECIDED.search(s)
                ww = _WE_WILL.match(s)
                if wd and not re.search(r"\bwhether\b|\bif we\b", s[: wd.start()], re.I):
                    if re.search(r"\bwe\s+(?:have\s+)?chose?n?\s+to\s+(?:test|try|experiment|evaluate)\b", s, re.I):
                        continue
                elif not (ww and not no_will and not _HEDGE.search(s)):
                    continue
                if _NOT_A_DECISION.match(s) or (consequence and _DOWNSIDE.search(s)):
                    continue
                d, r = _split_because(s)
                if _PRONOUN_ONLY.match(d.strip()):
                    continue
                if not r and i + 1 < len(sents) and _is_reason(sents[i + 1]):
                    r = sents[i + 1]
                out.append(_Cand(shorten(d, 300), shorten(r, 300) if r else ""))
    return out


def _with_subsections(doc: ParsedDoc, i: int) -> tuple[Section, list[int]]:
    """Section i with the text of its subsections ("## Decision" whose content sits under "### Components")."""
    sec = doc.sections[i]
    lines, idx = list(sec.lines), [i]
    for j in range(i + 1, len(doc.sections)):
        if doc.sections[j].level <= sec.level:
            break
        lines += [""] + doc.sections[j].lines
        idx.append(j)
    return Section(sec.title, sec.level, lines), idx


def extract_decisions(doc: ParsedDoc) -> list[dict]:
    cands: list[_Cand] = []
    dec_idx: set[int] = set()
    for name in _DECISION_SECTIONS:
        for i, s in enumerate(doc.sections):
            k = s.key
            if (k == name or k.startswith(name + " ")) and i not in dec_idx:
                dec_idx.add(i)
                found = _decision_section_candidates(s)
                if not found and s.level < 6:
                    merged, idx = _with_subsections(doc, i)
                    found = _decision_section_candidates(merged)
                    dec_idx.update(idx)
                cands += found
    # A Decision section that only says "Implemented and merged." is a status, not a decision.
    cands = [c for c in cands if not _STATUS_ONLY.match(c.decision)]
    # One that opens with "This was driven by ..." gives the rationale; the decision is the design / context
    # statement it refers to.
    if cands and cands[0].primary and _RATIONALE_LEAD.match(cands[0].decision):
        why = cands[0].decision + (" " + cands[0].rationale if cands[0].rationale else "")
        stmt = ""
        for names in (_DESIGN_SECTIONS, _CONTEXT_SECTIONS):
            for name in names:
                sents = [x for x in _sentences_of(doc.find(name), first_paragraph_only=True) if not x.endswith(":")]
                if sents:
                    stmt = sents[0]
                    break
            if stmt:
                break
        cands = ([_Cand(shorten(stmt, 300), shorten(why, 300), True)] if stmt else []) + cands[1:]
    harvested = _harvest(doc, dec_idx)
    if not dec_idx:
        # No decision section: a PEP's / RFC's "This PEP proposes ..." is its main decision.
        for name in _LEAD_SECTIONS_FIRST + ("introduction", "overview"):
            hit = next((s for s in _sentences_of(doc.find(name)) if _THIS_PROPOSES.match(s)), None)
            if hit:
                d, r = _split_because(hit)
                cands.append(_Cand(shorten(d, 300), r, primary=True))
                break
    cands += harvested
    if not cands:
        # ... else a design doc's opening statement is what it decides (under a subheading if it has none).
        for name in _DESIGN_SECTIONS:
            sec = doc.find(name)
            if sec is not None and not _sentences_of(sec) and sec.level < 6:
                sec = _with_subsections(doc, doc.sections.index(sec))[0]
            sents = _sentences_of(sec, first_paragraph_only=True)
            if sents and not sents[0].endswith(":"):
                d, r = _split_because(sents[0])
                cands.append(_Cand(shorten(d, 300), r, primary=True))
                break
    if not cands:
        return []            # nothing decided: no reasons to look for

    def first_with(names: tuple[str, ...], **kw) -> list[str]:
        for name in names:
            for sec in doc.sections:
                if sec.key == name or sec.key.startswith(name + " "):
                    got = [x for x in _sentences_of(sec, **kw) if not x.endswith(":")]
                    if got:
                        return got
        return []

    # A Rationale section gives reasons by definition (but not its restatements of the proposal); elsewhere only
    # sentences that give a reason count: the Decision section's own, then a benefit among the consequences,
    # then the context's.
    rationale_sents = [x for x in first_with(_RATIONALE_SECTIONS)
                       if not (_THIS_PROPOSES.match(x) or _WE_WILL.match(x))]
    decision_reasons = [x for i in sorted(dec_idx) for x in _sentences_of(doc.sections[i])
                        if _is_reason(x) and _STRONG_REASON.search(x)]
    consequence_reasons = [x for x in first_with(_CONSEQUENCE_SECTIONS, lists=True) if _is_reason(x)]
    context_sents: list[str] = []
    for name in _CONTEXT_SECTIONS:
        sec = doc.find(name, prefix=False)
        if sec:
            context_sents += [x for x in _sentences_of(sec)[1:]
                              if _is_reason(x, downside_ok=True) or (_PROBLEM_CUE.search(x) and not (
                                  _THIS_PROPOSES.match(x) or _WE_WILL.match(x) or x.endswith(":")))]

    out: list[dict] = []
    seen: set[str] = set()
    for c in cands:
        d = c.decision.strip()
        key = re.sub(r"\W+", " ", d.lower()).strip()
        if len(key) < 6 or key in seen or re.search(r"[\s,](?:and|or|but)\W*$", d):
            continue                       # a fragment ("To emphasise the difference, and.") decides nothing
        seen.add(key)
        rationale = c.rationale.strip()
        pool_r = [x for x in rationale_sents if x != d]
        pool_d = [x for x in decision_reasons if x != d and d.rstrip(".") not in x]
        pool_q = [x for x in consequence_reasons if x != d]
        pool_c = [x for x in context_sents if x != d and d.rstrip(".") not in x]
        if not rationale and (c.primary or not out):
            # the main decision: a Rationale section, else a reason in the Decision section, a benefit among
            # the consequences, a reason in the context (never just the context's first sentence)
            rationale = (_matching_sentence(d, pool_r) or (pool_r[:1] or [""])[0]
                         or _matching_sentence(d, pool_d) or (pool_d[:1] or [""])[0]
                         or _matching_sentence(d, pool_q) or _matching_sentence(d, pool_c)
                         or (pool_q[:1] or [""])[0] or (pool_c[:1] or [""])[0])
        elif not rationale:
            rationale = _matching_sentence(d, pool_r + pool_d + pool_q + pool_c)
        if rationale and re.sub(r"\W+", " ", rationale.lower()).strip() == key:
            rationale = ""
        out.append({"decision": d, "rationale": shorten(rationale, 300) if rationale else ""})
        if len(out) >= MAX_DECISIONS:
            break
    return out


# ================================================================================================ artifacts

_EXTS = ("py pyi js mjs cjs ts tsx jsx go rs java kt kts rb php c h cc cpp hpp cs swift scala clj cljs cljc edn sql "
         "sh bash zsh ps1 bat yaml yml json jsonl toml ini cfg conf md mdx rst txt tf tfvars hcl proto graphql gql "
         "html htm css scss sass less xml lock env mk gradle ipynb csv tsv pkl j2 jinja tpl erb ex exs lua vue "
         "svelte dart r jl pl pm nix cue rego dockerfile properties plist sbt cmake make mod sum tmpl pkl "
         "vim el hs ml mli fs fsx erl hrl zig nim asm s wasm "
         "png jpg jpeg gif svg webp pdf tgz gz zip tar whl jar war sig sigstore pem crt log sqlite parquet").split()
_EXT_RE = "|".join(sorted(set(_EXTS), key=len, reverse=True))
_SPECIAL_FILES = ("Dockerfile", "Makefile", "Jenkinsfile", "Procfile", "Gemfile", "Rakefile", "Vagrantfile",
                  "Brewfile", "Justfile", "Containerfile", "CODEOWNERS")
_PATH_RE = re.compile(
    r"(?<![\w@/.:-])("
    r"(?:\.{1,2}/|~/|/)?(?:[\w.-]+/)+[\w.-]*[\w]"               # a/b/c or ./a/b.py
    rf"|[\w.-]*[\w-]\.(?:{_EXT_RE})"                           # name.ext
    rf"|{'|'.join(_SPECIAL_FILES)}"
    r")(?![\w/-]|\.\w)"
)
_SPECIAL_RE = re.compile("|".join(_SPECIAL_FILES))
_URL_RE = re.compile(r"\b(?:https?|ftp|s3|gs|file)://\S+|\bwww\.\S+|[\w.+-]+@[\w-]+\.[\w.-]+")
_URL_NO_EMAIL_RE = re.compile(r"\b(?:https?|ftp|s3|gs|file)://\S+|\bwww\.\S+")
_NOT_PATHS = {"and/or", "i/o", "n/a", "tcp/ip", "read/write", "on/off", "client/server", "input/output",
              "yes/no", "true/false", "either/or", "e.g", "i.e", "a/b", "w/o", "ui/ux", "ci/cd", "pass/fail"}


_REPO_FOLDERS = {"docs", "doc", "src", "lib", "app", "apps", "test", "tests", "spec", "scripts", "script", "bin",
                 "config", "configs", "conf", "etc", "pkg", "cmd", "internal", "deploy", "deployment", "infra",
                 "terraform", "charts", "helm", "modules", "packages", "services", "tools", "examples", "migrations",
                 "db", "api", "web", "frontend", "backend", "server", "client", "assets", "static", "templates",
                 "adr", "adrs", "architecture", "projects", "k8s", "kubernetes", "manifests", "playbooks", "roles",
                 "hieradata", "vendor", ".github", ".ci", "bench", "benchmarks", "fixtures", "data", "include"}
_DOMAIN_PATH = re.compile(r"^(?:[\w-]+\.)+(?:com|org|net|io|dev|gov|uk|edu|co|app|cloud|ai|sh|me|info|biz|eu|us|de)/",
                          re.I)
_MIME = re.compile(r"^(?:text|application|image|audio|video|multipart|font|message|model)/[\w.+-]+$", re.I)


def _looks_like_path(tok: str, backticked: bool) -> bool:
    low = tok.lower()
    if low in _NOT_PATHS or len(tok) < 4 or len(tok) > 200:
        return False
    if re.fullmatch(r"[\d./-]+", tok):                 # versions, dates, fractions
        return False
    if re.fullmatch(r"v?\d+(\.\d+)+\w*", tok):
        return False
    if "/" in tok:
        parts = [p for p in tok.split("/") if p not in ("", ".", "..", "~")]
        if not parts:
            return False
        if _DOMAIN_PATH.match(tok) or _MIME.match(tok):
            return False                   # "github.com/org/repo" (a URL), "text/markdown" (a media type)
        # A path is shaped like a file (an extension, a well-known file name); slash-separated words ("add/delete/lock", "input/stream/reader", "NATS/1.0") are not paths.
        if re.search(rf"\.(?:{_EXT_RE})$", tok, re.I) or parts[-1] in _SPECIAL_FILES:
            return True
        # a folder of the usual repository layout ("docs/architecture/decisions", "src/app/"), not prose words
        return (len(parts) >= 2 and parts[0].lower() in _REPO_FOLDERS
                and all(re.fullmatch(r"[\w.-]+", p) for p in parts) and not tok.startswith("/"))
    if tok in _SPECIAL_FILES:
        return True
    m = re.search(rf"\.({_EXT_RE})$", tok, re.I)
    if not m:
        return False
    stem = tok[: m.start()]
    if not stem or stem in (".", "..") or re.fullmatch(r"\d+", stem):
        return False
    ext = m.group(1).lower()
    # words like "config.md" are fine; "Node.js", "Vue.js" are product names; so are "e.g", "github.io"
    if ext in ("js", "ts") and stem[:1].isupper() and not backticked:
        return False
    if ext in ("sh", "r", "s", "c", "h", "pl", "ex", "fs", "ml", "el", "mod", "sum", "make", "env", "lock") \
            and not backticked and "_" not in stem and "-" not in stem and "/" not in tok:
        return False                       # "etc.sh"-style false positives are rarer than prose words
    return True


def _path_matches(text: str) -> list[str]:
    """_PATH_RE's matches in `text`, in order. A match lies inside one whitespace-free token holding a "/", a "." or
    a special file's name, and the space between joined tokens reads to the pattern's look-arounds as the text's
    own whitespace did: one pass over those tokens finds what a pass over the whole text finds, on ~1/4 of it."""
    special = _SPECIAL_RE.search(text) is not None
    return [m.group(1) for m in _PATH_RE.finditer(
        " ".join(t for t in text.split() if "/" in t or "." in t or (special and _SPECIAL_RE.search(t))))]


def extract_artifacts(text: str, meta: dict) -> list[str]:
    found: list[str] = []
    for key in ("files_edited", "files_touched", "files", "paths", "artifacts"):
        v = meta.get(key)
        if isinstance(v, (list, tuple)):
            found += [str(x) for x in v if x]
    backticked = {m.group(1).strip() for m in re.finditer(r"`([^`\n]{3,200})`", text)}
    # without an "@" the e-mail alternative (the costly one: it backtracks over every word) cannot match
    if "@" in text:
        scan = _URL_RE.sub(" ", text)
    elif "/" in text or "www." in text:
        scan = _URL_NO_EMAIL_RE.sub(" ", text)
    else:
        scan = text
    for tok in _path_matches(scan):
        tok = tok.rstrip(".,:;)")
        if _looks_like_path(tok, tok in backticked):
            found.append(tok)
    out: list[str] = []
    seen: set[str] = set()
    for p in found:
        p = p.strip().strip("`'\"")
        if p.startswith("./"):
            p = p[2:]
        if p and p not in seen:
            seen.add(p)
            out.append(p)
        if len(out) >= MAX_ARTIFACTS:
            break
    return out


# ================================================================================================ components

_COMMON_CAPS = set("""
A An The This That These Those It Its We Our Us You Your They Their Them He She I In On At By For From With Without
Of To As If When While Where Which Who What Why How Because Since So But And Or Nor Not No Yes Each Every Any All
Some Many Most More Less Other Another Such Both Either Neither There Here Then Than Also However Therefore Thus
Instead Currently Today Now New Old First Second Third Next Last Finally Note Notes Example Examples See Use Using
Used Please Given Once Only Just Even Still Already Although Though Unless Until After Before During Into Onto Over
Under Between Within Across About Above Below Should Would Could Can Will May Might Must Shall Do Does Did Done Be
Is Are Was Were Been Being Has Have Had Having Let Lets Make Makes Get Gets Set Sets One Two Three Four Five Six Ten
Context Decision Decisions Status Consequences Rationale Summary Abstract Motivation Background Overview Options
Option Proposal Proposed Accepted Rejected Superseded Deprecated Draft Final Positive Negative Pros Cons Good Bad
Neutral Problem Statement Solution Design Implementation Specification Introduction Conclusion References Appendix
Date Author Authors Tags Title Type Topic Created Copyright Section Sections Chapter Table Figure Step Steps
Risks Risk Mitigation Follow Ups Yes No OK TODO FIXME XXX NOTE WARNING IMPORTANT Option Chosen Considered
January February March April May June July August September October November December Monday Tuesday
Wednesday Thursday Friday Saturday Sunday Mr Mrs Ms Dr Inc Ltd PEP ADR RFC API APIs URL URLs URI ID IDs UI UX
Unless Whenever Otherwise Additionally Furthermore Moreover Similarly Likewise Meanwhile Perhaps Generally Typically
Usually Ideally Alternatively Overall Together Specifically Essentially Obviously Clearly Importantly Previously
None True False Later Initially Eventually Originally Recently Today Tomorrow Yesterday Because Whether Within Where Whereas
""".split())
_COMMON_ACRONYMS = {"API", "APIs", "URL", "URLs", "URI", "ID", "IDs", "UI", "UX", "OK", "TODO", "FIXME", "XXX",
                    "NOTE", "PEP", "ADR", "RFC", "CLI", "CPU", "RAM", "GB", "MB", "KB", "TB", "PR", "PRs", "FAQ",
                    "ETA", "MVP", "TBD", "N/A", "AND", "OR", "NOT", "IS", "THE", "II", "III", "IV", "USA", "UK",
                    "EU", "US", "A", "I", "AM", "PM", "UTC", "JSON", "YAML", "XML", "HTML", "CSS", "HTTP", "HTTPS",
                    "SQL", "MUST", "SHOULD", "MAY", "SHALL", "REQUIRED", "RECOMMENDED", "OPTIONAL", "NOT"}
_IDENT = re.compile(r"^[A-Za-z_][\w.:-]{1,48}[\w]$|^[A-Za-z_]\w?$")
_CAMEL = re.compile(r"\b([A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+|[a-z]+(?:[A-Z][a-z0-9]+)+|[A-Z]{2,}[a-z]+[A-Za-z]*)\b")
# _CAPWORD and _MULTI_CAP start with their first capital (factored out of the alternatives, the lookbehind moved
# after it: same matches), so the regex engine scans for capitals instead of trying every position. The originals:
#   (?<![\w.`/-])([A-Z][a-z][\w-]*[a-z0-9]|[A-Z]{2,6}s?)(?![\w/`-])
#   (?<![\w.`/-])((?:[A-Z][\w-]*[a-z0-9][\w-]*|[A-Z]{2,6})(?:\s+(?:...same...)){1,3})(?![\w/`-])
_CAPWORD = re.compile(r"([A-Z](?<![\w.`/-].)(?:[a-z][\w-]*[a-z0-9]|[A-Z]{1,5}s?))(?![\w/`-])")


_TYPE_NAMES = {"string", "int", "integer", "bool", "boolean", "float", "double", "bytes", "byte", "char", "void",
               "null", "nil", "none", "true", "false", "any", "object", "array", "list", "dict", "map", "error",
               "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float32", "float64",
               "number", "undefined", "self", "this", "str"}
_MULTI_CAP = re.compile(r"([A-Z](?<![\w.`/-].)(?:[\w-]*[a-z0-9][\w-]*|[A-Z]{1,5})(?:\s+(?:[A-Z][\w-]*[a-z0-9][\w-]*|[A-Z]{2,6})){1,3})(?![\w/`-])")


_TICKED = re.compile(r"`(?<!``)([^`\n]{2,50})`(?!`)")       # = (?<!`)`...: literal first, scanned for


def _camel_names(text: str) -> list[str]:
    """_CAMEL's matches in `text`, in order. Each is one whole \\w+ run holding a capital: only the whitespace-free
    tokens not all in lower case can hold one, and joined by spaces they give the same matches."""
    return [m.group(1) for m in _CAMEL.finditer(" ".join(t for t in text.split() if not t.islower()))]


def extract_components(doc: ParsedDoc, text: str, artifacts: list[str]) -> list[str]:
    art = set(artifacts)
    scores: Counter[str] = Counter()
    first_seen: dict[str, int] = {}

    def bump(name: str, w: float) -> None:
        first_seen.setdefault(name, len(first_seen))
        scores[name] += w

    # backticked identifiers that look like names of things (not plain words, types or numbers)
    ticked: Counter[str] = Counter()
    for m in _TICKED.finditer(text) if "`" in text else ():
        tok = m.group(1).strip()
        if tok in art or " " in tok or "/" in tok or not _IDENT.match(tok) or tok.lower() in _TYPE_NAMES:
            continue
        if re.fullmatch(r"[\d.]+\w*", tok):
            continue
        if not (re.search(r"[_.:-]", tok) or re.search(r"[a-z][A-Z]|^[A-Z][a-z]+[A-Z]", tok)):
            continue                 # plain lowercase / Titlecase words in backticks are usually field values
        ticked[tok] += 1
    for tok, n in ticked.items():
        bump(tok, 2.0 + n)

    # sentences per line (list items and wrapped headings must not look like mid-sentence capitals)
    raw = [_LIST_ITEM.sub("", l) for l in doc.prose_lines[:6000] if not _TABLE_ROW.match(l)]
    prose_lines = clean_inline(" \x00 ".join(raw)).split("\x00")
    sentences: list[str] = []
    for line in prose_lines:
        sentences += split_sentences(line)
    prose = " \n ".join(sentences)
    lower_counts = Counter(re.findall(r"\b[a-z][\w-]*\b", prose))

    for name in _camel_names(prose):
        if name in _COMMON_CAPS or name in art:
            continue
        bump(name, 1.5)

    multi: Counter[str] = Counter()
    caps: Counter[str] = Counter()
    non_initial: Counter[str] = Counter()
    for sent in sentences:
        for m in _MULTI_CAP.finditer(sent):
            words = m.group(1).split()
            while words and words[0] in _COMMON_CAPS:
                words = words[1:]
            while words and words[-1] in _COMMON_CAPS:
                words = words[:-1]
            if len(words) >= 2:
                multi[" ".join(words)] += 1
        for m in _CAPWORD.finditer(sent):
            w = m.group(1)
            caps[w] += 1
            if m.start() > 0:
                non_initial[w] += 1
    in_multi: Counter[str] = Counter()
    for name, n in multi.items():
        if n >= 2:
            bump(name, 1.0 * n)
            for w in name.split():
                in_multi[w] += n
    for w, n in caps.items():
        if w in _COMMON_CAPS or w in _COMMON_ACRONYMS or w.upper() in _COMMON_ACRONYMS:
            continue
        if lower_counts.get(w.lower(), 0) >= n and not _CAMEL.fullmatch(w):
            continue                 # "Data", "Users": ordinary words that start sentences or bullets
        standalone = n - in_multi.get(w, 0)
        if n >= 2 and non_initial[w] >= 1 and standalone >= 1:
            bump(w, float(n))
    ranked = sorted(scores, key=lambda k: (-scores[k], first_seen[k]))
    ranked = [k for k in ranked if scores[k] >= 2.0]
    return ranked[:MAX_COMPONENTS]


# ================================================================================================ work types

_KIND_WORK = {"adr": ["decision"], "session": ["session"], "transcript": ["session"], "work_item": ["work-item"],
              "readme": ["documentation"], "doc": [], "agents_md": ["agent-instructions"], "memory": ["memory"]}
_WORK_KEYWORDS: list[tuple[str, str]] = [
    ("migration", r"migrat\w*|upgrad\w*"),
    ("bugfix", r"bugs?|bugfix\w*|fix(?:es|ed)?|regressions?|crash\w*|hotfix\w*"),
    ("refactor", r"refactor\w*|restructur\w*|clean-?up|renam\w*|simplif\w*"),
    ("infrastructure", r"infrastructure|terraform|kubernetes|k8s|aws|ec2|eks|helm|deploy\w*|clusters?|dns|"
                       r"load balancer\w*|vpc|docker|puppet\w*|ansible|cloud"),
    ("security", r"secur\w*|secrets?|encrypt\w*|auth\w*|iam|permissions?|vulnerab\w*|tls|ssl|credentials?"),
    ("performance", r"performance|latency|throughput|caching|cache|scal(?:e|ing|ability)|optimi[sz]\w*"),
    ("api", r"apis?|endpoints?|rest|grpc|http|webhooks?|protocol"),
    ("database", r"databases?|postgres\w*|sql|mysql|mongo\w*|schemas?|rds|redis"),
    # ("test suite" was a fourth alternative: "tests?" always matched its first word first, so it never counted)
    ("testing", r"tests?|testing|ci"),
    ("configuration", r"config\w*|settings"),
    ("observability", r"logs?|logging|metrics?|monitor\w*|alert\w*|tracing|observab\w*"),
    ("ci-cd", r"pipelines?|continuous integration|ci/cd|github actions|concourse|circleci|jenkins"),
    ("documentation", r"documentation|docs|readme|guides?"),
]


def _alternatives(pattern: str) -> list[str]:
    """A keyword pattern's top-level alternatives, in order."""
    depth, start = 0, 0
    alts = []
    for i, c in enumerate(pattern):
        depth += c == "("
        depth -= c == ")"
        if c == "|" and depth == 0:
            alts.append(pattern[start:i])
            start = i + 1
    alts.append(pattern[start:])
    return alts


def _literal_heads(pattern: str) -> tuple[str, ...]:
    """The literal text each top-level alternative of a keyword pattern starts with ("bugs?" -> "bug",
    "fix(?:es|ed)?" -> "fix"): a text holding none of them cannot match the pattern."""
    heads = []
    for alt in _alternatives(pattern):
        head = ""
        for i, c in enumerate(alt):
            if not (c.isalnum() or c in " -/") or alt[i + 1:i + 2] in ("?", "*", "+", "{"):
                break
            head += c
        if not head:
            raise ValueError(f"keyword alternative without a literal head: {alt!r}")
        heads.append(head)
    return tuple(heads)


_WORK_RES = [(label, re.compile(rf"\b(?:{pattern})\b")) for label, pattern in _WORK_KEYWORDS]
# An alternative that matches word characters only matches, between the pattern's two \b, exactly one whole \w+
# word: those are counted from the text's words once (a word's labels are remembered) instead of one regex pass
# per label. The other alternatives ("load balancer\w*", "ci/cd", "clean-?up") are a phrase pass of their own,
# run only when the text holds one of their literal heads. The two counts add up to the whole pattern's: no word
# of a phrase is matched by its label's word alternatives (test_signposts_extractive checks it on the corpora).
_WORD_ONLY = re.compile(r"(?:[a-z0-9]|\\w|\(\?:|[|)?*]|\[[a-z]+\])+")
_WORD_LABELS = [(label, re.compile("(?:" + "|".join(alts) + ")")) for label, alts in (
    (label, [a for a in _alternatives(pattern) if _WORD_ONLY.fullmatch(a)]) for label, pattern in _WORK_KEYWORDS)
    if alts]
_PHRASE_RES = {label: (re.compile(rf"\b(?:{'|'.join(alts)})\b"), _literal_heads("|".join(alts)))
               for label, alts in ((label, [a for a in _alternatives(pattern) if not _WORD_ONLY.fullmatch(a)])
                                   for label, pattern in _WORK_KEYWORDS) if alts}
_WORD = re.compile(r"\w+")
_labels_of_word: dict[str, tuple[str, ...]] = {}


def _word_label_hits(low: str) -> Counter[str]:
    hits: Counter[str] = Counter()
    for word, n in Counter(_WORD.findall(low)).items():
        labels = _labels_of_word.get(word)
        if labels is None:
            labels = tuple(label for label, rx in _WORD_LABELS if rx.fullmatch(word))
            if len(_labels_of_word) < 200_000:
                _labels_of_word[word] = labels
        for label in labels:
            hits[label] += n
    return hits


def extract_work_types(kind: str, title: str, text: str) -> list[str]:
    out = list(_KIND_WORK.get(kind, []))
    low_title = title.lower()
    low = text[:300_000].lower()
    scored: list[tuple[float, str]] = []
    word_hits = _word_label_hits(low)
    for label, rx in _WORK_RES:
        t_hits = len(rx.findall(low_title))
        b_hits = word_hits.get(label, 0)
        phrases = _PHRASE_RES.get(label)
        # a substring test per head is much cheaper than a regex pass over a text that cannot match
        if phrases is not None and any(h in low for h in phrases[1]):
            b_hits += len(phrases[0].findall(low))
        per_k = b_hits * 1000.0 / max(len(low), 1)
        if t_hits or (b_hits >= 3 and per_k >= 1.5) or b_hits >= 12:
            scored.append((t_hits * 10 + per_k, label))
    for _, label in sorted(scored, key=lambda x: -x[0]):
        if label not in out:
            out.append(label)
    return out[:MAX_WORK_TYPES]


# ================================================================================================ documents

def _session_summary(doc: SignpostInput, parsed: ParsedDoc, artifacts: list[str]) -> str:
    """Transcripts / sessions: what it was about (the tool's own summary or the first prompt), files edited."""
    meta = doc.meta or {}
    about = clean_inline(str(meta.get("summary") or ""))
    if not about:
        for sec in parsed.sections:
            if sec.key.startswith(("user", "human", "prompt")):
                about = _first_meaningful(sec.paragraphs()) or " ".join(_prose(p) for p in sec.paragraphs()[:1])
                if about:
                    break
    if not about:
        about = extract_lead(parsed) or clean_inline(doc.title)
    date = str(meta.get("date") or "")[:10]
    head = f"Session {date}: " if date else "Session: "
    about = shorten(about, 200)
    text = head + about + ("" if about.endswith((".", "!", "?", "…")) else ".")
    edited = [str(x) for x in (meta.get("files_edited") or [])][:4]
    if edited:
        text += f" Edited {', '.join(edited)}" + (" and others." if len(meta.get("files_edited") or []) > 4 else ".")
    elif artifacts:
        text += f" Touches {', '.join(artifacts[:3])}."
    return shorten(text, SUMMARY_CHARS)


def _is_markdown(doc: SignpostInput) -> bool:
    """Whether the chunker reads the document as markdown (chunking.detect_shape: a markdown extension, a
    work item, a session or README-like text that looks like markdown): one shape decision for both, so the
    signposter reads the documents stage's stored scan wherever the chunker does."""
    return _shape(doc) in ("markdown", "work_item", "session")


def _shape(doc: SignpostInput) -> str:
    from kb_assets.chunking import detect_shape
    from kb_assets.models import SourceDocument

    return detect_shape(SourceDocument(path=doc.path, kind=doc.kind, title=doc.title, text=doc.text, meta={}))


def extract_document(doc: SignpostInput) -> dict:
    meta = doc.meta or {}
    shape = _shape(doc)
    parsed = parse_document(doc.text, fallback_title=doc.title or PurePosixPath(doc.path).stem,
                            markdown=shape in ("markdown", "work_item", "session"), rst=shape == "rst",
                            blocks=doc.blocks)
    title = doc.title or parsed.title or PurePosixPath(doc.path).stem
    artifacts = extract_artifacts(doc.text, meta)
    if doc.kind in ("transcript", "session") and (meta.get("session_id") or meta.get("turns")
                                                    or any(s.key.startswith("user") for s in parsed.sections[:3])):
        summary = _session_summary(doc, parsed, artifacts)
    else:
        summary = make_summary(title, extract_lead(parsed))
    return {
        "summary": summary,
        "work_types": extract_work_types(doc.kind, title, doc.text),
        "key_decisions": extract_decisions(parsed),
        "artifacts": artifacts,
        "components": extract_components(parsed, doc.text, artifacts),
        "tags": extract_tags(parsed, meta),
        "status": extract_status(parsed, meta),
    }


# ================================================================================================ code

_LANG_BY_EXT = {
    "py": "python", "pyi": "python", "js": "js", "mjs": "js", "cjs": "js", "jsx": "js", "ts": "js", "tsx": "js",
    "go": "go", "rs": "rust", "java": "java", "kt": "kotlin", "kts": "kotlin", "scala": "java", "cs": "csharp",
    "rb": "ruby", "php": "php", "sh": "shell", "bash": "shell", "zsh": "shell", "sql": "sql", "clj": "clojure",
    "cljs": "clojure", "cljc": "clojure", "c": "c", "h": "c", "cc": "c", "cpp": "c", "hpp": "c", "swift": "swift",
    "ex": "elixir", "exs": "elixir", "lua": "lua",
}
_LICENSE = re.compile(r"copyright|licen[cs]e|spdx|all rights reserved|^-\*-|^!|^#!|generated by|do not edit|"
                      r"eslint|pylint|noqa|type:\s*ignore|coding[:=]|^\s*$", re.I)


def _first_doc_line(doc: str | None) -> str:
    if not doc:
        return ""
    for par in re.split(r"\n\s*\n", doc.strip()):
        s = clean_inline(" ".join(l.strip() for l in par.splitlines()))
        if s:
            return shorten(split_sentences(s)[0] if split_sentences(s) else s, 200)
    return ""


def _leading_comment(text: str) -> str:
    lines = text.splitlines()[:80]
    block: list[str] = []
    in_block = False
    for line in lines:
        s = line.strip()
        if in_block:
            end = "*/" in s
            s = s.split("*/")[0].lstrip("*").strip()
            if s:
                block.append(s)
            if end:
                in_block = False
                if block and not all(_LICENSE.search(b) for b in block):
                    break
                block = []
            continue
        if s.startswith("/*"):
            in_block = True
            inner = s[2:].split("*/")[0].lstrip("*").strip()
            if inner:
                block.append(inner)
            if "*/" in s:
                in_block = False
            continue
        m = re.match(r"^(?://+!?|#+|--|;+|%)\s?(.*)$", s)
        if m:
            if s.startswith("#!") or (s.startswith("#") and re.match(r"#\s*(include|define|if|pragma|import)", s)):
                if block:
                    break
                continue
            block.append(m.group(1).strip())
            continue
        if not s:
            if block and not all(_LICENSE.search(b) for b in block if b):
                break
            block = []
            continue
        break
    block = [b for b in block if b and not _LICENSE.search(b)]
    return _first_doc_line("\n".join(block)) if block else ""


def _py_code(text: str) -> tuple[str, list[dict], list[str]]:
    try:
        tree = parse_python(text)
    except (SyntaxError, ValueError, RecursionError):
        return "", [], []
    purpose = _first_doc_line(ast.get_docstring(tree))
    funcs: list[dict] = []
    strings: list[str] = []
    methods: list[dict] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            funcs.append({"name": node.name, "does": _first_doc_line(ast.get_docstring(node))})
            if isinstance(node, ast.ClassDef):
                for sub in node.body:
                    if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and not sub.name.startswith("_"):
                        methods.append({"name": f"{node.name}.{sub.name}",
                                        "does": _first_doc_line(ast.get_docstring(sub))})
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) > 6:
            strings.append(node.value)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__tablename__"
                                                  for t in node.targets):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                strings.append(f"CREATE TABLE {node.value.value} (")
    room = 40 - len(funcs)
    return purpose, funcs + methods[: max(room, 0)], strings


_DEF_PATTERNS: dict[str, list[re.Pattern]] = {
    "js": [re.compile(r"^\s*export\s+(?:default\s+)?(?:async\s+)?function\*?\s+([A-Za-z_$][\w$]*)"),
           re.compile(r"^\s*export\s+(?:default\s+)?(?:abstract\s+)?class\s+([A-Za-z_$][\w$]*)"),
           re.compile(r"^\s*export\s+(?:const|let|var)\s+([A-Za-z_$][\w$]*)\s*=\s*(?:async\s+)?(?:\(|function|[\w$]+\s*=>)"),
           re.compile(r"^\s*export\s+(?:interface|type|enum)\s+([A-Za-z_$][\w$]*)"),
           re.compile(r"^(?:async\s+)?function\*?\s+([A-Za-z_$][\w$]*)"),
           re.compile(r"^class\s+([A-Za-z_$][\w$]*)")],
    "go": [re.compile(r"^func\s+(?:\([^)]*\)\s*)?([A-Z]\w*)\s*[\[(]"),
           re.compile(r"^type\s+([A-Z]\w*)\s+(?:struct|interface|func|\w)")],
    "rust": [re.compile(r"^\s*pub(?:\([^)]*\))?\s+(?:async\s+)?(?:unsafe\s+)?(?:fn|struct|enum|trait|type|mod)\s+(\w+)")],
    "java": [re.compile(r"^\s*public\s+(?:[\w<>\[\],?]+\s+)*?(?:class|interface|enum|record)\s+(\w+)"),
             re.compile(r"^\s*public\s+(?:static\s+|final\s+|synchronized\s+|abstract\s+)*[\w<>\[\],.? ]+\s+(\w+)\s*\(")],
    "csharp": [re.compile(r"^\s*public\s+(?:[\w<>\[\],?]+\s+)*?(?:class|interface|enum|record|struct)\s+(\w+)"),
               re.compile(r"^\s*public\s+(?:static\s+|async\s+|virtual\s+|override\s+)*[\w<>\[\],.? ]+\s+(\w+)\s*\(")],
    "kotlin": [re.compile(r"^\s*(?:public\s+|internal\s+)?(?:data\s+|sealed\s+|open\s+|abstract\s+)*"
                          r"(?:class|interface|object)\s+(\w+)"),
               re.compile(r"^\s*(?:public\s+|internal\s+)?(?:suspend\s+|inline\s+)*fun\s+(?:<[^>]+>\s*)?(?:[\w.]+\.)?(\w+)\s*\(")],
    "ruby": [re.compile(r"^\s*(?:class|module)\s+([A-Z][\w:]*)"), re.compile(r"^\s*def\s+(?:self\.)?([a-z_]\w*[?!=]?)")],
    "php": [re.compile(r"^\s*(?:abstract\s+|final\s+)?class\s+(\w+)"),
            re.compile(r"^\s*(?:public\s+)?(?:static\s+)?function\s+([a-zA-Z]\w*)")],
    "shell": [re.compile(r"^\s*(?:function\s+)?([A-Za-z][\w-]*)\s*\(\)\s*\{?"), re.compile(r"^\s*function\s+([A-Za-z][\w-]*)")],
    "sql": [re.compile(r"^\s*create\s+(?:or\s+replace\s+)?(?:function|procedure|view|materialized\s+view|trigger)\s+"
                       r"(?:if\s+not\s+exists\s+)?([\w.\"]+)", re.I)],
    "clojure": [re.compile(r"^\s*\((?:defn|defmacro|defprotocol|defrecord|deftype|defmulti)\s+([^\s\[\]()]+)")],
    "c": [re.compile(r"^(?!static)[A-Za-z_][\w\s\*]*?\b([A-Za-z_]\w*)\s*\([^;]*\)\s*\{?\s*$")],
    "swift": [re.compile(r"^\s*(?:public\s+|open\s+)(?:final\s+)?(?:class|struct|enum|protocol|func)\s+(\w+)")],
    "elixir": [re.compile(r"^\s*defmodule\s+([\w.]+)"), re.compile(r"^\s*def\s+([a-z_]\w*[?!]?)")],
    "lua": [re.compile(r"^\s*function\s+([\w.:]+)\s*\("), re.compile(r"^\s*local\s+function\s+([\w]+)")],
}
_C_KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "else", "do", "case"}


def _regex_code(text: str, lang: str) -> list[dict]:
    pats = _DEF_PATTERNS.get(lang, [])
    if not pats:
        return []
    lines = text.splitlines()
    out: list[dict] = []
    seen: set[str] = set()
    for i, line in enumerate(lines):
        for pat in pats:
            m = pat.match(line)
            if not m:
                continue
            name = m.group(1)
            if name in seen or name in _C_KEYWORDS:
                break
            if lang in ("js", "php", "ruby", "lua", "shell") and name.startswith("_"):
                break
            seen.add(name)
            out.append({"name": name, "does": _doc_near(lines, i, lang)})
            break
        if len(out) >= 40:
            break
    return out


def _doc_near(lines: list[str], i: int, lang: str) -> str:
    """The comment just above a definition (//, #, ///, /** */, --), or a Clojure/Elixir docstring after it."""
    if lang == "clojure":
        for j in range(i, min(i + 3, len(lines))):
            m = re.search(r'"([^"]{6,})', lines[j] if j > i else lines[j].split(None, 2)[-1])
            if m:
                return _first_doc_line(m.group(1))
        return ""
    block: list[str] = []
    j = i - 1
    while j >= 0 and (lines[j].strip().startswith(("@", "#[")) and lang not in ("shell", "ruby")):
        j -= 1                                        # decorators / annotations / attributes
    while j >= 0:
        s = lines[j].strip()
        if s.startswith("*/") or s.endswith("*/"):
            k = j
            while k >= 0 and "/*" not in lines[k]:
                k -= 1
            chunk = lines[max(k, 0): j + 1]
            block = [re.sub(r"^\s*(/\*\*?|\*/?|\*)\s?", "", c).replace("*/", "").strip() for c in chunk]
            block = [b for b in block if b and not b.startswith("@")]
            break
        m = re.match(r"^(?:///?|#|--|;;+)\s?(.*)$", s)
        if m and not s.startswith("#!"):
            block.insert(0, m.group(1))
            j -= 1
            continue
        break
    return _first_doc_line("\n".join(block))


_SQL_TABLE_RES = [
    re.compile(r"(?<!DISTINCT )(?<!distinct )\b(?:FROM|JOIN)\s+(?:ONLY\s+|LATERAL\s+)?"
               r"([A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)?)(?!\w|\s*\()"),
    re.compile(r"\bINSERT\s+INTO\s+([A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)?)"),
    re.compile(r"\bUPDATE\s+([A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)?)\s+SET\b"),
    re.compile(r"\bDELETE\s+FROM\s+([A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)?)"),
    re.compile(r"\b(?:CREATE|ALTER|DROP|TRUNCATE)\s+(?:UNLOGGED\s+|TEMP(?:ORARY)?\s+)?TABLE\s+(?:IF\s+(?:NOT\s+)?EXISTS\s+)?"
               r"([A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)?)"),
    re.compile(r"\bREFERENCES\s+([A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)?)"),
    re.compile(r"\bCOPY\s+([A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)?)\s*(?:\(|FROM|TO)"),
]
_SQL_NOT_TABLES = {"select", "where", "set", "values", "lateral", "only", "unnest", "generate_series", "dual", "the",
                   "a", "an", "this", "that", "each", "all", "any", "json_each", "jsonb_each", "json_array_elements",
                   "jsonb_array_elements", "jsonb_to_recordset", "regexp_split_to_table", "string_to_array",
                   "to", "if", "not", "exists", "excluded", "new", "old", "stdin", "stdout", "pg_catalog",
                   "information_schema", "current_date", "now", "with", "using", "on", "as", "table", "in",
                   "__future__", "typing", "it", "them", "there", "here", "which"}


_SQLISH = re.compile(r"\b(?:select\s[\s\S]+?\sfrom\s|insert\s+into\s|update\s+[\w.]+\s+set\s|delete\s+from\s|"
                     r"(?:create|alter|drop)\s+(?:unlogged\s+|temp\w*\s+)?table\s)", re.I)


_CTE_RE = re.compile(r"(?:\bWITH\s+(?:RECURSIVE\s+)?|,\s*)([A-Za-z_]\w*)\s*(?:\([\w\s,]*\)\s*)?AS\s+"
                     r"(?:NOT\s+)?(?:MATERIALIZED\s+)?\(", re.I)


def extract_tables(texts: Iterable[str], *, case_insensitive: bool = False) -> list[str]:
    out: list[str] = []
    texts = list(texts)
    # Names a WITH clause defines (`WITH sel AS (...)`) are query-local, not tables: never listed.
    ctes = {m.group(1).lower() for text in texts for m in _CTE_RE.finditer(text)}
    for text in texts:
        # strip SQL comments so "-- FROM x" style notes do not count
        body = re.sub(r"--[^\n]*", " ", text)
        for rx in _SQL_TABLE_RES:
            rx2 = re.compile(rx.pattern, re.I) if case_insensitive else rx
            for m in rx2.finditer(body):
                name = m.group(1).strip('"')
                if name.lower() in _SQL_NOT_TABLES or name.isdigit() or len(name) < 2 or name.lower() in ctes:
                    continue
                if name not in out:
                    out.append(name)
    return out[:30]


_ROUTE_RES: list[tuple[re.Pattern, Any]] = [
    # Python: FastAPI / Flask / Starlette / aiohttp decorators
    (re.compile(r"@\s*[\w.]+\.(get|post|put|patch|delete|head|options|websocket|api_route|route)\(\s*[rfb]?['\"]"
                r"([^'\"]*)['\"]([^)\n]*)"), "py"),
    # Express / Koa / Fastify / Hono: app.get('/x', ...)
    (re.compile(r"\b(?:app|router|server|api|route[rs]?|fastify|r)\.(get|post|put|patch|delete|all|head|options)"
                r"\(\s*['\"`](/[^'\"`]*)['\"`]"), "verb"),
    # Spring
    (re.compile(r"@(Get|Post|Put|Patch|Delete|Request)Mapping\(\s*(?:value\s*=\s*|path\s*=\s*)?\{?\s*\"([^\"]*)\""),
     "verb"),
    # JAX-RS @Path("/x")
    (re.compile(r"@Path\(\s*\"([^\"]+)\"\s*\)"), "path"),
    # Go net/http, gorilla, gin, echo, chi
    (re.compile(r"\.(HandleFunc|Handle)\(\s*\"([^\"]+)\""), "go"),
    (re.compile(r"\.(GET|POST|PUT|PATCH|DELETE|Get|Post|Put|Patch|Delete)\(\s*\"(/[^\"]*)\""), "verb"),
    # Django urls
    (re.compile(r"\b(?:re_)?path\(\s*r?['\"]([^'\"]*)['\"]\s*,"), "path"),
    # Rails routes / Sinatra
    (re.compile(r"^\s*(get|post|put|patch|delete)\s+['\"](/[^'\"]*)['\"]", re.M), "verb"),
]


def extract_endpoints(text: str, lang: str) -> list[str]:
    out: list[str] = []
    for rx, how in _ROUTE_RES:
        if how == "py" and lang != "python":
            continue
        for m in rx.finditer(text):
            if how == "py":
                verb, path, rest = m.group(1), m.group(2), m.group(3)
                if verb in ("route", "api_route"):
                    methods = re.findall(r"['\"](GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS)['\"]", rest, re.I)
                    label = ",".join(x.upper() for x in methods) if methods else "ANY"
                else:
                    label = verb.upper()
                ep = f"{label} {path or '/'}"
            elif how == "verb":
                verb, path = m.group(1).upper(), m.group(2)
                verb = {"REQUEST": "ANY", "ALL": "ANY"}.get(verb, verb)
                ep = f"{verb} {path}"
            elif how == "go":
                path = m.group(2)
                ep = path if re.match(r"^[A-Z]+ /", path) else f"ANY {path}"
            else:
                if lang != "python" and rx.pattern.startswith(r"\b(?:re_)?path"):
                    continue
                path = m.group(1)
                ep = f"ANY {path if path.startswith('/') else '/' + path}"
            if ep not in out:
                out.append(ep)
    return out[:40]


def extract_code(doc: SignpostInput) -> dict:
    text = doc.text
    ext = PurePosixPath(doc.path).suffix.lstrip(".").lower()
    lang = (doc.meta or {}).get("language") or _LANG_BY_EXT.get(ext, "")
    lang = {"javascript": "js", "typescript": "js", "c++": "c", "cpp": "c", "bash": "shell"}.get(str(lang).lower(),
                                                                                                   str(lang).lower())
    purpose = ""
    funcs: list[dict] = []
    strings: list[str] = []
    if lang == "python":
        purpose, funcs, strings = _py_code(text)
    if not funcs and lang == "python":      # did not parse (Python 2, a syntax error): top-level names by regex
        funcs = [{"name": m.group(1), "does": ""} for m in
                 re.finditer(r"^(?:async\s+)?(?:def|class)\s+([A-Za-z]\w*)", text, re.M)][:40]
    elif not funcs:
        funcs = _regex_code(text, lang)
    if not purpose:
        purpose = _leading_comment(text)
    if lang == "sql" or ext == "sql":
        tables = extract_tables([text], case_insensitive=True)
    elif lang == "python":
        tables = extract_tables([x for x in strings if _SQLISH.search(x)], case_insensitive=True)
    else:
        tables = extract_tables([text])
    endpoints = extract_endpoints(text, lang)
    if not purpose:
        name = PurePosixPath(doc.path).name
        what = ", ".join(f["name"] for f in funcs[:5])
        kind = {"python": "Python", "js": "JavaScript/TypeScript", "go": "Go", "rust": "Rust", "java": "Java",
                "sql": "SQL", "shell": "Shell"}.get(lang, lang.capitalize() or "Source")
        purpose = f"{kind} file {name}" + (f" defining {what}" if what else "") + "."
        if endpoints:
            purpose += f" Serves {len(endpoints)} HTTP route(s)."
    return {"purpose": shorten(purpose, SUMMARY_CHARS), "key_functions": funcs, "tables": tables,
            "endpoints": endpoints}
