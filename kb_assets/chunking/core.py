"""The engine every chunker feeds: sections of blocks (character ranges of the document) in, chunks out.

A shape-specific splitter (markdown, reST, code, transcript, ...) only says *where* the natural boundaries
are: a list of `Section`s, each a heading plus `blocks` (paragraphs, definitions, turns: ranges of
`text`). The engine then, for the whole document at once:

1. counts the blocks and headings (one `count_tokens` call for the document);
2. swaps over-budget sections for their finer `alternative` (a big class → its methods);
3. packs consecutive small sections when asked (transcript turns, session paragraphs), and merges tiny
   sections (a heading with no text under it) into the next one;
4. cuts any block that alone exceeds the budget at the best boundary it can find (blank line, line
   break, sentence end, whitespace, and only then between characters: CJK text has no spaces), counting
   all candidate pieces of the document in one call per round;
5. packs blocks greedily into pieces under the budget, adding a small overlap (the tail of the
   previous piece) between consecutive pieces of the same section only;
6. counts every chunk's `embedding_text()` (heading + text) in one call, and re-cuts the rare chunk the
   packing arithmetic got wrong, so no chunk exceeds `max_tokens` according to `count_tokens`.

A chunk's text is always one contiguous slice of the document, so its 1-based line span is exact; lines
are separated by "\\n".
"""
from __future__ import annotations

import math
import re
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Callable

from kb_assets.chunking.tokens import CountTokens
from kb_assets.models import Chunk

Range = tuple[int, int]

HEADING_PART_CHARS = 120         # one heading component is cut to this many characters
CHARS_PER_TOKEN_CAP = 12         # a chunk holds at most max_tokens * this many characters, whatever the count
                                 # (a 5 MB run without spaces is one [UNK] token to WordPiece)
HEADING_SEPARATOR = " > "

_BLANK_LINES = re.compile(r"\n(?:[ \t\r\f\v]*\n)+")
_NEWLINE = re.compile(r"\n")
_SENTENCE_END = re.compile(r"[.!?;:…][)\]\"'»”’]*(?=\s)|[。！？；]")
_WS = re.compile(r"\s+")


@dataclass
class Section:
    heading: str
    blocks: list[Range]
    head: Range | None = None             # the heading line(s): part of the text only when merged into a neighbour
    mode: str = "prose"                   # "prose" | "code": where an oversized block is cut, how overlap is taken
    max_lines: int = 0                    # a piece spans at most this many lines (line windows); 0: no limit
    alternative: Callable[[], list["Section"]] | None = None   # finer sections when this one is over budget
    mergeable: bool = True                # may be merged into a neighbour when tiny

    def span(self) -> Range:
        start = self.head[0] if self.head else self.blocks[0][0]
        end = self.blocks[-1][1] if self.blocks else self.head[1]
        if self.head and self.blocks:
            start = min(start, self.blocks[0][0])
        return start, end


class Lines:
    """Line ↔ character offset arithmetic for one document (lines split on "\\n")."""

    def __init__(self, text: str):
        self.text = text
        self.starts = [0]
        self.starts.extend(m.end() for m in _NEWLINE.finditer(text))
        self.count = len(self.starts)

    def line_of(self, pos: int) -> int:
        """0-based line of the character at `pos`."""
        return bisect_right(self.starts, pos) - 1

    def line(self, i: int) -> str:
        end = self.starts[i + 1] - 1 if i + 1 < self.count else len(self.text)
        return self.text[self.starts[i]:end]

    def char_range(self, a: int, b: int) -> Range | None:
        """Characters of 0-based lines [a, b), trimmed of surrounding whitespace; None when blank."""
        if a >= b or a >= self.count:
            return None
        s = self.starts[a]
        e = self.starts[b] - 1 if b < self.count else len(self.text)
        return trim(self.text, s, e)

    def paragraphs(self, a: int, b: int, protected: list[Range] | None = None) -> list[Range]:
        """Blank-line separated paragraphs of lines [a, b); never split inside a `protected` char range."""
        rng = self.char_range(a, b)
        if rng is None:
            return []
        return paragraphs(self.text, rng[0], rng[1], protected)


def trim(text: str, s: int, e: int) -> Range | None:
    while s < e and text[s].isspace():
        s += 1
    while e > s and text[e - 1].isspace():
        e -= 1
    return (s, e) if s < e else None


def paragraphs(text: str, s: int, e: int, protected: list[Range] | None = None) -> list[Range]:
    out: list[Range] = []
    pos = s
    pstarts = [p[0] for p in protected] if protected else None
    for m in _BLANK_LINES.finditer(text, s, e):
        if protected:
            i = bisect_right(pstarts, m.start()) - 1
            if i >= 0 and protected[i][0] <= m.start() < protected[i][1]:
                continue
        r = trim(text, pos, m.start())
        if r:
            out.append(r)
        pos = m.end()
    r = trim(text, pos, e)
    if r:
        out.append(r)
    return out


def heading_path(parts: list[str]) -> str:
    """Join heading components, each with whitespace collapsed and cut to HEADING_PART_CHARS."""
    clean = []
    for p in parts:
        p = _WS.sub(" ", p).strip()
        if len(p) > HEADING_PART_CHARS:
            p = p[:HEADING_PART_CHARS - 1].rstrip() + "…"
        if p:
            clean.append(p)
    return HEADING_SEPARATOR.join(clean)


def clipped(title: str) -> bool:
    """True when heading_path would cut this heading component (keep its line in the text then)."""
    return len(title) > HEADING_PART_CHARS and len(_WS.sub(" ", title).strip()) > HEADING_PART_CHARS


def _embedding_text(heading: str, text: str) -> str:
    return f"{heading}\n{text}" if heading else text


@dataclass
class _Item:
    heading: str
    start: int
    end: int
    own_start: int          # start without the overlap taken from the previous piece
    mode: str
    parts: list[Range] | None = None    # the counted blocks it is made of (None: count it whole)
    prev_end: int = 0                   # end of the previous piece (the overlap is text[start:prev_end])


@dataclass
class Engine:
    text: str
    max_tokens: int
    overlap_tokens: int
    count_tokens: CountTokens
    lines: Lines = field(default=None)  # type: ignore[assignment]

    def __post_init__(self):
        if self.lines is None:
            self.lines = Lines(self.text)
        self._counts: dict[Range, int] = {}
        self._hcounts: dict[str, int] = {"": 0}
        self.min_tokens = max(4, min(32, self.max_tokens // 8))
        self.max_chars = self.max_tokens * CHARS_PER_TOKEN_CAP

    # ------------------------------------------------------------------ counting
    def _count(self, texts: list[str]) -> list[int]:
        counts = list(self.count_tokens(texts)) if texts else []
        if len(counts) != len(texts):
            raise ValueError(f"count_tokens returned {len(counts)} counts for {len(texts)} texts")
        return counts

    def count(self, ranges, headings=()) -> None:
        need = [r for r in dict.fromkeys(ranges) if r not in self._counts]
        needh = [h for h in dict.fromkeys(headings) if h not in self._hcounts]
        if not need and not needh:
            return
        text = self.text
        counts = self._count([text[s:e] for s, e in need] + needh)
        self._counts.update(zip(need, counts))
        self._hcounts.update(zip(needh, counts[len(need):]))

    def size(self, r: Range) -> int:
        """What a range weighs when packing: its tokens, or more when it has very many characters."""
        n = self._counts[r]
        chars = r[1] - r[0]
        return n if chars <= n * CHARS_PER_TOKEN_CAP else -(-chars // CHARS_PER_TOKEN_CAP)

    def total(self, sec: Section) -> int:
        size = self.size
        return sum(size(b) for b in sec.blocks)

    def whole(self, sec: Section) -> int:
        return self.total(sec) + (self.size(sec.head) if sec.head else 0)

    def cap(self, heading: str) -> int:
        return self.max_tokens - self._hcounts[heading]

    def _precut(self, sections: list[Section]) -> None:
        """Cut blocks of more than a few chunks' worth of characters before counting them (a 5 MB line)."""
        limit = self.max_chars * 4
        for sec in sections:
            if any(e - s > limit for s, e in sec.blocks):
                new: list[Range] = []
                for b in sec.blocks:
                    if b[1] - b[0] > limit:
                        new.extend(self._cut(b, b[1] - b[0], self.max_chars, sec.mode))
                    else:
                        new.append(b)
                sec.blocks = new

    def _count_sections(self, sections: list[Section]) -> None:
        ranges = [b for s in sections for b in s.blocks]
        ranges += [s.head for s in sections if s.head]
        self.count(ranges, [s.heading for s in sections])
        self._fit_headings(sections)

    def _fit_headings(self, sections: list[Section]) -> None:
        """A heading may take at most a quarter of the budget: drop leading components, then cut it."""
        limit = max(1, self.max_tokens // 4)
        for _ in range(12):
            over = {s.heading for s in sections if self._hcounts[s.heading] > limit}
            if not over:
                return
            repl: dict[str, str] = {}
            for h in over:
                parts = h.split(HEADING_SEPARATOR)
                if len(parts) > 2 or (len(parts) == 2 and parts[0] != "…"):
                    new = HEADING_SEPARATOR.join(["…"] + parts[2:] if parts[0] == "…" else ["…"] + parts[1:])
                else:
                    n = len(h)
                    ratio = limit / max(1, self._hcounts[h])
                    new = h[:max(1, min(n - 1, int(n * ratio * 0.8)))].rstrip() + "…"
                repl[h] = new
            self.count((), list(repl.values()))
            for s in sections:
                if s.heading in repl:
                    s.heading = repl[s.heading]
                    if s.head is not None:       # the heading path no longer shows it: keep its line as text
                        s.blocks.insert(0, s.head)
                        s.head = None
        for s in sections:                       # pathological tokenizer: give up on the heading
            if self._hcounts[s.heading] > limit:
                s.heading = ""
                if s.head is not None:
                    s.blocks.insert(0, s.head)
                    s.head = None

    # ------------------------------------------------------------------ cutting
    def _boundary(self, lo: int, hi: int, mode: str) -> int:
        """Best cut position in (lo, hi]: the piece before ends there."""
        text = self.text
        i = text.rfind("\n\n", lo, hi)
        if i > lo:
            return i
        i = text.rfind("\n", lo, hi)
        if i > lo:
            return i
        if mode == "prose":
            last = None
            for m in _SENTENCE_END.finditer(text, lo, hi):
                last = m
            if last is not None and last.end() > lo:
                return last.end()
        best = max(text.rfind(" ", lo, hi), text.rfind("\t", lo, hi), text.rfind("\u3000", lo, hi))
        if best > lo:
            return best
        return hi

    def _cut(self, rng: Range, tokens: int, cap: int, mode: str) -> list[Range]:
        s, e = rng
        n = e - s
        parts = max(2, math.ceil(tokens / max(1, cap * 0.92)))
        step = n / parts
        out: list[Range] = []
        pos = s
        text = self.text
        while pos < e:
            if e - pos <= step * 1.15 + 1:
                r = trim(text, pos, e)
                if r:
                    out.append(r)
                break
            hi = min(e, pos + max(1, int(step)))
            lo = pos + int(step * 0.5)
            cut = self._boundary(lo, hi, mode) if hi - lo > 1 else hi
            r = trim(text, pos, cut)
            if r:
                out.append(r)
            pos = cut
            while pos < e and text[pos].isspace():
                pos += 1
        if len(out) == 1 and out[0] == rng:          # nothing to cut at: halve by characters
            mid = s + n // 2
            out = [r for r in (trim(text, s, mid), trim(text, mid, e)) if r]
        return out

    def _fit_blocks(self, wanted: list[tuple[Range, int, str]]) -> dict[Range, list[Range]]:
        """Cut each (block, cap, mode) until every piece is within its cap; one count call per round."""
        result: dict[Range, list[Range]] = {b: [b] for b, _, _ in wanted}
        caps = {b: (cap, mode) for b, cap, mode in wanted}
        for _ in range(40):
            todo = []
            for b, pieces in result.items():
                cap, mode = caps[b]
                if any(self.size(p) > cap for p in pieces):
                    todo.append(b)
            if not todo:
                break
            fresh: list[Range] = []
            for b in todo:
                cap, mode = caps[b]
                new: list[Range] = []
                for p in result[b]:
                    if self.size(p) > cap and p[1] - p[0] > 1:
                        cut = self._cut(p, self.size(p), cap, mode)
                        new.extend(cut)
                        fresh.extend(cut)
                    else:
                        new.append(p)
                result[b] = new
            self.count(fresh)
        return result

    # ------------------------------------------------------------------ overlap
    def _overlap_start(self, prev: Range, tokens: int, mode: str) -> int | None:
        """Where the tail of `prev` worth about `tokens` tokens starts (None: no overlap)."""
        if tokens <= 0:
            return None
        s, e = prev
        text = self.text
        if mode == "code":
            start = None
            budget = float(tokens)
            li = self.lines.line_of(e - 1)
            first = self.lines.line_of(s)
            for _ in range(5):
                if li <= first:
                    break
                ls = self.lines.starts[li]
                line = text[max(ls, s):e] if start is None else text[ls:start]
                cost = max(len(line.split()) * 1.3, len(line) / 3)
                if cost > budget:
                    break
                budget -= cost
                start = ls
                li -= 1
            if start is None:
                return None
            r = trim(text, start, e)
            return r[0] if r and r[0] > s else None
        # prose: about `tokens` tokens back (≈3 characters a token in English, 1 in CJK), from a word start
        span = tokens * 3 if text[e - 1].isascii() else max(1, tokens // 2)
        p = e - span
        if p <= s:
            return None
        if not text[p - 1].isspace():
            m = _WS.search(text, p, e)
            if m is not None:
                p = m.end()
            elif text[e - 1].isascii():
                return None              # one long word: no clean place to start
        r = trim(text, p, e)
        return r[0] if r and r[0] > s else None

    # ------------------------------------------------------------------ merging
    def _merged_range(self, sec: Section) -> Range:
        rng = sec.span()
        c = self._counts
        self._counts.setdefault(rng, sum(c[b] for b in sec.blocks) + (c[sec.head] if sec.head else 0))
        return rng

    def _absorb(self, first: Section, sec: Section) -> None:
        """Put all of `first` (which comes just before `sec`) at the start of `sec`."""
        carry = self._merged_range(first)
        if sec.head is not None:                 # carry + this section's heading line(s): one block
            joined = (carry[0], sec.head[1])
            self._counts.setdefault(joined, self._counts[carry] + self._counts[sec.head])
            sec.blocks.insert(0, joined)
            sec.head = None
        else:
            sec.blocks.insert(0, carry)

    def _pack_sections(self, sections: list[Section]) -> list[Section]:
        """Greedily pack consecutive sections that fit together (transcript turns, session notes)."""
        out: list[Section] = []
        room = 0
        for sec in sections:
            if out and sec.mergeable and out[-1].mergeable and sec.blocks:
                prev = out[-1]
                if prev.heading == "" and sec.heading and self.whole(prev) + self.whole(sec) <= self.cap(sec.heading):
                    self._absorb(prev, sec)          # a preamble takes the heading of what follows
                    out[-1] = sec
                    room = self.cap(sec.heading) - self.total(sec)
                    continue
                w = self.whole(sec)
                if w <= room:
                    prev.blocks.append(self._merged_range(sec))
                    room -= w
                    continue
            out.append(sec)
            room = self.cap(sec.heading) - self.total(sec)
        return out

    def _merge_tiny(self, sections: list[Section]) -> list[Section]:
        """A tiny section (a heading alone, a one-line note) joins the next section, the last one the previous."""
        if len(sections) < 2:
            return sections
        out: list[Section] = []
        carry: Section | None = None
        last = len(sections) - 1
        for i, sec in enumerate(sections):
            if carry is not None:
                self._absorb(carry, sec)
                carry = None
            if sec.mergeable and self.total(sec) < self.min_tokens:
                if i < last:
                    carry = sec
                    continue
                if out:
                    out[-1].blocks.append(self._merged_range(sec))
                    continue
            out.append(sec)
        return out

    # ------------------------------------------------------------------ main
    def run(self, sections: list[Section], *, pack_sections: bool = False) -> list[Chunk]:
        sections = [s for s in sections if s.blocks or s.head]
        for s in sections:
            if not s.blocks and s.head:          # a heading alone: its line is its text
                s.blocks = [s.head]
                s.head = None
        if not sections:
            return []
        self._precut(sections)
        self._count_sections(sections)

        for _ in range(4):                       # big class → methods, big namespace → members ...
            expanded: list[Section] = []
            changed = False
            for s in sections:
                if s.alternative is not None and self.total(s) > self.cap(s.heading):
                    alt = [a for a in s.alternative() if a.blocks or a.head]
                    for a in alt:
                        if not a.blocks and a.head:
                            a.blocks, a.head = [a.head], None
                    if alt:
                        expanded.extend(alt)
                        changed = True
                        continue
                s.alternative = None
                expanded.append(s)
            sections = expanded
            if not changed:
                break
            self._count_sections(sections)

        if pack_sections:
            sections = self._pack_sections(sections)
        sections = self._merge_tiny(sections)

        # plan: cap per section, blocks to cut
        plans = []
        wanted: list[tuple[Range, int, str]] = []
        for s in sections:
            cap = self.cap(s.heading)
            single = self.total(s) <= cap and (
                not s.max_lines or self._span_lines(s.blocks[0][0], s.blocks[-1][1]) <= s.max_lines)
            ov = 0 if single else min(self.overlap_tokens, cap // 4)
            pack_cap = cap - ov
            plans.append((s, single, ov, pack_cap))
            if not single:
                wanted.extend((b, pack_cap, s.mode) for b in s.blocks if self.size(b) > pack_cap)
        fitted = self._fit_blocks(wanted) if wanted else {}

        items: list[_Item] = []
        for s, single, ov, pack_cap in plans:
            if single:
                b = s.blocks
                items.append(_Item(s.heading, b[0][0], b[-1][1], b[0][0], s.mode, list(b)))
                continue
            blocks = [p for b in s.blocks for p in fitted.get(b, (b,))]
            prev: Range | None = None
            for parts in self._pack(blocks, pack_cap, s.max_lines):
                ps, pe = parts[0][0], parts[-1][1]
                start = ps
                if prev is not None and ov:
                    o = self._overlap_start(prev, ov, s.mode)
                    if o is not None and o < ps:
                        start = o
                items.append(_Item(s.heading, start, pe, ps, s.mode, parts, prev[1] if prev else 0))
                prev = (ps, pe)
        return self._finish(items)

    def _span_lines(self, s: int, e: int) -> int:
        return self.lines.line_of(e - 1) - self.lines.line_of(s) + 1

    def _pack(self, blocks: list[Range], cap: int, max_lines: int) -> list[list[Range]]:
        size = self.size
        out: list[list[Range]] = []
        cur: list[Range] = []
        tok = 0
        first_line = 0
        line_of = self.lines.line_of
        for b in blocks:
            t = size(b)
            if cur and tok + t <= cap and (not max_lines or line_of(b[1] - 1) - first_line < max_lines):
                cur.append(b)
                tok += t
                continue
            if cur:
                out.append(cur)
            cur, tok = [b], t
            if max_lines:
                first_line = line_of(b[0])
        if cur:
            out.append(cur)
        return out

    def _arithmetic_counts(self, items: list[_Item]) -> list[int | None]:
        """Counts from the parts already counted, when the counter is additive over whitespace-separated
        words and every join inside the chunk is whitespace; None where the chunk must be counted whole."""
        out: list[int | None] = [None] * len(items)
        if not getattr(self.count_tokens, "word_additive", False):
            return out
        overlaps = [(it.start, it.prev_end) for it in items
                    if it.parts and it.start < it.own_start and it.start < it.prev_end < it.own_start]
        self.count(overlaps)
        counts = self._counts
        text = self.text
        for i, it in enumerate(items):
            parts = it.parts
            if not parts:
                continue
            ok = True
            prev_e = parts[0][1]
            for ps, pe in parts[1:]:
                if ps <= prev_e or not text[prev_e:ps].isspace():
                    ok = False
                    break
                prev_e = pe
            if not ok:
                continue
            n = self._hcounts[it.heading] + sum(counts[p] for p in parts)
            if it.start < it.own_start:
                if not (it.start < it.prev_end < it.own_start and text[it.prev_end:it.own_start].isspace()):
                    continue
                n += counts[(it.start, it.prev_end)]
            out[i] = n
        return out

    def _finish(self, items: list[_Item]) -> list[Chunk]:
        text = self.text
        limit = self.max_tokens
        counts = self._arithmetic_counts(items)
        todo = [i for i, c in enumerate(counts) if c is None]
        if todo:
            fresh = self._count([_embedding_text(items[i].heading, text[items[i].start:items[i].end]) for i in todo])
            for i, c in zip(todo, fresh):
                counts[i] = c
        for _ in range(40):
            bad = [i for i, c in enumerate(counts)
                   if c > limit or items[i].end - items[i].start > self.max_chars]  # type: ignore[operator]
            if not bad:
                break
            new_items: list[_Item] = []
            new_counts: list[int | None] = []
            badset = set(bad)
            for i, it in enumerate(items):
                if i not in badset:
                    new_items.append(it)
                    new_counts.append(counts[i])
                elif it.start < it.own_start:            # first give up the overlap
                    new_items.append(_Item(it.heading, it.own_start, it.end, it.own_start, it.mode))
                    new_counts.append(None)
                else:
                    h = self._hcounts.get(it.heading, 0)
                    cap = max(1, limit - h)
                    weight = max(counts[i] - h, -(-(it.end - it.start) // CHARS_PER_TOKEN_CAP), cap + 1)
                    for s, e in self._cut((it.start, it.end), weight, cap, it.mode):
                        new_items.append(_Item(it.heading, s, e, s, it.mode))
                        new_counts.append(None)
            todo = [i for i, c in enumerate(new_counts) if c is None]
            fresh = self._count([_embedding_text(new_items[i].heading, text[new_items[i].start:new_items[i].end])
                                 for i in todo])
            for i, c in zip(todo, fresh):
                new_counts[i] = c
            items, counts = new_items, new_counts
        chunks = []
        line_of = self.lines.line_of
        self.spans = [(it.start, it.end) for it in items]     # character ranges of the chunks (for checks)
        for n, (it, c) in enumerate(zip(items, counts)):
            chunks.append(Chunk(ordinal=n, text=text[it.start:it.end], heading=it.heading,
                                start_line=line_of(it.start) + 1, end_line=line_of(it.end - 1) + 1,
                                token_count=int(c)))  # type: ignore[arg-type]
        return chunks
