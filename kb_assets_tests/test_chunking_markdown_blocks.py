"""The markdown block scanner (`block_structure`) gives exactly what markdown-it-py's block parser gives, as the
chunker configures it: same headings (level, title, lines), fences, indented code and HTML blocks."""
from __future__ import annotations

import random
import re
import tarfile
from pathlib import Path

import pytest

from kb_assets.chunking import chunk_document
from kb_assets.chunking.markdown import block_structure, block_structure_markdown_it
from kb_assets.models import SourceDocument

FIXTURES = Path(__file__).parent / "fixtures" / "corpora"
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "corpora"

# Lines that sit on a rule's edge: fences (lengths, info strings, indents, unclosed), thematic breaks vs setext
# underlines, the seven HTML block kinds and their ends, ATX headings (levels, closing hashes, no space), tabs,
# lazy continuations, and what lists / block quotes would be (those rules are off).
FRAGMENTS = [
    "```", "~~~", "```py", "``` a`b", "~~~ a`b", "````", "``", "~~~~~", "```   ", "  ```", "   ~~~", "    ```",
    "    code", "\tcode", "  \tx", " \t  y", "\t\t", "---", "***", "- - -", "___", "_ _ _", "* * *", "--", "-", "=",
    "===", " ===  ", "== =", "--- x", "<div>", "</div>", "<!-- c", "-->", "<!-- x -->", "<?x", "?>",
    "<!DOCTYPE html>", "<![CDATA[", "]]>", "<script>", "</script>", "<pre>", "</pre>", "<a href='x'>", "</span>",
    "<span>", '<foo bar="1"/>', "<table>", "<!x", "<", "< div>", "<DIV class=x>", "# h", "#h", "####### h",
    "## h ##", "#", "# ", "### x ###  ", "#\tx", "# x #y", "  # indented", "    # code", "#  ", "## ##", "text",
    "more text here", "", "", "", "   ", "\t", "- item", "> quote", "1. x", "+ y", "a\x00b", "x\r", "Title",
    "Setext", "  Title  ", "[ref]: /url", "| a | b |", "|---|---|", "\u00a0nbsp", "\x0cff", "    ", "  -  -  -  ",
    "=a", "-a", "```\t", "~~~~ info ~~~", "  <!-- indented", "   <div>", "<textarea>", "</textarea>",
    "<style>x</style>", "<?php ?>", "\u2028sep", "#\u00a0x", "***bold***", "__x__", "- - - x", "_\t_\t_",
    "plain line", "Another plain 2", "x > y", "9 lives",
]
CHARS = "#`~-=*_<>!?/ \t\n\n\n\r\x00abcdivprescrtx[]\"'=:.\u00a0\u3000"


def _same(text: str) -> None:
    assert block_structure(text) == block_structure_markdown_it(text), repr(text)


def _documents() -> list[str]:
    texts = [f.read_text() for f in sorted(FIXTURES.glob("*.*"))]
    if SHARED.is_dir():
        for archive in sorted(SHARED.glob("adr-*.tar.gz")):
            with tarfile.open(archive) as tar:
                for member in tar:
                    if member.isfile() and member.name.endswith(".md"):
                        texts.append(tar.extractfile(member).read().decode("utf-8", "replace"))
    return texts


def test_same_blocks_as_markdown_it_on_real_documents():
    texts = _documents()
    for text in texts:
        _same(text)
        _same(text.replace("\n", "\r\n"))
    if not SHARED.is_dir():       # a checkout without ../shared: the fixtures only (conftest.shared_dir skips too)
        pytest.skip(f"shared corpora not found at {SHARED}: checked the {len(texts)} fixtures only")
    assert len(texts) > 5


@pytest.mark.parametrize("seed", range(4))
def test_same_blocks_as_markdown_it_on_random_line_soups(seed):
    rng = random.Random(seed)
    for _ in range(1500):
        lines = [rng.choice(FRAGMENTS) if rng.random() < 0.8 else rng.choice(FRAGMENTS) + rng.choice(FRAGMENTS)
                 for _ in range(rng.randint(0, 40))]
        text = rng.choice(["\n", "\n", "\r\n", "\r"]).join(lines)
        _same(text + rng.choice(["", "\n", "  ", "\n  ", "\t", "\n\n"]))


def test_same_blocks_as_markdown_it_on_random_characters():
    rng = random.Random(11)
    for _ in range(4000):
        text = "".join(rng.choice(CHARS) for _ in range(rng.randint(0, 80)))
        if rng.random() < 0.3:
            text = text.replace("d", "<div>").replace("p", "<pre>").replace("s", "<!--").replace("x", "-->")
        _same(text)


@pytest.mark.parametrize("text, blocks", [
    ("# A #\n\nx\n", [("heading", 0, 1, 1, "A", False)]),
    ("Title\n===\n", [("setext", 0, 2, 1, "", False)]),
    ("a\n---\n", [("setext", 0, 2, 2, "", False)]),          # an underline, not a rule
    ("a\n- - -\n", []),                                       # a rule ends the paragraph
    ("```\n# no\n", [("fence", 0, 2, 0, "", False)]),         # an unclosed fence runs to the end
    ("    # code\n\n    more\nx", [("code_block", 0, 3, 0, "", False)]),
    ("para\n    # lazy\n", []),                               # indented code cannot interrupt a paragraph
    ("<!-- a\n\nb -->\n# H", [("html_block", 0, 3, 0, "", True), ("heading", 3, 4, 1, "H", False)]),
    ("<div>\nx\n\n# H", [("html_block", 0, 2, 0, "", False), ("heading", 3, 4, 1, "H", False)]),
    ("a\n<span>\n# H", [("heading", 2, 3, 1, "H", False)]),  # an inline tag does not interrupt a paragraph
    ("#######\n#\tx\n", [("heading", 1, 2, 1, "x", False)]),
])
def test_known_cases(text, blocks):
    assert block_structure(text) == blocks == block_structure_markdown_it(text)


def test_chunks_are_those_of_the_markdown_it_blocks(monkeypatch):
    """Whole chunker, scanner vs parser: the same chunks on the fixture documents."""
    import kb_assets.chunking.markdown as md

    docs = [SourceDocument(path=f"d{i}.md", kind="doc", title="", text=t) for i, t in enumerate(_documents())]
    docs += [SourceDocument(path="AGENTS.md", kind="agents_md", title="",
                            text="# R\n\n<!-- BEGIN x -->\ntext\n<!-- END x -->\n\n## S\n\nmore\n")]
    fast = [chunk_document(d, max_tokens=96) for d in docs]
    monkeypatch.setattr(md, "block_structure", md.block_structure_markdown_it)
    assert [chunk_document(d, max_tokens=96) for d in docs] == fast
    assert sum(map(len, fast)) > 50 and any(re.search(r"\S", c.heading) for cs in fast for c in cs)
