"""Decision documents: ADRs (Nygard, MADR, metadata tables as in the NATS ADRs) and PEPs.

What is read (into SourceDocument.meta):
- title (clean: "17. Terraform Data Structure" -> "Terraform Data Structure", "Architecture Decision Record:
  Use ADRs" -> "Use ADRs"), number (from the file name, else the title prefix)
- status (canonical word, see STATUS_WORDS) and status_raw (as written)
- date (YYYY-MM-DD), updated (latest date of a revision-history table), author / authors, deciders, tags
- supersedes / superseded_by / amends / amended_by / updates: lists of references
- references: every link to another decision document and every bare "ADR-12" / "PEP 8" mention
References are root-relative paths when a link names a file (resolved against the document's folder),
or the sibling file when the naming scheme allows it (ADR-37 next to adr/ADR-12.md -> adr/ADR-37.md;
PEP 440 next to peps/pep-0008.rst -> peps/pep-0440.rst), else an id such as "ADR-37".
"""
from __future__ import annotations

import posixpath
import re
from typing import Any

from kb_assets.sources.textutil import (
    Heading, as_list, clean_inline, first_title, header_dict, headings, normalize_date, rfc822_header,
)

# Canonical statuses, most specific first (the first rule whose words occur in the raw status wins).
_STATUS_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("April Fool!", ("april fool",)),
    ("Partially Superseded", ("partly superseded", "partially superseded", "superseded in part")),
    ("Superseded", ("superseded", "superceded", "replaced by", "replaced")),
    ("Deprecated", ("deprecated", "deprecate", "retired", "obsolete", "sunset")),
    ("Rejected", ("rejected", "declined", "refused", "not accepted")),
    ("Withdrawn", ("withdrawn", "abandoned", "cancelled", "canceled")),
    ("Not Implemented", ("not implemented", "not yet implemented", "unimplemented")),
    ("Partially Implemented", ("partially implemented", "partly implemented")),
    ("Implemented", ("implemented", "done", "completed", "complete", "shipped", "released")),
    ("Final", ("final",)),
    ("Active", ("active",)),
    ("Provisional", ("provisional",)),
    ("Deferred", ("deferred", "postponed", "on hold")),
    ("Accepted", ("accepted", "approved", "agreed", "adopted", "decided", "ratified")),
    ("Draft", ("draft", "wip", "work in progress")),
    ("Proposed", ("proposed", "proposal", "pending", "under review", "in review", "in discussion", "open",
                  "rfc", "suggested", "review")),
)
STATUS_WORDS = tuple(w for w, _ in _STATUS_RULES)
_NEGATED = re.compile(r"(?:^|[^a-z])(?:not|never|no longer)\s+(?:yet\s+|be(?:en)?\s+)?$")


def normalize_status(raw: str | None) -> str | None:
    if not raw:
        return None
    low = re.sub(r"\s+", " ", clean_inline(raw)).strip().lower()
    if not low:
        return None
    for canonical, words in _STATUS_RULES:
        for w in words:
            for m in re.finditer(r"(?<![a-z])" + re.escape(w) + r"(?![a-z])", low):
                # "not deprecated", "never accepted": the word is negated, it is not the status
                if not w.startswith(("not ", "un")) and _NEGATED.search(low[:m.start()]):
                    continue
                return "Rejected" if canonical == "April Fool!" else canonical
    first = re.split(r"[\s,.;:(]", low, maxsplit=1)[0]
    return first[:1].upper() + first[1:] if first else None


# --- references -------------------------------------------------------------------------------------

_LINK_RE = re.compile(r"\[([^\]\n]{0,300})\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_ADR_FILE_RE = re.compile(r"(?i)^(?:adr[-_ ]?\d+[^/]*|\d{3,5}[-_][^/]+|pep-\d+[^/]*)$")
# Literal-prefixed patterns (fast search); the left boundary is checked in code.
_ADR_ID_RES = tuple(re.compile(p + r"[-\s_]?0*(\d{1,5})(?![\w-])") for p in ("ADR", "adr", "Adr"))
_PEP_ID_RE = re.compile(r"PEP[-\s_]?0*(\d{1,4})(?![\w-])")
_LEFT_OK = re.compile(r"[^\w/.-]")


def _left_ok(text: str, m: re.Match[str]) -> bool:
    return m.start() == 0 or bool(_LEFT_OK.match(text[m.start() - 1]))
_PEP_ROLE_RE = re.compile(r":pep:`(?:[^`<]*<)?0*(\d{1,4})(?:#[^`>]*)?>?`")
_NUM_STEM_RE = re.compile(r"^([A-Za-z]+[-_]?)(\d+)$")


class RefResolver:
    """Turns link targets and bare ids into reference strings, relative to one document."""

    def __init__(self, path: str):
        self.path = path
        self.dir = posixpath.dirname(path)
        name = posixpath.basename(path)
        stem, dot, ext = name.rpartition(".")
        if not dot:
            stem, ext = name, ""
        self.ext = ext
        m = _NUM_STEM_RE.match(stem)
        # Sibling naming "ADR-12.md" / "pep-0008.rst": prefix + (zero padded) number. Four digits or more
        # are a fixed width even without a leading zero: pep-3333.rst names its siblings pep-0245.rst.
        digits = m.group(2) if m else ""
        self.sibling = (m.group(1), len(digits) if digits.startswith("0") or len(digits) >= 4 else 0) \
            if m else None
        fm = _FILE_NUM_RE.match(name)
        self.number = int(fm.group(1)) if fm else None   # this document's own number (no self-references)

    def link(self, target: str) -> str | None:
        t = target.split("#", 1)[0].split("?", 1)[0].strip()
        if not t or re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I) or t.startswith("//"):
            return None
        base = posixpath.basename(t.rstrip("/"))
        if not _ADR_FILE_RE.match(base):
            return None
        if "." not in base and self.ext:
            t = t.rstrip("/") + "." + self.ext
        joined = posixpath.normpath(posixpath.join(self.dir, t)) if not t.startswith("/") else t.lstrip("/")
        if joined.startswith("../") or joined == "..":
            return t
        return joined

    def ident(self, family: str, number: int) -> str:
        if self.sibling and self.sibling[0].rstrip("-_").lower() == family.lower():
            prefix, width = self.sibling
            num = str(number).zfill(width) if width else str(number)
            name = f"{prefix}{num}" + (f".{self.ext}" if self.ext else "")
            return posixpath.join(self.dir, name) if self.dir else name
        return f"{family.upper()}-{number}"

    def refs_in(self, text: str) -> list[str]:
        out: list[str] = []
        for m in _LINK_RE.finditer(text):
            r = self.link(m.group(2))
            if r:
                out.append(r)
        stripped = _LINK_RE.sub(" ", text)
        linked_numbers = {int(m.group(1)) for r in out
                          if (m := _FILE_NUM_RE.match(posixpath.basename(r)))}
        adr_hits = [m for rx in _ADR_ID_RES for m in rx.finditer(stripped) if _left_ok(stripped, m)]
        for m in sorted(adr_hits, key=lambda m: m.start()):
            n = int(m.group(1))
            if n == self.number:
                continue
            ident = self.ident("adr", n)
            if ident.startswith("ADR-") and n in linked_numbers:
                continue   # "ADR 10" next to a link to 0010-....md: the link already names it
            out.append(ident)
        for m in (_PEP_ROLE_RE.finditer(stripped) if ":pep:" in stripped else ()):
            out.append(self.ident("pep", int(m.group(1))))
        no_roles = _PEP_ROLE_RE.sub(" ", stripped) if ":pep:" in stripped else stripped
        for m in _PEP_ID_RE.finditer(no_roles):
            if _left_ok(no_roles, m):
                out.append(self.ident("pep", int(m.group(1))))
        return _dedupe(r for r in out if r != self.path)


def _dedupe(items) -> list[str]:
    seen: list[str] = []
    for i in items:
        if i and i not in seen:
            seen.append(i)
    return seen


# --- ADR --------------------------------------------------------------------------------------------

_TITLE_PREFIX_RE = re.compile(
    r"(?i)^(?:architecture\s+decision\s+record|architectural\s+decision|decision\s+record|adr)\s*[:\-–—]\s*")
_TITLE_NUM_RE = re.compile(r"(?i)^(?:adr|rfc|decision)?[\s\-_#]*0*(\d{1,5})\s*[:.\-–—)]\s+(\S.*)$")
_FILE_NUM_RE = re.compile(r"(?i)^(?:adr|pep|rfc)?[-_ ]?0*(\d{1,5})(?:[-_. ]|$)")
_TABLE_ROW_RE = re.compile(r"^\s*\|(.+)\|\s*$")
_KEY_LINE_RE = re.compile(r"^\s*(?:[*\-+]\s+)?\**\s*([A-Za-z][A-Za-z \-]{1,30}?)\s*\**\s*:\s*\**\s*(.+?)\s*$")
_META_KEYS = {
    "date": "date", "created": "created", "updated": "updated", "last updated": "updated", "author": "author",
    "authors": "author", "owner": "author", "owners": "author", "status": "status", "tags": "tags",
    "tag": "tags", "labels": "tags", "deciders": "deciders", "decision makers": "deciders",
    "supersedes": "supersedes", "superseded by": "superseded_by", "superseded-by": "superseded_by",
    "amends": "amends", "amended by": "amended_by", "updates": "updates", "replaces": "supersedes",
    "replaced by": "superseded_by", "consulted": "consulted", "informed": "informed",
    "technical story": "technical_story",
}
_REL_PATTERNS = (
    ("superseded_by", re.compile(r"(?i)\b(?:superseded|superceded|replaced)\s+by\b([^\n]{0,300})")),
    ("superseded_by", re.compile(r"(?i)\b(?:deprecated?|superseded|replaced)\s+in\s+favou?r\s+of\b([^\n]{0,200})")),
    ("supersedes", re.compile(r"(?i)\b(?:supersedes|supercedes|replaces)\b([^\n]{0,300})")),
    ("amended_by", re.compile(r"(?i)\bamended\s+by\b([^\n]{0,300})")),
    ("amends", re.compile(r"(?i)\bamends\b([^\n]{0,300})")),
)


def _first_sentence(fragment: str) -> str:
    m = re.search(r"(?<!\d)\.(?:\s|$)", fragment)
    return fragment[: m.start()] if m else fragment


def _tables(lines: list[str]) -> list[list[list[str]]]:
    """Markdown tables as lists of rows of cells (separator rows dropped)."""
    tables: list[list[list[str]]] = []
    current: list[list[str]] = []
    for line in lines:
        m = _TABLE_ROW_RE.match(line)
        if m and len(line) < 2000:
            cells = [c.strip() for c in m.group(1).split("|")]
            if all(re.fullmatch(r":?-{2,}:?", c) or not c for c in cells):
                continue
            current.append(cells)
        else:
            if current:
                tables.append(current)
            current = []
    if current:
        tables.append(current)
    return tables


def parse_adr(body: str, path: str, front: dict[str, Any]) -> dict[str, Any]:
    lines = body.split("\n")
    hs = headings(lines)
    res = RefResolver(path)
    meta: dict[str, Any] = {}
    fields: dict[str, str] = {}      # raw values: front matter > table > key lines > status section

    # 1. key/value sources, lowest priority first (later ones overwrite)
    status_section = _section_text(lines, hs, ("status",))
    if status_section:
        first = next((ln.strip() for ln in status_section.split("\n") if ln.strip()), "")
        first = re.sub(r"^[*\-+]\s+", "", first)
        if first:
            fields["status"] = first[:300]
    head = lines[:60]
    for line in head:
        m = _KEY_LINE_RE.match(line)
        if m and not line.lstrip().startswith("|"):
            key = _META_KEYS.get(m.group(1).strip().lower())
            if key:
                fields[key] = m.group(2)
    revision_dates: list[str] = []
    table_keys: set[str] = set()
    for table in _tables(lines[:200]):
        header = [clean_inline(c).lower() for c in table[0]]
        if len(header) > 2:
            # A history table (Revision | Date | Author | Info, Date | Author | Description): its dates
            # say when the decision was last updated; its rows may say "Deprecate in favor of ADR-37".
            if "date" in header:
                di = header.index("date")
                revision_dates += [d for row in table[1:] if len(row) > di and (d := normalize_date(row[di]))]
                for row in table[1:]:
                    for k, rel in _relations_in(" ".join(row), res).items():
                        meta[k] = _dedupe(meta.get(k, []) + rel)
            continue
        for row in table:                      # key | value metadata tables; the first value wins
            if len(row) == 2:
                key = _META_KEYS.get(clean_inline(row[0]).lower())
                if key and row[1] and key not in table_keys:
                    fields[key] = row[1]
                    table_keys.add(key)
    for k, v in front.items():
        key = _META_KEYS.get(str(k).lower().replace("_", " "), None)
        if key and v not in (None, "", []):
            fields[key] = v if isinstance(v, str) else (", ".join(map(str, v)) if isinstance(v, list) else str(v))
    if isinstance(front.get("tags"), list):
        fields["tags"] = ", ".join(map(str, front["tags"]))

    # 2. title and number
    title = front.get("title") if isinstance(front.get("title"), str) else None
    heading_title = first_title(lines, hs)
    raw_title = (title or heading_title or "").strip()
    number = None
    fm = _FILE_NUM_RE.match(posixpath.basename(path))
    if fm:
        number = int(fm.group(1))
    clean = _TITLE_PREFIX_RE.sub("", raw_title)
    tm = _TITLE_NUM_RE.match(clean)
    if tm:
        if number is None:
            number = int(tm.group(1))
        clean = tm.group(2).strip()
    if clean:
        meta["title"] = clean
    if number is not None:
        meta["number"] = number

    # 3. status
    if fields.get("status"):
        raw = clean_inline(str(fields["status"]))
        meta["status_raw"] = raw
        meta["status"] = normalize_status(raw)
    # 4. dates, people, tags
    for key in ("date", "created", "updated"):
        if fields.get(key):
            d = normalize_date(fields[key])
            if d:
                meta[key] = d
    if revision_dates:
        meta["updated"] = max(revision_dates + ([meta["updated"]] if "updated" in meta else []))
    if fields.get("author"):
        authors = as_list(clean_inline(str(fields["author"])))
        if authors:
            meta["author"] = ", ".join(authors)
            meta["authors"] = authors
    if fields.get("deciders"):
        meta["deciders"] = as_list(clean_inline(str(fields["deciders"])))
    if fields.get("tags"):
        meta["tags"] = as_list(clean_inline(str(fields["tags"])))

    # 5. relations: explicit fields, the status section, then sentences anywhere in the body
    for key in ("supersedes", "superseded_by", "amends", "amended_by", "updates"):
        if fields.get(key):
            refs = res.refs_in(str(fields[key])) or _bare_numbers(str(fields[key]), res)
            if refs:
                meta[key] = _dedupe(meta.get(key, []) + refs)
    for k, rel in _relations_in(body, res).items():
        meta[k] = _dedupe(meta.get(k, []) + rel)
    refs = res.refs_in(body)
    for key in ("supersedes", "superseded_by", "amends", "amended_by", "updates"):
        refs += meta.get(key, [])
    if refs:
        meta["references"] = _dedupe(refs)
    if meta.get("superseded_by") and meta.get("status") not in ("Superseded", "Partially Superseded",
                                                                  "Deprecated"):
        meta.setdefault("status_note", "a superseded-by reference was found in the text")
    return meta


def _bare_numbers(value: str, res: RefResolver) -> list[str]:
    return [res.ident("adr", int(n)) for n in re.findall(r"(?<!\d)(\d{1,5})(?!\d)", value)]


def _relations_in(text: str, res: RefResolver) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    low = text.lower()
    if not any(w in low for w in ("supers", "superc", "replace", "amend", "favor", "favour")):
        return found
    for key, rx in _REL_PATTERNS:
        for m in rx.finditer(text):
            # "superseded by" also matches inside "supersedes"? no; but skip negations ("does not supersede")
            before = text[max(0, m.start() - 24):m.start()].lower()
            if re.search(r"\b(?:not|never|no longer)\s+(?:be\s+)?$", before):
                continue
            refs = res.refs_in(_first_sentence(m.group(1)))
            if refs:
                found[key] = _dedupe(found.get(key, []) + refs)
    return found


def _section_text(lines: list[str], hs: list[Heading], names: tuple[str, ...]) -> str | None:
    for i, h in enumerate(hs):
        if clean_inline(h.text).strip().lower().rstrip(":") in names:
            end = hs[i + 1].line - 1 if i + 1 < len(hs) else len(lines)
            return "\n".join(lines[h.line:end])
    return None


# --- PEP --------------------------------------------------------------------------------------------

_PEP_HEAD_RE = re.compile(r"^PEP:\s*(\d+)\s*$")


def _strip_emails(value: str) -> str:
    v = re.sub(r"\s*<[^>]*@[^>]*>", "", value)
    return re.sub(r"\b[\w.+-]+@[\w-]+\.[\w.-]+\b", "[email]", v).strip()


def is_pep(text: str) -> bool:
    return bool(_PEP_HEAD_RE.match(text[:40].split("\n", 1)[0].strip()))


def parse_pep(text: str, path: str) -> dict[str, Any]:
    """RFC 822 style header block of a PEP (PEP:, Title:, Author:, Status:, Type:, Created:, ...)."""
    parsed = rfc822_header(text.split("\n", 200)[:200])      # the index's one header parser (the reST chunker's)
    header = header_dict(parsed[0]) if parsed is not None else {}
    res = RefResolver(path)
    meta: dict[str, Any] = {"format": "pep"}
    number = int(header.get("pep", "0") or 0)
    meta["number"] = number
    title = header.get("title", "").strip()
    meta["title"] = f"PEP {number} – {title}" if title else f"PEP {number}"
    if header.get("status"):
        meta["status_raw"] = header["status"]
        meta["status"] = normalize_status(header["status"])
    for key in ("type", "topic", "python-version", "resolution", "discussions-to", "sponsor",
                "pep-delegate", "bdfl-delegate", "content-type"):
        if header.get(key):
            meta[key.replace("-", "_")] = _strip_emails(header[key])
    if header.get("created"):
        d = normalize_date(header["created"])
        if d:
            meta["created"] = d
            meta["date"] = d
    if header.get("post-history"):
        dates = [d for p in header["post-history"].split(",") if (d := normalize_date(p))]
        if dates:
            meta["updated"] = max(dates)
    if header.get("author"):
        names = [re.sub(r"\s*<[^>]*>|\s*\([^)]*@[^)]*\)", "", a).strip() for a in
                 re.split(r",(?![^<]*>)", header["author"])]
        names = [n for n in names if n]
        if names:
            meta["authors"] = names
            meta["author"] = ", ".join(names)
    if header.get("topic"):
        meta["tags"] = as_list(header["topic"])
    for src, key in (("replaces", "supersedes"), ("superseded-by", "superseded_by"), ("requires", "requires")):
        if header.get(src):
            nums = re.findall(r"\d+", header[src])
            if nums:
                meta[key] = _dedupe(res.ident("pep", int(n)) for n in nums)
    refs = res.refs_in(text)
    for key in ("supersedes", "superseded_by", "requires"):
        refs += meta.get(key, [])
    refs = [r for r in _dedupe(refs) if r != res.ident("pep", number)]
    if refs:
        meta["references"] = refs
    return meta
