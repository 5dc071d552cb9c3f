"""Records: what one result says, cut to a per-record budget, and its compact text form.

Standard library only: this module is imported by `from kb_assets.query import recall`.

Budget rule (the product is the answer's size as much as its quality): the compact text of one record —
header line, title, summary, decisions, lists — never exceeds `record_chars` characters. Within it a summary
gets at most 300 characters, each of the top 3 decisions at most 140 (decision and rationale together), and
the lists (artifacts, components, tags) are compact "a, b, c (+4)". Every cut falls on a word boundary and
ends with "…"; anything cut sets the record's `truncated` flag. The JSON form carries the same cut strings.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from kb_assets.sources.safe_names import printable   # standard library only, too

ELLIPSIS = "…"
SUMMARY_CHARS = 300
DECISION_CHARS = 140
TOP_DECISIONS = 3
TITLE_CHARS = 120
LIST_ITEM_CHARS = 60
LIST_ITEMS = {"artifacts": 8, "components": 6, "tags": 6, "work_types": 4}
PURPOSE_CHARS = 300
CODE_FUNCTIONS = 8
PASSAGE_CHARS = 500

_WS = re.compile(r"\s+")


def estimate_tokens(text: str) -> int:
    """chars / 4, rounded up: the usual estimate for English prose with an LLM tokenizer.

    Measured against the local (BERT word-piece) tokenizer on rendered answers in the tests; see
    docs/QUALITY.md for the ratio.
    """
    return math.ceil(len(text) / 4)


def squash(text: Any) -> str:
    s = str(text or "")
    if "  " in s or "\n" in s or "\t" in s or "\r" in s:
        return _WS.sub(" ", s).strip()
    return s.strip()


def cut_words(text: Any, limit: int) -> tuple[str, bool]:
    """Cut `text` (whitespace squashed) to at most `limit` characters at a word boundary, ending with "…".

    Returns (text, was_cut). A single word longer than the limit is cut inside the word (rare: URLs).
    """
    s = squash(text)
    if len(s) <= limit:
        return s, False
    if limit <= 1:
        return (ELLIPSIS if limit == 1 else ""), True
    room = s[: limit - 1]          # leave room for the ellipsis
    if s[limit - 1] != " ":        # we are inside a word: back up to the previous space
        sp = room.rfind(" ")
        if sp > 0:
            room = room[:sp]
    room = room.rstrip(" ,;:.-–—(")
    return room + ELLIPSIS, True


def compact_list(items: list[str], max_items: int, item_chars: int = LIST_ITEM_CHARS) -> tuple[list[str], int, bool]:
    """At most max_items non-empty items, each cut to item_chars: (shown, omitted count, anything cut)."""
    shown: list[str] = []
    cut = False
    total = 0
    for item in items:
        if not item or (isinstance(item, str) and item.isspace()):
            continue
        total += 1
        if len(shown) < max_items:
            s, c = cut_words(item, item_chars)
            if s:
                shown.append(s)
                cut = cut or c
            else:
                total -= 1
    omitted = total - len(shown)
    return shown, omitted, cut or omitted > 0


def list_text(items: list[str], omitted: int) -> str:
    """"a, b, c (+4)"."""
    if not items:
        return f"(+{omitted})" if omitted else ""
    return ", ".join(items) + (f" (+{omitted})" if omitted else "")


@dataclass
class Record:
    """One result. `signpost` holds the budgeted strings; `to_dict` is the JSON shape."""

    id: str
    title: str
    kind: str
    source: str
    path: str
    score: float
    status: str = ""
    created: str | None = None
    updated: str | None = None
    signpost: dict[str, Any] = field(default_factory=dict)
    indexed_commit: str | None = None
    stale: bool = False
    queries: list[int] = field(default_factory=list)      # indices into RecallResult.queries
    passage: dict[str, Any] | None = None
    truncated: bool = False
    section: str = "documents"                            # documents | code
    text: str = ""                                        # compact text, filled by fit_record
    superseded_by: str | None = None                      # kb id (or reference) of the successor, if any

    def to_dict(self, query_texts: list[str] | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": self.id, "title": self.title, "kind": self.kind, "source": self.source, "path": self.path,
            "score": round(self.score, 4), "status": self.status, "created": self.created,
            "updated": self.updated, "signpost": self.signpost, "indexed_commit": self.indexed_commit,
            "stale": self.stale, "truncated": self.truncated,
        }
        if query_texts is not None and len(query_texts) > 1:
            d["queries"] = [query_texts[i] for i in self.queries]
        if self.passage is not None:
            d["passage"] = self.passage
        if self.superseded_by:
            d["superseded_by"] = self.superseded_by
        return d


def _date_part(value: str | None) -> str:
    return value or ""


def _header(rec: Record, rank: int, multi: bool) -> str:
    bits = [rec.kind]
    if rec.status:
        bits.append(squash(rec.status)[:30])
    date = rec.updated or rec.created
    if date:
        bits.append(_date_part(date))
    line = f"{rank}. {printable(rec.id)} [{' · '.join(bits)}] {rec.score:.2f}"   # a newline in a name stays one line
    if rec.stale:
        line += " STALE"
    if rec.superseded_by:
        line += f" → superseded by {rec.superseded_by}"
    if multi and rec.queries:
        line += " q" + ",".join(str(i + 1) for i in rec.queries)
    return line


def _doc_body(sp: dict[str, Any]) -> list[str]:
    lines = []
    if sp.get("summary"):
        lines.append("   " + sp["summary"])
    for d in sp.get("key_decisions", []):
        text = d["decision"] + (f" — {d['rationale']}" if d.get("rationale") else "")
        lines.append("   - " + text)
    tail = []
    omitted = sp.get("omitted", {})
    for key, label in (("artifacts", "files"), ("components", "uses"), ("tags", "tags"), ("work_types", "type")):
        if sp.get(key):
            tail.append(f"{label}: {list_text(sp[key], omitted.get(key, 0))}")
    if tail:
        lines.append("   " + " | ".join(tail))
    return lines


def _code_body(sp: dict[str, Any]) -> list[str]:
    lines = []
    if sp.get("purpose"):
        lines.append("   " + sp["purpose"])
    tail = []
    omitted = sp.get("omitted", {})
    for key, label in (("key_functions", "defs"), ("tables", "tables"), ("endpoints", "routes")):
        if sp.get(key):
            tail.append(f"{label}: {list_text(sp[key], omitted.get(key, 0))}")
    if tail:
        lines.append("   " + " | ".join(tail))
    return lines


def _render(rec: Record, rank: int, multi: bool) -> str:
    lines = [_header(rec, rank, multi)]
    if rec.title:
        lines.append("   " + rec.title)
    lines += _code_body(rec.signpost) if rec.section == "code" else _doc_body(rec.signpost)
    return "\n".join(lines)


def budget_signpost(kind: str, payload: dict[str, Any] | None, section: str) -> tuple[dict[str, Any], bool]:
    """The signpost cut to the per-field limits (before the whole-record fit). Returns (signpost, cut)."""
    payload = payload or {}
    cut_any = False
    out: dict[str, Any] = {}
    omitted: dict[str, int] = {}
    if section == "code":
        purpose = payload.get("purpose") or payload.get("summary") or ""
        out["purpose"], c = cut_words(purpose, PURPOSE_CHARS)
        cut_any |= c
        names = []
        for f in payload.get("key_functions") or []:
            name = f.get("name") if isinstance(f, dict) else str(f)
            if name:
                names.append(str(name))
        out["key_functions"], omitted["key_functions"], c = compact_list(names, CODE_FUNCTIONS, LIST_ITEM_CHARS)
        cut_any |= c
        for key in ("tables", "endpoints"):
            out[key], omitted[key], c = compact_list([str(x) for x in (payload.get(key) or [])], 6)
            cut_any |= c
    else:
        out["summary"], c = cut_words(payload.get("summary", ""), SUMMARY_CHARS)
        cut_any |= c
        decisions = []
        raw = [d for d in (payload.get("key_decisions") or []) if isinstance(d, dict) and squash(d.get("decision"))]
        for d in raw[:TOP_DECISIONS]:
            dec, rat = squash(d.get("decision")), squash(d.get("rationale"))
            # decision and rationale share 140 characters; a long decision keeps at least 80 of them
            if len(dec) + (len(rat) + 3 if rat else 0) > DECISION_CHARS:
                cut_any = True
                if rat:
                    dec, _ = cut_words(dec, min(len(dec), max(80, DECISION_CHARS - 3 - len(rat))))
                    room = DECISION_CHARS - 3 - len(dec)
                    rat = cut_words(rat, room)[0] if room >= 12 else ""
                else:
                    dec, _ = cut_words(dec, DECISION_CHARS)
            decisions.append({"decision": dec, "rationale": rat})
        cut_any |= len(raw) > TOP_DECISIONS
        out["key_decisions"] = decisions
        for key in ("artifacts", "components", "tags", "work_types"):
            out[key], omitted[key], c = compact_list([str(x) for x in (payload.get(key) or [])], LIST_ITEMS[key])
            cut_any |= c
    out["generator"] = payload.get("_generator", "")
    omitted = {k: v for k, v in omitted.items() if v}
    if omitted:
        out["omitted"] = omitted        # list items left out, per list
    return out, cut_any


def fit_record(rec: Record, record_chars: int, rank: int = 1, multi: bool = False) -> Record:
    """Shrink the record until its compact text fits record_chars; sets rec.text and rec.truncated.

    Order of sacrifice: list items, decisions beyond the first, the summary/purpose (to a minimum of 80
    characters), the title, then whatever remains.
    """
    sp = rec.signpost
    text = _render(rec, rank, multi)
    if len(text) <= record_chars:
        rec.text = text
        return rec
    rec.truncated = True
    list_keys = (["endpoints", "tables", "key_functions"] if rec.section == "code"
                 else ["work_types", "tags", "components", "artifacts"])
    main = "purpose" if rec.section == "code" else "summary"

    def over() -> int:
        return len(_render(rec, rank, multi)) - record_chars

    # 1. lists: drop items from the end (counted in "omitted": the text shows "(+n)"), then the whole list
    for key in list_keys:
        while over() > 0 and sp.get(key):
            sp[key] = sp[key][:-1]
            sp.setdefault("omitted", {})
            sp["omitted"][key] = sp["omitted"].get(key, 0) + 1
    # 2. decisions beyond the first, then the first decision's rationale
    while over() > 0 and len(sp.get("key_decisions", [])) > 1:
        sp["key_decisions"] = sp["key_decisions"][:-1]
    if over() > 0 and sp.get("key_decisions") and sp["key_decisions"][0].get("rationale"):
        sp["key_decisions"][0]["rationale"] = ""
    # 3. the summary, down to 80 characters
    if over() > 0 and sp.get(main):
        sp[main], _ = cut_words(sp[main], max(80, len(sp[main]) - over()))
    # 4. decisions entirely, the title
    if over() > 0 and sp.get("key_decisions"):
        sp["key_decisions"] = []
    if over() > 0 and rec.title:
        rec.title, _ = cut_words(rec.title, max(1, len(rec.title) - over()))
    # 5. the summary, to nothing
    if over() > 0 and sp.get(main):
        sp[main], _ = cut_words(sp[main], max(0, len(sp[main]) - over()))
    text = _render(rec, rank, multi)
    if len(text) > record_chars:   # only the header is left: an id longer than the budget
        text = text[: record_chars - 1] + ELLIPSIS
    rec.text = text
    return rec


def fallback_signpost(title: str, text: str | None, kind: str) -> dict[str, Any]:
    """No signpost yet: the document's first meaningful prose as its summary (generator "none")."""
    summary = first_prose(text or "", 600) or title
    if kind == "code":
        return {"purpose": summary, "_generator": "none"}
    return {"summary": summary, "_generator": "none"}


_HEADER_LINE = re.compile(r"^[A-Z][A-Za-z-]{1,30}:\s")   # RFC 822-style headers (PEP, email-ish preambles)
_UNDERLINE = re.compile(r"^\s*([=\-~^*#+`.:_])\1{2,}\s*$")


def first_prose(text: str, limit: int) -> str:
    """The first lines of real prose: skips front matter, header blocks, headings, rules and code fences."""
    from kb_assets.sources.textutil import front_matter_end

    text = text[front_matter_end(text):]             # YAML front matter, bounded by the readers' one rule
    lines = text.splitlines()
    i = 0
    out: list[str] = []
    in_fence = False
    in_header = True
    body = lines[i:]
    for k, line in enumerate(body):
        s = line.strip()
        if s.startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        if in_header and (_HEADER_LINE.match(line) or (line[:1].isspace() and s and not out)):
            continue                                               # header block or its continuation lines
        if not s:
            if out and sum(len(x) for x in out) > 80:
                break
            continue
        in_header = False
        nxt = body[k + 1].strip() if k + 1 < len(body) else ""
        if (s.startswith("#") or _UNDERLINE.match(s) or _UNDERLINE.match(nxt)
                or s.startswith((".. ", "|", "<!--", ":"))):
            continue                                               # headings, rules, directives, tables
        out.append(s)
        if sum(len(x) + 1 for x in out) >= limit:
            break
    return cut_words(" ".join(out), limit)[0]
