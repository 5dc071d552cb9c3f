"""Agent transcripts rendered as text: one turn per "### <label>" line.

The rendering is "### user (2026-01-01T10:00:00Z)", "### assistant (...)", "### tool: Bash (...)" followed
by the turn's text. Assistant text often contains markdown "### " headings of its own, so when any line
names a known role (user, assistant, system, developer, tool, human, model, summary — the labels
kb_assets.sources.transcripts renders) only such lines open turns;
otherwise every "### " line does. Consecutive small turns are packed into one chunk (its heading is the
first turn's label); a long turn is split by paragraph, each piece headed by the turn's label.
"""
from __future__ import annotations

import re

from kb_assets.chunking.core import Lines, Section, heading_path

_ROLE_TURN = re.compile(r"^### (?:user|assistant|system|developer|tool|human|model|function|summary)\b[^\n]*",
                        re.M | re.I)
_ANY_TURN = re.compile(r"^### \S[^\n]*", re.M)


def transcript_sections(text: str, lines: Lines) -> list[Section]:
    marks = list(_ROLE_TURN.finditer(text)) or list(_ANY_TURN.finditer(text))
    sections: list[Section] = []
    start = 0
    label = ""
    head = None
    for m in marks:
        a = lines.line_of(m.start())
        _emit(sections, lines, label, head, start, a)
        label = heading_path([m.group()[4:].rstrip("\r")])
        head = lines.char_range(a, a + 1)
        start = a + 1
    _emit(sections, lines, label, head, start, lines.count)
    return sections


def _emit(sections, lines: Lines, label: str, head, a: int, b: int) -> None:
    blocks = lines.paragraphs(a, b)
    if blocks or head:
        sections.append(Section(label, blocks, head=head))
