"""docutils, the reference reST parser, as the section titles it finds: (depth, title) in document order.

Shared by test_chunking_rst_docutils.py (our stored reST parse held to it) and bench/rst_parse_bench.py (its cost).
Needs docutils (the `test` extra)."""
from __future__ import annotations

import io

from docutils import nodes
from docutils.frontend import get_default_settings
from docutils.parsers.rst import Parser
from docutils.utils import new_document

_PARSER = Parser()


def _settings():
    settings = get_default_settings(Parser)
    settings.report_level = settings.halt_level = 5     # never print or raise on a malformed document
    settings.warning_stream = io.StringIO()
    settings.file_insertion_enabled = settings.raw_enabled = False
    return settings


def docutils_titles(text: str) -> list[tuple[int, str]]:
    doc = new_document("<rst>", _settings())
    _PARSER.parse(text, doc)
    out: list[tuple[int, str]] = []

    def walk(node, depth):
        for child in node.children:
            if isinstance(child, nodes.section):
                title = child.next_node(nodes.title)
                out.append((depth, title.rawsource.strip() if title is not None else ""))
                walk(child, depth + 1)
            elif isinstance(child, nodes.Element) and not isinstance(child, (nodes.literal_block, nodes.comment)):
                walk(child, depth)

    walk(doc, 1)
    return out
