"""Rendering the projection files: a pure function of the entries, the edges and the tag vocabulary.

Deterministic: entries sorted by id, edges by (from, kind, to), tags by name; no timestamps, no counts that
change when nothing else does — so an unchanged index renders the same bytes and the files diff cleanly.
One entry per line; fields separated by " | " ("|" inside a field becomes "/", whitespace is squashed).
"""
from __future__ import annotations

import posixpath
import re
from collections import defaultdict
from dataclasses import dataclass, field

from kb_assets.projections.load import Edge, Entry
from kb_assets.projections.vocabulary import TagVocabulary, tag_file_name

TITLE_CHARS = 80
USE_WHEN_CHARS = 180
PURPOSE_CHARS = 160
CODE_DEFS = 8
# The end mark first, the lookbehind after it: the regex engine scans for the mark instead of trying every position
# (the same matches as (?<=[a-z0-9)\]`'"])[.!?](?=\s+[A-Z(`"'])).
_SENTENCE_END = re.compile(r"[.!?](?<=[a-z0-9)\]`'\"].)(?=\s+[A-Z(`\"'])")


def squash(text: str) -> str:
    """Whitespace runs as one space, none at the ends: re's \\s+ and str.split() agree on what is whitespace, and
    the split is ~5x faster than a substitution (the tier files squash ~20,000 fields per 3,000 documents).
    Not query.records.squash, which keeps a lone no-break space (any single whitespace but " ", tab, CR, LF) as is."""
    return " ".join(text.split())

# Kinds that get no T0/T1 line: code has its own map (code/<source>.dsl).
MAP_ONLY_KINDS = ("code",)


def field_text(value: object, limit: int | None = None) -> str:
    s = squash(str(value or "")).replace("|", "/")
    if limit is not None and len(s) > limit:
        cut = s[: limit - 1]
        sp = cut.rfind(" ")
        if sp > limit * 0.6:
            cut = cut[:sp]
        s = cut.rstrip(" ,;:.-–—(") + "…"
    return s


def first_sentence(text: str) -> str:
    s = squash(text or "")
    m = _SENTENCE_END.search(s)
    return s[: m.start() + 1] if m else s


def use_when(e: Entry) -> str:
    """One line saying when to open the entry: its signpost summary's first sentence (the title's repetition
    dropped), else its first decision."""
    text = first_sentence(e.summary)
    title = squash(e.title)
    if title and text.lower().startswith(title.lower()):
        text = text[len(title):].lstrip(" —–-:.").strip()
    if (len(text) < 12 or text.endswith(":")) and e.first_decision:
        text = first_sentence(e.first_decision)     # "...goals that make X important:" introduces, says nothing
    return field_text(text, USE_WHEN_CHARS)


def status_text(e: Entry, *, raw: bool) -> str:
    s = field_text(e.status, 30)
    # the document's own word beside the normalised one, unless it only repeats it ("Deprecated (no ADR)")
    if raw and e.status_raw and e.status.strip().lower() not in e.status_raw.strip().lower():
        s = f"{s} ({field_text(e.status_raw, 40)})" if s else field_text(e.status_raw, 40)
    return s or "-"


def _split(path: str) -> tuple[str, str]:
    """(folder, name) of a document path; a work item's "file#id" stays whole in the name."""
    file, hash_, item = path.partition("#")
    d, name = posixpath.split(file)
    return d, name + hash_ + item


def path_field(e: Entry, name: str) -> str:
    """The file to open, relative to the entry's folder: "=" when it is the id's own name (the usual case)."""
    file = name.split("#", 1)[0]
    return "=" if file == name else file


def tag_index(entries: list[Entry], vocab: TagVocabulary) -> tuple[dict[str, list[Entry]], dict[str, set[int]]]:
    """(canonical tag -> entries, tag outside the vocabulary as written (lowercased) -> document ids)."""
    tagged: dict[str, list[Entry]] = defaultdict(list)
    outside: dict[str, set[int]] = defaultdict(set)
    for e in entries:
        seen = set()
        for t in e.tags:
            canon = vocab.map(t)
            if canon is None:
                if str(t).strip():
                    outside[str(t).strip().lower()].add(e.doc_id)
                continue
            if canon not in seen:
                seen.add(canon)
                tagged[canon].append(e)
    return tagged, outside


@dataclass
class Rendered:
    files: dict[str, str] = field(default_factory=dict)
    tags_outside: dict[str, int] = field(default_factory=dict)      # tag as written -> documents
    tag_counts: dict[str, int] = field(default_factory=dict)        # canonical tag -> documents
    t0_entries: int = 0
    t0_lines: list[str] = field(default_factory=list)   # entry and folder lines (the token measure)


def render_all(entries: list[Entry], edges: list[Edge], vocab: TagVocabulary,
               roots: dict[str, str]) -> Rendered:
    out = Rendered()
    entries = sorted(entries, key=lambda e: e.id)
    listed = [e for e in entries if e.kind not in MAP_ONLY_KINDS]
    successors: dict[str, list[str]] = defaultdict(list)
    for ed in sorted(edges, key=lambda ed: (ed.source, ed.kind, ed.target)):
        if ed.kind == "superseded_by" and ed.resolved and ed.target not in successors[ed.source]:
            successors[ed.source].append(ed.target)

    # ---- T0: grouped by folder ("## kb:<source>/<folder>/" headers) so a long folder path is written once
    lines = ["# kb T0 index: id | type | title | path | status",
             "# A \"## kb:<source>/<folder>/\" line starts a folder: the ids below it are relative to it (id = that",
             "# prefix + first field; cite it in full). path: the file, relative to the folder; \"=\" when it is the id.",
             "# Code files are in code/<source>.dsl. Next: T1 <type>.dsl once the type is known; T2 `kb show <id>`.",
             ]
    for src in sorted({e.source for e in listed}):
        lines.append(f"# source {src}: {roots.get(src, '?')}")
    folder = None
    for e in sorted(listed, key=lambda e: (e.source, *_split(e.path))):
        d, name = _split(e.path)
        if (e.source, d) != folder:
            folder = (e.source, d)
            header = f"## kb:{e.source}/{d}/" if d else f"## kb:{e.source}/"
            lines.append(header)
            out.t0_lines.append(header)
        line = (f"{name} | {e.kind} | {field_text(e.title, TITLE_CHARS)} | {path_field(e, name)} | "
                f"{status_text(e, raw=False)}")
        lines.append(line)
        out.t0_lines.append(line)
    out.t0_entries = len(listed)
    out.files["index.dsl"] = "\n".join(lines) + "\n"

    # ---- T1, one file per type
    by_kind: dict[str, list[Entry]] = defaultdict(list)
    for e in listed:
        by_kind[e.kind].append(e)
    for kind in sorted(by_kind):
        lines = [f"# kb T1 {kind}: id | title | status | use when",
                 "# status: normalised (as the document wrote it); \"→ kb:…\": superseded by that entry."]
        for e in by_kind[kind]:
            status = status_text(e, raw=True)
            if successors.get(e.id):
                status += " → " + ", ".join(successors[e.id])
            lines.append(f"{e.id} | {field_text(e.title, TITLE_CHARS)} | {status} | {use_when(e) or '-'}")
        out.files[f"{kind}.dsl"] = "\n".join(lines) + "\n"

    # ---- by-tag
    tagged, outside = tag_index(entries, vocab)
    files_for_tag: dict[str, list[str]] = defaultdict(list)
    for tag in sorted(tagged):
        files_for_tag[tag_file_name(tag)].append(tag)
    for name, tags in sorted(files_for_tag.items()):
        members = sorted({e.id: e for t in tags for e in tagged[t]}.values(), key=lambda e: e.id)
        lines = [f"# kb tag {', '.join(tags)}: id | type | title | status"]
        lines += [f"{e.id} | {e.kind} | {field_text(e.title, TITLE_CHARS)} | {status_text(e, raw=False)}"
                  for e in members]
        out.files[f"by-tag/{name}.dsl"] = "\n".join(lines) + "\n"
    out.tag_counts = {t: len(v) for t, v in sorted(tagged.items())}
    out.tags_outside = {t: len(v) for t, v in sorted(outside.items())}

    # ---- T3: the graph
    rows = sorted({(ed.source, ed.kind, ed.target if ed.resolved else "?" + field_text(ed.target))
                   for ed in edges})
    unresolved = sum(1 for r in rows if r[2].startswith("?"))
    lines = ["# kb T3 relations: from | kind | to",
             "# kinds: supersedes, superseded_by, amends, amended_by, references, touches (a code file);",
             f"# \"?\" marks a target not in the index ({unresolved} of {len(rows)} edges)."]
    lines += [f"{a} | {k} | {b}" for a, k, b in rows]
    out.files["relates.dsl"] = "\n".join(lines) + "\n"

    # ---- T3: the code map, one file per source
    code: dict[str, list[Entry]] = defaultdict(list)
    for e in entries:
        if e.kind == "code":
            code[e.source].append(e)
    for src in sorted(code):
        lines = [f"# kb code map {src}: path | purpose | defs | tables   (id: kb:{src}/<path>; root "
                 f"{roots.get(src, '?')})"]
        for e in code[src]:
            defs = ", ".join(field_text(f, 60) for f in e.functions[:CODE_DEFS])
            if len(e.functions) > CODE_DEFS:
                defs += f" (+{len(e.functions) - CODE_DEFS})"
            tables = ", ".join(field_text(t, 60) for t in e.tables[:6])
            lines.append(f"{e.path} | {field_text(e.purpose, PURPOSE_CHARS) or '-'} | {defs or '-'} | {tables or '-'}")
        # source keys are file-name safe (config.SOURCE_KEY_RE)
        out.files[f"code/{src}.dsl"] = "\n".join(lines) + "\n"
    return out
