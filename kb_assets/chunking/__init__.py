"""Chunking: one splitter per document shape, one budgeted engine under them.

    chunk_document(doc, max_tokens=254, overlap_tokens=32, count_tokens=make_token_counter())

Shapes (see `detect_shape`): markdown (headings → paragraphs), rst (title adornments, PEP headers),
text (paragraphs), code (Python `ast`, other languages tree-sitter, else line windows), transcript
(turns), work_item (rendered fields, heading-based like markdown), session (markdown paragraphs packed
under the nearest heading).

Guarantees: every chunk's text is a contiguous slice of `doc.text` lying within its 1-based
[start_line, end_line] (lines split on "\\n"); `count_tokens([chunk.embedding_text()])[0] ==
chunk.token_count <= max_tokens`, and a chunk has at most max_tokens * 12 characters whatever the count;
the same input gives the same chunks; an edit inside one section changes only that section's chunks (and a
tiny neighbour merged into it). Every non-blank character of the document is in some chunk's text, except
heading lines (markdown '#' / setext lines, reST titles and their adornments, transcript turn labels),
which are carried by Chunk.heading instead (a heading cut short keeps its line in the text).

`max_tokens` is the budget as `count_tokens` counts: with `make_token_counter` (no special tokens) pass the
model window minus its special tokens (256 - 2 for all-MiniLM-L6-v2). A counter with a true
`word_additive` attribute (make_token_counter's, for WordPiece) lets the chunker add up counts it already
has instead of re-counting each chunk; any other counter is called on every chunk's embedding text once.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from kb_assets.lazy_names import lazy_names
from kb_assets.models import BLOCKS_VERSION, Chunk, SourceDocument

__all__ = [
    "chunk_document", "document_blocks", "detect_shape", "estimate_tokens", "make_token_counter", "default_tokenizer_path",
    "CountTokens", "TokenCounter", "language_for", "MIN_MAX_TOKENS",
]

# The shapes' modules load on first use (PEP 562): a pass that only needs the tokenizer's path (the projections'
# token measure) or nothing of chunking at all (a delete) does not import every splitter (~9 ms).
_HOMES = {
    "code_sections": "code", "language_for": "code", "Engine": "core", "Lines": "core",
    "looks_like_markdown": "markdown", "markdown_sections": "markdown", "stored_blocks": "markdown",
    "text_sections": "markdown", "rst_sections": "rst", "rst_structure": "rst", "CountTokens": "tokens",
    "TokenCounter": "tokens", "default_tokenizer_path": "tokens", "estimate_tokens": "tokens",
    "make_token_counter": "tokens", "transcript_sections": "transcript",
}

if TYPE_CHECKING:
    from kb_assets.chunking.tokens import CountTokens


__getattr__, __dir__ = lazy_names(__name__, _HOMES)


# .ipynb: the reader renders a notebook as markdown (sources.notebooks)
MARKDOWN_EXTENSIONS = frozenset({".md", ".markdown", ".mdx", ".mdown", ".mkd", ".mkdn", ".ipynb"})
RST_EXTENSIONS = frozenset({".rst", ".rest"})
TEXT_EXTENSIONS = frozenset({".txt", ".text", ".log"})
MARKDOWN_KINDS = frozenset({"adr", "doc", "session", "readme", "agents_md", "memory"})
MIN_MAX_TOKENS = 16


def _extension(path: str) -> str:
    name = path.rsplit("/", 1)[-1].lower()
    dot = name.rfind(".")
    return name[dot:] if dot > 0 else ""


def detect_shape(doc: SourceDocument) -> str:
    """One of: markdown, rst, text, code, transcript, work_item, session."""
    from kb_assets.chunking.code import language_for
    from kb_assets.chunking.markdown import looks_like_markdown

    kind = doc.kind
    if kind == "transcript":
        return "transcript"
    if kind == "work_item":
        return "work_item"
    path = doc.path.split("#", 1)[0]
    ext = _extension(path)
    if ext in MARKDOWN_EXTENSIONS:
        return "session" if kind == "session" else "markdown"
    if ext in RST_EXTENSIONS:
        return "rst"
    if kind == "code":
        return "code"
    if ext not in TEXT_EXTENSIONS and language_for(path):
        return "code"
    if kind in MARKDOWN_KINDS and looks_like_markdown(doc.text):
        return "session" if kind == "session" else "markdown"
    return "text"


def document_blocks(doc: SourceDocument) -> dict | None:
    """What the documents stage stores as documents.blocks: the markdown block scan of a markdown-shaped
    document (chunking/markdown.stored_blocks), the header and section titles of a reST one
    (chunking/rst.rst_structure), None for any other shape (nothing to store)."""
    if not doc.text or doc.text.isspace():
        return None
    from kb_assets.chunking.markdown import stored_blocks
    from kb_assets.chunking.rst import rst_structure

    shape = detect_shape(doc)
    if shape in ("markdown", "work_item", "session"):
        return stored_blocks(doc.text)
    if shape == "rst":
        out: dict = {"v": BLOCKS_VERSION}
        try:
            out["rst"] = rst_structure(doc.text)
        except Exception:        # hostile input: readers of it then parse themselves, and fail alike
            pass
        return out
    return None


def chunk_document(doc: SourceDocument, *, max_tokens: int, overlap_tokens: int = 32,
                   count_tokens: CountTokens | None = None, blocks: dict | None = None) -> list[Chunk]:
    """Cut a document into chunks whose embedding text fits `max_tokens` (as `count_tokens` counts).

    count_tokens: batch counter (list of texts → list of counts); None: `estimate_tokens`.
    blocks: the document's stored parse (documents.blocks, `document_blocks`): a markdown or reST document is
    then not parsed again.
    """
    from kb_assets.chunking.code import code_sections
    from kb_assets.chunking.core import Engine, Lines
    from kb_assets.chunking.markdown import markdown_sections, text_sections
    from kb_assets.chunking.rst import rst_sections
    from kb_assets.chunking.tokens import estimate_tokens
    from kb_assets.chunking.transcript import transcript_sections

    if max_tokens < MIN_MAX_TOKENS:
        raise ValueError(f"max_tokens must be at least {MIN_MAX_TOKENS}, got {max_tokens}")
    if overlap_tokens < 0:
        raise ValueError(f"overlap_tokens must be 0 or more, got {overlap_tokens}")
    text = doc.text
    if not text or text.isspace():
        return []
    lines = Lines(text)
    shape = detect_shape(doc)
    pack = False
    if shape in ("markdown", "work_item", "session"):
        sections = markdown_sections(text, lines, markers=doc.kind == "agents_md", stored=blocks)
        if sections is None:
            sections = text_sections(text, lines)
        pack = shape == "session"
    elif shape == "rst":
        sections = rst_sections(text, lines, stored=blocks)
    elif shape == "transcript":
        sections = transcript_sections(text, lines)
        pack = True
    elif shape == "code":
        sections, _how = code_sections(text, doc.path, lines)
    else:
        sections = text_sections(text, lines)
    engine = Engine(text, max_tokens, overlap_tokens, count_tokens or estimate_tokens, lines)
    return engine.run(sections, pack_sections=pack)
